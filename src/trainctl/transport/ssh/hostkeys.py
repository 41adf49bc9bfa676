"""Host keys: pinned on first use in `$TRAINCTL_HOME/known_hosts` (or given in a host's
`host_key`), a changed key refused with both fingerprints named, never silently accepted."""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.transport.ssh.errors import SshHostKeyError

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("trainctl.ssh")


def known_hosts_path() -> Path:
    from trainctl.spec.settings import get_settings

    return get_settings().home / "known_hosts"


def known_hosts_name(address: str, port: int) -> str:
    """The host's name in a known_hosts file (OpenSSH's form)."""
    return address if port == 22 else f"[{address}]:{port}"


_known_hosts_lock = threading.Lock()


def read_known_keys(path: Path, name: str) -> dict[str, str]:
    """{key type: base64} pinned for `name` in `path`, read by paramiko's HostKeys (plain
    and hashed entries, comma-separated names; lines it cannot read are skipped)."""
    import paramiko

    try:
        found = paramiko.HostKeys(str(path)).lookup(name)
    except FileNotFoundError:
        return {}
    return {key_type: key.get_base64() for key_type, key in (found or {}).items()}


def fingerprint(key_type: str, key_b64: str) -> str:
    """OpenSSH's form of a key's fingerprint ('ssh-ed25519 SHA256:...'), as paramiko
    computes it."""
    import paramiko

    try:
        key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
    except (paramiko.SSHException, ValueError):  # a type paramiko cannot load
        return f"{key_type} (a key paramiko cannot read)"
    return f"{key_type} {key.fingerprint}"


class PinOnFirstUse:
    """paramiko host key policy: pin an unknown host's key in our known_hosts file.

    Under a file lock, re-reading the file: another process may have pinned a key for the
    host meanwhile, and a different one is refused as any changed key is.
    """

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        key_type, key_b64 = key.get_name(), key.get_base64()
        with _known_hosts_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                pinned = read_known_keys(self.path, hostname)
                if pinned:
                    if pinned.get(key_type) == key_b64:
                        return
                    raise SshHostKeyError(
                        key_changed_message(self.label, pinned, key_type, key_b64, self.path)
                    )
                handle.write(f"{hostname} {key_type} {key_b64}\n")
        log.info(
            "%s: pinned host key %s in %s", self.label, fingerprint(key_type, key_b64), self.path
        )


def key_changed_message(
    label: str, pinned: dict[str, str], key_type: str, key_b64: str, source: Path | str
) -> str:
    """Fingerprints only (host keys are public; they are what a user compares)."""
    expected = ", ".join(fingerprint(t, b) for t, b in pinned.items())
    offered = fingerprint(key_type, key_b64)
    if isinstance(source, Path):
        return (
            f"{label}: host key changed: the host offers {offered}, but {expected} is pinned "
            f"in {source}; refusing to connect. If the host was reinstalled, remove its line "
            f"from {source}"
        )
    return (
        f"{label}: host key mismatch: the host offers {offered}, but its host_key setting "
        f"pins {expected}; refusing to connect"
    )


def pinned_from_config(label: str, host_key: str) -> dict[str, str]:
    """{key type: base64} of a host's `host_key` setting ('ssh-ed25519 AAAA...')."""
    fields = host_key.split()
    if len(fields) < 2:
        raise SshHostKeyError(
            f"{label}: host_key must look like 'ssh-ed25519 AAAA...' (type and base64)"
        )
    try:
        base64.b64decode(fields[1], validate=True)
    except ValueError:
        raise SshHostKeyError(f"{label}: host_key's key part is not base64") from None
    return {fields[0]: fields[1]}
