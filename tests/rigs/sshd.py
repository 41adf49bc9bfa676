"""Real OpenSSH servers on loopback addresses (127.0.0.2, 127.0.0.3, ...) standing in for hosts.

Each server gets its own host key, client key, authorized_keys file and - through sshd's
`SetEnv HOME=...` - its own home directory in the test's tmp dir, so two "hosts" on this one
machine keep separate `~/.trainctl` trees (agent cache, node dirs) as two machines would, and
nothing is written to the real home. Every process started through a server inherits that
HOME, which is how teardown finds what a test left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.procs import _is_zombie, _pids, job_processes  # noqa: F401  (for tests)
from trainctl.provisioning.ports import free_port
from trainctl.spec.capacity import SshHost

SSHD = "/usr/sbin/sshd"  # sshd refuses to start unless run by its absolute path
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")


def sshd_missing_reason() -> str | None:
    """Why real sshd servers cannot run here, or None when they can."""
    if not Path(SSHD).is_file():
        return f"{SSHD} not found (apt-get install openssh-server)"
    if not Path(SSH_KEYGEN).is_file():
        return "ssh-keygen not found (apt-get install openssh-client)"
    return None


def require_sshd() -> None:
    """Skip locally when sshd is missing; under CI a missing sshd is a failure."""
    from tests.helpers import require_part

    require_part("sshd", sshd_missing_reason())


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at `path` (+ .pub); returns the public key line."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return path.with_suffix(".pub").read_text().strip()


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[-1].split()[1])


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key] = value
    return out


def processes_with_env(name: str, value: str) -> list[int]:
    """Live processes whose (initial) environment has name=value."""
    key, val = name.encode(), value.encode()
    return [p for p in _pids() if _environ(p).get(key) == val and not _is_zombie(p)]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class SshdServer:
    """One sshd process listening on address:port, with its keys and home under `root`."""

    address: str
    root: Path
    client_key: Path
    client_public_key: str
    port: int = 0
    host_public_key: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.log = self.root / "sshd.log"

    @property
    def home(self) -> Path:
        """The HOME of every session on this server (its processes' `~`)."""
        return self.root / "home"

    @property
    def host_key_file(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    def host(self, **overrides: object) -> SshHost:
        """The SshHost that reaches this server (key file, port, the venv's python)."""
        fields: dict[str, object] = {
            "address": self.address,
            "port": self.port,
            "key_file": str(self.client_key),
            "python": sys.executable,
        }
        fields.update(overrides)
        return SshHost(**fields)  # type: ignore[arg-type]

    def new_host_key(self) -> None:
        """Replace the host key (a reinstalled machine, or a man in the middle)."""
        self.host_key_file.unlink(missing_ok=True)
        self.host_key_file.with_suffix(".pub").unlink(missing_ok=True)
        self.host_public_key = keygen(self.host_key_file, f"host-{self.address}")

    def write_config(self) -> Path:
        authorized = self.root / "authorized_keys"
        authorized.write_text(self.client_public_key + "\n")
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address}:{self.port}",
                    f"HostKey {self.host_key_file}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "StrictModes no",
                    "UsePAM no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "UseDNS no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    f"SetEnv HOME={self.home}",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        return config

    def start(self, timeout: float = 15.0) -> None:
        """Start sshd (a fresh free port unless one is set) and wait until it accepts."""
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not self.host_key_file.exists():
            self.new_host_key()
        for _ in range(5):  # the free port may be taken between probing and binding
            if not self.port:
                self.port = free_port(self.address)
            config = self.write_config()
            log = self.log.open("ab")
            try:
                self.proc = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            finally:
                log.close()
            if self._wait_ready(timeout):
                return
            self.stop()
            self.port = 0
        raise RuntimeError(f"sshd on {self.address} did not start: {self.log.read_text()[-2000:]}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as sock:
                    sock.settimeout(2)
                    if sock.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def session_pids(self) -> list[int]:
        """sshd's per-connection processes (not what sessions started: those detach)."""
        if self.proc is None:
            return []
        kids: dict[int, list[int]] = {}
        for pid in _pids():
            parent = _ppid(pid)
            if parent is not None:
                kids.setdefault(parent, []).append(pid)
        out, todo = [], [self.proc.pid]
        while todo:
            for child in kids.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    def drop_connections(self) -> list[int]:
        """Kill the server side of every open connection; the listener keeps listening."""
        pids = [p for p in self.session_pids() if not _is_zombie(p)]
        kill_all(pids)
        return pids

    def stop(self) -> None:
        """Stop the listener and every connection (the host becomes unreachable)."""
        if self.proc is None:
            return
        sessions = self.session_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        kill_all(sessions)
        self.proc = None

    def leftovers(self) -> list[int]:
        """Processes started through this server that are still running."""
        return processes_with_env("HOME", str(self.home))


class SshdFarm:
    """The servers of one test; `stop_all` ends them and whatever they started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_key = root / "client_ed25519"
        root.mkdir(parents=True, exist_ok=True)
        self.client_public_key = keygen(self.client_key, "trainctl-test-client")
        self.servers: list[SshdServer] = []

    def start(self, address: str) -> SshdServer:
        if not address.startswith("127."):
            raise ValueError(f"test servers listen on loopback only, not {address}")
        server = SshdServer(
            address=address,
            root=self.root / f"host-{address}",
            client_key=self.client_key,
            client_public_key=self.client_public_key,
        )
        server.start()
        self.servers.append(server)
        return server

    def leftovers(self) -> list[int]:
        return sorted({p for s in self.servers for p in s.leftovers()})

    def stop_all(self, settle: float = 10.0) -> list[int]:
        """Stop every server; kill what their sessions left running. Returns those pids."""
        for server in self.servers:
            server.stop()
        deadline = time.monotonic() + settle
        left = self.leftovers()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.leftovers()
        kill_all(left)
        return left
