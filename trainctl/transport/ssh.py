"""SSH transport: connect to a host with pinned host keys, run commands, and run a node's
agent as a remote process that outlives the SSH connection.

- `SshConnector(host).connect(timeout)` retries until the host accepts (a booting instance
  refuses connections for a while) and checks its host key: the one given in the host's
  config, else the one pinned in `$TRAINCTL_HOME/known_hosts` on first use. A changed key is
  refused, never silently accepted.
- `SshProcess` starts a command detached from the session (its own session and process
  group, output to a log file in a remote run dir, exit code written to a file when it
  ends), so a dropped connection does not end the node. `lines()` follows the remote log by
  byte offset and resumes after a reconnect without losing or repeating a line. A host that
  stays unreachable past a timeout, or a process that is gone without an exit code, ends the
  process with EXIT_INFRA: the node is lost, not the user's code failed.

The environment given to a process travels as JSON on the SSH channel's stdin, so its
values never appear in a command line (remote `ps`), a log or an error. Remote commands are
built with shlex. paramiko is imported lazily: `trainctl --help` never loads it.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import getpass
import hashlib
import json
import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trainctl.errors import TrainctlError
from trainctl.protocol import EXIT_INFRA
from trainctl.transport import RunningProcess

if TYPE_CHECKING:
    import paramiko

    from trainctl.spec.capacity import SshHost

log = logging.getLogger("trainctl.ssh")

T = TypeVar("T")

DEFAULT_ATTEMPT_TIMEOUT = 10.0  # one TCP connect + SSH handshake + authentication
IO_TIMEOUT = 20.0  # a remote read or command that hangs this long means the link is down
READ_CHUNK = 256 * 1024
MAX_LINE = 1024 * 1024  # a "line" longer than this is passed on in pieces
LIVENESS_SECONDS = 1.0  # how often a quiet process's remote pid is checked


class SshError(TrainctlError):
    """An SSH host could not be used; the message names the host (never a key or a secret)."""


class SshUnreachable(SshError):
    """The host did not accept an SSH connection within the time allowed."""


class SshHostKeyError(SshError):
    """The host's key is not the pinned one: refused (a reinstall, or a man in the middle)."""


class SshAuthError(SshError):
    """The host refused the key, or the key file cannot be used."""


class RemoteCommandError(SshError):
    """A command on the host failed."""


def default_user() -> str:
    return getpass.getuser()


def host_label(host: SshHost) -> str:
    """user@address:port, as errors and logs name a host."""
    return f"{host.user or default_user()}@{host.address}:{host.port}"


def known_hosts_path() -> Path:
    from trainctl.settings import get_settings

    return get_settings().home / "known_hosts"


def known_hosts_name(address: str, port: int) -> str:
    """The host's name in a known_hosts file (OpenSSH's form)."""
    return address if port == 22 else f"[{address}]:{port}"


def _quiet_paramiko() -> None:
    # paramiko logs every refused or dropped connection at ERROR; without a handler Python
    # prints those to stderr. Retries and reconnects are expected here: our errors say it.
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def _describe(exc: BaseException) -> str:
    """A short reason: 'Connection refused', 'timed out', 'Name or service not known'..."""
    per_address = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError
    if isinstance(per_address, dict) and per_address:
        exc = next(iter(per_address.values()))
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, TimeoutError) or text == "timed out":
        return "timed out"
    return text.splitlines()[0][:300]


_known_hosts_lock = threading.Lock()


def _read_known_keys(path: Path, name: str) -> dict[str, str]:
    """{key type: base64} pinned for `name` in `path` (plain entries written by trainctl)."""
    keys: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return keys
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#") and name in fields[0].split(","):
            keys.setdefault(fields[1], fields[2])
    return keys


def _fingerprint(key_type: str, key_b64: str) -> str:
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return f"{key_type} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


class _PinOnFirstUse:
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
                pinned = _read_known_keys(self.path, hostname)
                if pinned:
                    if pinned.get(key_type) == key_b64:
                        return
                    raise SshHostKeyError(
                        _key_changed_message(self.label, pinned, key_type, key_b64, self.path)
                    )
                handle.write(f"{hostname} {key_type} {key_b64}\n")
        log.info(
            "%s: pinned host key %s in %s", self.label, _fingerprint(key_type, key_b64), self.path
        )


def _key_changed_message(
    label: str, pinned: dict[str, str], key_type: str, key_b64: str, source: Path | str
) -> str:
    """Fingerprints only (host keys are public; they are what a user compares)."""
    expected = ", ".join(_fingerprint(t, b) for t, b in pinned.items())
    offered = _fingerprint(key_type, key_b64)
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


@dataclass(frozen=True)
class RemoteResult:
    code: int
    stdout: str
    stderr: str

    def tail(self, lines: int = 5) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:])[:600]


class SshConnection:
    """One authenticated SSH connection to a host: run commands, read and write files."""

    def __init__(self, host: SshHost, client: paramiko.SSHClient) -> None:
        self.host = host
        self.label = host_label(host)
        self.client = client
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None

    @property
    def active(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def run(
        self,
        argv: list[str] | str,
        *,
        input: bytes | None = None,
        timeout: float = 120.0,
    ) -> RemoteResult:
        """Run a command (argv is quoted with shlex) and collect its output and exit code.

        Raises OSError/EOFError/paramiko.SSHException when the connection fails.
        """
        command = argv if isinstance(argv, str) else shlex.join(argv)
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError("connection closed")
        channel = transport.open_session(timeout=IO_TIMEOUT)
        try:
            channel.settimeout(IO_TIMEOUT)
            channel.exec_command(command)
            if input:
                channel.sendall(input)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            exited_at: float | None = None
            while True:
                busy = False
                if channel.recv_ready():
                    out += channel.recv(READ_CHUNK)
                    busy = True
                if channel.recv_stderr_ready():
                    err += channel.recv_stderr(READ_CHUNK)
                    busy = True
                if busy:
                    continue
                if channel.closed or (channel.exit_status_ready() and channel.eof_received):
                    break
                now = time.monotonic()
                if channel.exit_status_ready():
                    # Exited, but something it started still holds the output open: what
                    # the command itself wrote has arrived by now.
                    exited_at = exited_at or now
                    if now - exited_at > 1.0:
                        break
                    time.sleep(0.01)
                    continue
                if now > deadline:
                    raise TimeoutError(f"command on {self.label} still running after {timeout} s")
                channel.status_event.wait(0.02)
            code = channel.recv_exit_status() if channel.exit_status_ready() else -1
        finally:
            channel.close()
        return RemoteResult(
            code, out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
        )

    def python(
        self,
        script: str,
        *args: str,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> RemoteResult:
        """Run a Python snippet with the host's interpreter (`env` must hold no secret)."""
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        return self.run(
            [*prefix, self.host.python, "-c", script, *args], input=input, timeout=timeout
        )

    def check_python(self, script: str, *args: str, what: str, marker: str, **kwargs: Any) -> str:
        """Run a snippet that prints `marker` + payload; the payload, or RemoteCommandError."""
        result = self.python(script, *args, **kwargs)
        for line in result.stdout.splitlines():
            if line.startswith(marker + " "):
                if result.code == 0:
                    return line[len(marker) + 1 :]
        if result.code == 127 or ("not found" in result.stderr and result.code != 0):
            raise RemoteCommandError(
                f"{self.label}: cannot run python {self.host.python!r} to {what}: "
                f"{result.tail()}; set the host's python to an interpreter that exists there"
            )
        raise RemoteCommandError(
            f"{self.label}: {what} failed (exit code {result.code}): {result.tail()}"
        )

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
            self._sftp.get_channel().settimeout(IO_TIMEOUT)  # type: ignore[union-attr]
        return self._sftp

    @property
    def home(self) -> str:
        """The remote user's home directory ($HOME, as the host's python expands `~`)."""
        if self._home is None:
            self._home = self.check_python(
                "import os; print('trainctl-home ' + os.path.expanduser('~'))",
                what="find the home directory",
                marker="trainctl-home",
                timeout=60,
            )
        return self._home

    def makedirs(self, path: str) -> None:
        sftp = self.sftp()
        parts = [p for p in path.split("/") if p]
        current = "" if path.startswith("/") else "."
        for part in parts:
            current = f"{current}/{part}"
            try:
                sftp.stat(current)
            except FileNotFoundError:
                with contextlib.suppress(OSError):  # made meanwhile by another process
                    sftp.mkdir(current)

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        sftp = self.sftp()
        with sftp.open(path, "wb") as handle:
            handle.set_pipelined(True)
            handle.write(data)
        sftp.chmod(path, mode)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        with contextlib.suppress(Exception):
            self.client.close()


def _connection_errors() -> tuple[type[BaseException], ...]:
    import paramiko

    return (OSError, EOFError, paramiko.SSHException)


def _is_remote_file_error(exc: BaseException) -> bool:
    """An SFTP status (no such file, permission denied), not a broken connection."""
    return isinstance(exc, (FileNotFoundError, PermissionError)) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM)
    )


class SshConnector:
    """How to reach one host: makes (and re-makes) authenticated, host-key-checked connections."""

    def __init__(
        self,
        host: SshHost,
        *,
        known_hosts: Path | None = None,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
    ) -> None:
        self.host = host
        self.label = host_label(host)
        self.user = host.user or default_user()
        self.known_hosts = known_hosts or known_hosts_path()
        self.attempt_timeout = attempt_timeout

    def key_file(self) -> str | None:
        if self.host.key_file is None:
            return None
        path = Path(self.host.key_file).expanduser()
        if not path.is_file():
            raise SshAuthError(f"{self.label}: key_file {self.host.key_file} not found")
        if not os.access(path, os.R_OK):
            raise SshAuthError(f"{self.label}: key_file {self.host.key_file} is not readable")
        return str(path)

    def connect(self, timeout: float = 0.0, *, retry_auth: bool = False) -> SshConnection:
        """Connect, retrying refused or failed attempts for up to `timeout` seconds.

        A host key mismatch is never retried. An authentication failure is retried only with
        `retry_auth` (a booting cloud instance installs its key after sshd starts).
        """
        import paramiko

        _quiet_paramiko()
        key_file = self.key_file()
        deadline = time.monotonic() + timeout
        delay = 0.2
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._connect_once(key_file, deadline)
            except (SshHostKeyError, SshAuthError) as exc:
                if not (retry_auth and isinstance(exc, SshAuthError)):
                    raise
                last: BaseException = exc
            except paramiko.AuthenticationException as exc:
                message = self._auth_message(exc)
                if not retry_auth:
                    raise SshAuthError(message) from None
                last = SshAuthError(message)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                last = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waited = f" (tried {attempts} times in {timeout:g} s)" if timeout > 0 else ""
                if isinstance(last, SshAuthError):
                    raise SshAuthError(f"{last}{waited}") from None
                raise SshUnreachable(
                    f"{self.label}: cannot connect: {_describe(last)}{waited}"
                ) from None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 2.0)

    def _auth_message(self, exc: BaseException) -> str:
        import paramiko

        if isinstance(exc, paramiko.PasswordRequiredException):
            return (
                f"{self.label}: key_file {self.host.key_file} is encrypted; use a key without "
                "a passphrase or load it into ssh-agent"
            )
        how = f"key_file {self.host.key_file}" if self.host.key_file else "your default keys"
        return f"{self.label}: authentication as {self.user!r} with {how} failed"

    def _connect_once(self, key_file: str | None, deadline: float) -> SshConnection:
        import paramiko

        host = self.host
        name = known_hosts_name(host.address, host.port)
        client = paramiko.SSHClient()
        keys = client.get_host_keys()
        if host.host_key:
            pinned = self._pinned_from_config()
            source: Path | str = "hosts[].host_key"
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            pinned = _read_known_keys(self.known_hosts, name)
            source = self.known_hosts
            client.set_missing_host_key_policy(_PinOnFirstUse(self.known_hosts, self.label))
        for key_type, key_b64 in pinned.items():
            keys.add(
                name, key_type, paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
            )
        wait = max(1.0, min(self.attempt_timeout, deadline - time.monotonic()))
        try:
            client.connect(
                hostname=host.address,
                port=host.port,
                username=self.user,
                key_filename=key_file,
                look_for_keys=key_file is None,
                allow_agent=key_file is None,
                timeout=wait,
                banner_timeout=wait,
                auth_timeout=wait,
                channel_timeout=IO_TIMEOUT,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise SshHostKeyError(
                _key_changed_message(
                    self.label, pinned, exc.key.get_name(), exc.key.get_base64(), source
                )
            ) from None
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        return SshConnection(host, client)

    def _pinned_from_config(self) -> dict[str, str]:
        fields = (self.host.host_key or "").split()
        if len(fields) < 2:
            raise SshHostKeyError(
                f"{self.label}: host_key must look like 'ssh-ed25519 AAAA...' (type and base64)"
            )
        try:
            base64.b64decode(fields[1], validate=True)
        except ValueError:
            raise SshHostKeyError(f"{self.label}: host_key's key part is not base64") from None
        return {fields[0]: fields[1]}


# --- remote processes -------------------------------------------------------------------

# Runs on the host with its python, reading {"argv", "env", "cwd", "run_dir", "waiter"} as
# JSON from stdin. Forks a child that becomes a session leader (its own process group, no
# terminal), points stdin at /dev/null and stdout/stderr at run_dir/log, and execs the
# waiter with the environment, so the job's tags are in the waiter's /proc environ too.
# Prints "trainctl-launch started PGID PID STARTTIME" or "trainctl-launch error ...".
LAUNCHER = r"""
import json, os, sys
spec = json.loads(sys.stdin.read())
run = spec["run_dir"]
os.makedirs(run, exist_ok=True)
for name in ("exit", "pid", "log"):
    try:
        os.unlink(os.path.join(run, name))
    except OSError:
        pass
env = dict(os.environ)
env.update(spec["env"])
r, w = os.pipe()
if os.fork() == 0:
    try:
        os.close(r)
        os.setsid()
        out = os.open(os.path.join(run, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.set_inheritable(w, True)
        os.execve(sys.executable, [sys.executable, "-c", spec["waiter"], run, spec["cwd"],
                                   str(w), "--"] + spec["argv"], env)
    except BaseException as exc:
        os.write(w, ("error cannot start the waiter: %s" % (exc,)).encode())
    finally:
        os._exit(127)
os.close(w)
chunks = []
while True:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    chunks.append(chunk)
message = b"".join(chunks).decode("utf-8", "replace").strip() or "error the waiter ended"
print("trainctl-launch " + message)
sys.exit(0 if message.startswith("started ") else 1)
"""

# The process group leader: starts the command, records pid files, waits, and writes the
# exit code (128+N for signal N, as a shell reports it) atomically when the command ends.
# SIGTERM/SIGINT/SIGHUP to the group reach the command; the waiter keeps waiting (a handler,
# not SIG_IGN, so the command starts with default dispositions).
WAITER = r"""
import json, os, signal, subprocess, sys
run, cwd, w = sys.argv[1], sys.argv[2], int(sys.argv[3])
argv = sys.argv[5:]
def keep_waiting(signum, frame):
    pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, keep_waiting)
def put(name, text):
    tmp = os.path.join(run, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(run, name))
with open("/proc/self/stat") as f:
    starttime = f.read().rsplit(")", 1)[1].split()[19]
try:
    child = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, close_fds=True)
except OSError as exc:
    message = "cannot start %s: %s" % (argv[0], exc.strerror or exc)
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    put("exit", "127\n")
    os.write(w, ("error " + message).encode())
    sys.exit(0)
put("pid", json.dumps({"pgid": os.getpid(), "pid": child.pid, "starttime": starttime}))
os.write(w, ("started %d %d %s" % (os.getpid(), child.pid, starttime)).encode())
os.close(w)
code = child.wait()
put("exit", "%d\n" % (128 - code if code < 0 else code))
"""

# Signal a process group started by LAUNCHER (argv: PGID STARTTIME SIGNAL group|tree).
# If the group's leader is alive but started at another time, the id was reused: nothing is
# sent. `tree` also reaches descendants that left the group (torchrun's workers start
# sessions of their own) and repeats until none is left.
SIGNAL_GROUP = r"""
import os, signal, sys, time
pgid, starttime, sig, tree = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "tree"
def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
lead = stat(pgid)
if lead is not None and lead[19] != starttime:
    print("trainctl-signal 0")
    sys.exit(0)
def members():
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields and fields[0] not in ("Z", "X"):
                table[int(entry)] = fields
    found = set(p for p, f in table.items() if int(f[2]) == pgid)
    if tree:
        kids = {}
        for p, f in table.items():
            kids.setdefault(int(f[1]), []).append(p)
        todo = list(found)
        while todo:
            for child in kids.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    found.discard(os.getpid())
    return found
signalled = 0
for _ in range(30 if tree else 1):
    found = members()
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, sig)
            signalled += 1
        except OSError:
            pass
    time.sleep(0.1)
print("trainctl-signal %d" % signalled)
"""


class _Unreachable(Exception):
    """The host cannot be reached right now (the caller decides whether it is lost)."""


class SshProcess(RunningProcess):
    """A command running on an SSH host, detached from the connection that started it.

    Remote files in `run_dir`: `log` (stdout+stderr), `pid` (pgid, pid, start time), `exit`
    (the exit code, written when the command ends).
    """

    def __init__(
        self,
        connector: SshConnector,
        argv: list[str],
        env: dict[str, str],
        *,
        cwd: str,
        run_dir: str,
        unreachable_timeout: float | None = None,
        connect_timeout: float = 30.0,
        poll_interval: float = 0.2,
    ) -> None:
        if unreachable_timeout is None:
            from trainctl.settings import get_settings

            unreachable_timeout = get_settings().heartbeat_timeout_seconds
        self.connector = connector
        self.label = connector.label
        self.argv = list(argv)
        self.run_dir = run_dir.rstrip("/")
        self.unreachable_timeout = unreachable_timeout
        self.poll_interval = poll_interval
        self._lock = threading.RLock()
        self._conn: SshConnection | None = connector.connect(timeout=connect_timeout)
        self._log_handle: Any = None
        self._returncode: int | None = None
        self._end_reason: str | None = None
        self._killed = False
        self._lost_since: float | None = None
        self._last_error = ""
        self._next_connect = 0.0
        self._backoff = 0.2
        self._next_liveness = 0.0
        self._next_poll = 0.0
        self.offset = 0  # bytes of the remote log passed on as whole lines so far
        self.reconnects = 0
        try:
            self.pgid, self.pid, self.starttime = self._launch(self._conn, env, cwd)
        except BaseException:
            self.close()
            raise

    # -- start ---------------------------------------------------------------------------
    def _launch(self, conn: SshConnection, env: dict[str, str], cwd: str) -> tuple[int, int, str]:
        request = {
            "argv": self.argv,
            "env": env,
            "cwd": cwd,
            "run_dir": self.run_dir,
            "waiter": WAITER,
        }
        result = conn.python(LAUNCHER, input=json.dumps(request).encode(), timeout=60)
        for line in result.stdout.splitlines():
            if line.startswith("trainctl-launch started "):
                pgid, pid, starttime = line.split()[2:5]
                log.debug("%s: started %s as process group %s", self.label, self.argv[0], pgid)
                return int(pgid), int(pid), starttime
            if line.startswith("trainctl-launch error "):
                raise RemoteCommandError(f"{self.label}: {line[len('trainctl-launch error ') :]}")
        raise RemoteCommandError(
            f"{self.label}: cannot start {self.argv[0]} with python {conn.host.python!r} "
            f"(exit code {result.code}): {result.tail()}"
        )

    # -- connection ----------------------------------------------------------------------
    def _call(self, fn: Callable[[SshConnection], T]) -> T:
        """fn(connection), reconnecting first if needed; _Unreachable when the host is not."""
        with self._lock:
            now = time.monotonic()
            if self._conn is None or not self._conn.active:
                self._drop_connection()
                if now < self._next_connect:
                    raise _Unreachable
                try:
                    self._conn = self.connector.connect(timeout=0)
                except SshError as exc:
                    # A changed host key counts too: the node is not trusted, so it is
                    # unreachable, and lost once that lasts (the reason says why).
                    self._note_failure(exc)
                    raise _Unreachable from None
                self.reconnects += 1
                log.info("%s: reconnected", self.label)
            try:
                result = fn(self._conn)
            except _connection_errors() as exc:
                if _is_remote_file_error(exc):
                    raise
                self._drop_connection()
                self._note_failure(exc)
                raise _Unreachable from None
            self._lost_since = None
            self._backoff = 0.2
            return result

    def _note_failure(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._lost_since is None:
            self._lost_since = now
            log.info("%s: connection lost (%s); reconnecting", self.label, _describe(exc))
        self._last_error = _describe(exc)
        self._next_connect = now + self._backoff
        self._backoff = min(self._backoff * 2, 5.0)

    def _drop_connection(self) -> None:
        self._log_handle = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _lost_too_long(self) -> bool:
        if self._lost_since is None:
            return False
        gone = time.monotonic() - self._lost_since
        if gone <= self.unreachable_timeout:
            return False
        self._end(
            EXIT_INFRA,
            f"[trainctl] {self.label} unreachable for {gone:.0f} s ({self._last_error}); "
            "counting the node as lost",
        )
        return True

    def _end(self, code: int, reason: str | None) -> None:
        with self._lock:
            if self._returncode is None:
                self._returncode = code
                self._end_reason = reason

    # -- remote state --------------------------------------------------------------------
    def _read(self, conn: SshConnection, position: int) -> bytes:
        if self._log_handle is None:
            self._log_handle = conn.sftp().open(f"{self.run_dir}/log", "rb")
        self._log_handle.seek(position)
        return bytes(self._log_handle.read(READ_CHUNK))

    def _exit_code(self, conn: SshConnection) -> int | None:
        try:
            with conn.sftp().open(f"{self.run_dir}/exit", "rb") as handle:
                text = handle.read().decode().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.lstrip("-").isdigit() else EXIT_INFRA

    def _waiter_alive(self, conn: SshConnection) -> bool:
        try:
            with conn.sftp().open(f"/proc/{self.pgid}/stat", "rb") as handle:
                fields = handle.read().decode().rsplit(")", 1)[1].split()
        except (FileNotFoundError, PermissionError, IndexError):
            return False
        return fields[0] not in ("Z", "X") and fields[19] == self.starttime

    def _status(self, conn: SshConnection) -> None:
        """Learn whether the command ended: its exit file, else (now and then) its pid."""
        code = self._exit_code(conn)
        if code is not None:
            self._end(code, None)
            return
        now = time.monotonic()
        if now < self._next_liveness:
            return
        self._next_liveness = now + LIVENESS_SECONDS
        if self._waiter_alive(conn):
            return
        code = self._exit_code(conn)  # it may have ended between the two looks
        if code is not None:
            self._end(code, None)
        elif self._killed:
            self._end(-signal.SIGKILL, None)
        else:
            self._end(
                EXIT_INFRA,
                f"[trainctl] {self.label}: process group {self.pgid} ended without an exit "
                "code (killed, or the host restarted); counting the node as lost",
            )

    # -- RunningProcess ------------------------------------------------------------------
    def lines(self) -> Iterator[str]:
        pending = b""
        while True:
            try:
                position = self.offset + len(pending)
                data = self._call(lambda c, at=position: self._read(c, at))
            except _Unreachable:
                if self._lost_too_long():
                    break
                time.sleep(min(self._backoff, 1.0))
                continue
            except (FileNotFoundError, PermissionError):
                # The run dir is gone (its node dir was removed): the process can only have
                # ended; the status check below says how.
                self._log_handle = None
                self._next_liveness = 0.0
                data = b""
            if data:
                pending += data
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    self.offset += len(raw) + 1
                    yield raw.decode("utf-8", errors="replace").rstrip("\r")
                if len(pending) > MAX_LINE:
                    self.offset += len(pending)
                    yield pending.decode("utf-8", errors="replace")
                    pending = b""
                continue
            if self._returncode is not None:
                # the log is complete once the exit file exists (written after the end)
                break
            try:
                self._call(self._status)
            except _Unreachable:
                if self._lost_too_long():
                    break
                continue
            if self._returncode is None:
                time.sleep(self.poll_interval)
        if pending:
            self.offset += len(pending)
            yield pending.decode("utf-8", errors="replace").rstrip("\r")
        if self._end_reason:
            yield self._end_reason
        self.close()

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + self.poll_interval
        try:
            self._call(self._status)
        except _Unreachable:
            self._lost_too_long()
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.argv[0]} on {self.label} still running")
            time.sleep(0.05)

    def _signal(self, sig: int, scope: str) -> bool:
        script_args = (str(self.pgid), self.starttime, str(int(sig)), scope)
        try:
            self._call(
                lambda c: c.check_python(
                    SIGNAL_GROUP,
                    *script_args,
                    what=f"signal process group {self.pgid}",
                    marker="trainctl-signal",
                    timeout=30,
                )
            )
        except (_Unreachable, SshError) as exc:
            detail = self._last_error if isinstance(exc, _Unreachable) else str(exc)
            log.warning("%s: cannot send signal %d: %s", self.label, sig, detail)
            return False
        return True

    def terminate(self) -> None:
        """SIGTERM to the remote process group (the agent forwards it to its workers)."""
        if self._returncode is None:
            self._signal(signal.SIGTERM, "group")

    def kill(self) -> None:
        """SIGKILL to the process group and every process it started, wherever it went."""
        self._killed = True
        if self._returncode is None or self._end_reason:
            self._signal(signal.SIGKILL, "tree")

    def close(self) -> None:
        """Release the connection (the remote process is not affected)."""
        with self._lock:
            self._drop_connection()
