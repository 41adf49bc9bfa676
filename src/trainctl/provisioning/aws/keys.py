"""trainctl's own SSH key: made once on this machine, its public half imported per job.

The private key never leaves this machine: EC2 gets the public key (ImportKeyPair) and
puts it in the node's authorized_keys; the controller's SSH connections use the private one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from trainctl.errors import TrainctlError

KEY_COMMENT = "trainctl"


class SshKeyError(TrainctlError):
    """The local SSH key cannot be made or read."""


def default_key_path() -> Path:
    from trainctl.spec.settings import get_settings

    return get_settings().home / "ssh" / "id_ed25519"


def ensure_key(path: Path | None = None) -> str:
    """The OpenSSH public key line of the key at `path`, creating the key pair if missing.

    The private key is written 0600 in a 0700 directory, atomically (a concurrent creator
    wins and its key is used), so a half-written key is never read.
    """
    path = path or default_key_path()
    if not path.exists():
        _create(path)
    return public_key_line(path)


def public_key_line(path: Path) -> str:
    """Derived from the private key each time: a stale or edited .pub is never what counts."""
    line = _derive_public(path)
    pub = path.with_name(path.name + ".pub")
    if not pub.exists():
        _write_new_file(pub, (line + "\n").encode(), mode=0o644)
    return line


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    _write_new_file(path, _generate(), mode=0o600)


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temp file with `mode`, then link it into place if `path` is free."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def _generate() -> bytes:
    """The OpenSSH private key (bytes) of a new ed25519 key."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:  # no cryptography (it comes with paramiko): OpenSSH's own tool
        return _generate_with_ssh_keygen()
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )


def _generate_with_ssh_keygen() -> bytes:
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise SshKeyError(
            "cannot make trainctl's SSH key: install the 'cryptography' package (pip install "
            "paramiko brings it) or OpenSSH's ssh-keygen"
        )
    with tempfile.TemporaryDirectory(prefix="trainctl-key-") as tmp:
        out = Path(tmp) / "id_ed25519"
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", str(out)],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        return out.read_bytes()


def _derive_public(path: Path) -> str:
    data = path.read_bytes()
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        keygen = shutil.which("ssh-keygen")
        if keygen is None:
            raise SshKeyError(f"cannot read {path}: needs 'cryptography' or ssh-keygen") from None
        result = subprocess.run(
            [keygen, "-y", "-f", str(path)], check=True, capture_output=True, text=True
        )
        key_type, material = result.stdout.split()[:2]
        return f"{key_type} {material} {KEY_COMMENT}"
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except ValueError as exc:
        raise SshKeyError(f"{path} is not an unencrypted OpenSSH private key: {exc}") from None
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{public.decode()} {KEY_COMMENT}"
