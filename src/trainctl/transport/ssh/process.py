"""A node's agent as a remote process that outlives the SSH connection that started it.

`SshProcess` starts a command detached from the session (its own session and process group,
output to a log file in a remote run dir, exit code written to a file when it ends), so a
dropped connection does not end the node. `lines()` follows the remote log by byte offset
and resumes after a reconnect without losing or repeating a line. A host that stays
unreachable past a timeout, or a process that is gone without an exit code, ends the process
with EXIT_INFRA: the node is lost, not the user's code failed. This is what fabric lacks;
connections, commands and files are fabric's (see `connection.py`).

The environment given to a process travels as JSON on the SSH channel's stdin, so its
values never appear in a command line (remote `ps`), a log or an error.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from trainctl.protocol import EXIT_INFRA
from trainctl.transport import RunningProcess
from trainctl.transport.ssh.connection import (
    READ_CHUNK,
    SshConnection,
    SshConnector,
    connection_errors,
    describe,
    is_remote_file_error,
)
from trainctl.transport.ssh.errors import RemoteCommandError, SshError

log = logging.getLogger("trainctl.ssh")

T = TypeVar("T")

MAX_LINE = 1024 * 1024  # a "line" longer than this is passed on in pieces
LIVENESS_SECONDS = 1.0  # how often a quiet process's remote pid is checked


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
    # The leader (the waiter) first: killed after its command, it could still write that
    # death as the exit code, and a kill would read as the command's own end.
    for pid in sorted(found, key=lambda pid: pid != pgid):
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
        conn: SshConnection | None = None,
    ) -> None:
        """`conn`: a connection to the host already open (it is the process's from now on):
        one connection per host from the bootstrap to the end, not a second handshake."""
        if unreachable_timeout is None:
            from trainctl.spec.settings import get_settings

            unreachable_timeout = get_settings().heartbeat_timeout_seconds
        self.connector = connector
        self.label = connector.label
        self.argv = list(argv)
        self.run_dir = run_dir.rstrip("/")
        self.unreachable_timeout = unreachable_timeout
        self.poll_interval = poll_interval
        self._lock = threading.RLock()
        self._conn: SshConnection | None = conn or connector.connect(timeout=connect_timeout)
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
            except connection_errors() as exc:
                if is_remote_file_error(exc):
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
            log.info("%s: connection lost (%s); reconnecting", self.label, describe(exc))
        self._last_error = describe(exc)
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
