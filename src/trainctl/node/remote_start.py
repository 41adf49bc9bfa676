"""mpirun's remote starts between a job's nodes, with no SSH between them.

Open MPI's mpirun starts its daemon, `orted`, on every host it does not count as its own
through a remote shell (`plm_rsh_agent`: `ssh HOST orted ...` by default). The nodes of a
trainctl job have no SSH between them (EC2 instances, SSH hosts, containers), so each
node's agent takes those starts itself, as Kubeflow's MPI operator does with `kubectl
exec`: on a multi-host MPI job every node's agent listens on its own address, on a port it
picks, and publishes the port with a token made for this attempt in the job's store; rank
0's mpirun is given this module as its remote shell (`python -m trainctl.node.remote_start
HOST COMMAND...`), which connects to that host's agent, shows the token, and has the agent
run the command there.

What an agent runs this way: Open MPI's `orted` and nothing else (no shell), under the
node's own environment (its `SM_*` variables, the job's `environment`, its share of the
CPU threads, its own job interpreter in TRAINCTL_JOB_PYTHON), in its code directory, as a
descendant of the agent, so it ends with the node. Its output comes back to mpirun as an
SSH session's would, and its exit status is the remote shell's.

The wire: the client sends one JSON line, {"token", "command"}; the agent answers with
frames of a kind byte and a 4-byte big-endian length: output (b"O"), the exit status
(b"X", a signed 4-byte payload) or a refusal (b"R", a message).

This module is also the client mpirun runs: it must start fast (no heavy imports).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import shlex
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ENDPOINTS_VARIABLE = "TRAINCTL_REMOTE_STARTS"  # rank 0: the file with every node's endpoint
ALLOWED_PROGRAM = "orted"
MAX_REQUEST_BYTES = 64 * 1024
REQUEST_SECONDS = 10.0  # for the request line to arrive once connected
CONNECT_SECONDS = 30.0  # a node's agent that is not listening yet (or a busy network)
OUTPUT, EXIT, REFUSED = b"O", b"X", b"R"
SHELL_FAILURE = 255  # what ssh exits with when it cannot run the command at all
_HEADER = struct.Struct(">cI")


class RemoteStartServer:
    """Takes mpirun's starts of `orted` on this node (see the module's doc).

    `environment()` is the node's environment for what it starts; `log` says what was
    started and what was refused (never the token)."""

    def __init__(
        self,
        address: str,
        environment: Callable[[], dict[str, str]],
        cwd: Path,
        log: Callable[[str], None],
        in_view: Callable[[list[str]], list[str]] = list,
    ) -> None:
        """`in_view`: `orted`'s argv as the node starts it in its own view of the machine
        (Agent.in_own_view): the processes it starts see what the node's launcher's do."""
        self.address = address
        self.in_view = in_view
        self.environment = environment
        self.cwd = cwd
        self.log = log
        self.token = secrets.token_hex(32)
        self.listener = _listen(address)
        self.port: int = self.listener.getsockname()[1]
        self.closed = False
        self.started: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="remote-starts", daemon=True).start()

    def endpoint(self) -> dict[str, str | int]:
        """What rank 0's mpirun needs to reach this node (secret: the store's job prefix
        only, never a log)."""
        return {"address": self.address, "port": self.port, "token": self.token}

    def close(self) -> None:
        """Stop taking starts and end what was started that is still running (an orted
        that daemonized itself is the agent's descendant still: the agent ends those)."""
        self.closed = True
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            started = list(self.started)
        for proc in started:
            if proc.poll() is None:
                proc.terminate()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn, peer[0]), name="remote-start", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        with conn:
            try:
                conn.settimeout(REQUEST_SECONDS)
                request = _read_request(conn)
                argv = self._allowed(request)
            except _Refused as refused:
                self.log(f"refused a remote start from {peer}: {refused}")
                _send(conn, REFUSED, str(refused).encode())
                return
            except (OSError, ValueError) as exc:
                self.log(f"refused a remote start from {peer}: {exc}")
                return
            self._run(conn, argv, peer)

    def _allowed(self, request: dict[str, object]) -> list[str]:
        token = request.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
            raise _Refused("wrong token")
        command = request.get("command")
        if not isinstance(command, str):
            raise _Refused("no command")
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise _Refused(f"unreadable command ({exc})") from None
        if not argv or os.path.basename(argv[0]) != ALLOWED_PROGRAM:
            shown = argv[0][:80] if argv else "nothing"
            raise _Refused(f"only Open MPI's {ALLOWED_PROGRAM} is started here, not {shown!r}")
        return [ALLOWED_PROGRAM, *argv[1:]]  # found on the node's own PATH

    def _run(self, conn: socket.socket, argv: list[str], peer: str) -> None:
        try:
            proc = subprocess.Popen(
                self.in_view(argv),
                cwd=self.cwd,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            self.log(f"mpirun's start of {ALLOWED_PROGRAM} from {peer} failed: {exc}")
            _send(conn, OUTPUT, f"trainctl: cannot start {ALLOWED_PROGRAM}: {exc}\n".encode())
            _send(conn, EXIT, struct.pack(">i", 127))
            return
        with self._lock:
            self.started.append(proc)
        self.log(f"mpirun on {peer} started {ALLOWED_PROGRAM} here (pid {proc.pid})")
        conn.settimeout(None)
        # mpirun ends its remote shell to end what it started: then so does this node.
        threading.Thread(
            target=_end_when_closed, args=(conn, proc), name="remote-start-peer", daemon=True
        ).start()
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            try:
                _send(conn, OUTPUT, chunk)
            except OSError:
                pass  # the peer went away: keep draining until the process ends
        code = proc.wait()
        try:
            _send(conn, EXIT, struct.pack(">i", code))
        except OSError:
            pass


def _listen(address: str) -> socket.socket:
    """A listening socket on `address` (the one the other nodes reach this node at), or on
    every interface when that is not an address of this machine (a name that resolves to
    a NAT's address): the token, not the interface, keeps others out."""
    host = address.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, 0))
    except OSError:
        listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    listener.listen(64)
    return listener


class _Refused(Exception):
    """A request this node does not run (what is wrong with it, never the token)."""


def _end_when_closed(conn: socket.socket, proc: subprocess.Popen[bytes]) -> None:
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    if proc.poll() is None:
        proc.terminate()


def _read_request(conn: socket.socket) -> dict[str, object]:
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("the connection closed before a whole request")
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise ValueError(f"a request over {MAX_REQUEST_BYTES} bytes")
    try:
        request = json.loads(data.split(b"\n", 1)[0])
    except (ValueError, RecursionError):  # (RecursionError: nested deeper than json reads)
        raise ValueError("a request that is not JSON") from None
    if not isinstance(request, dict):
        raise ValueError("a request that is not a JSON object")
    return request


def _send(conn: socket.socket, kind: bytes, payload: bytes) -> None:
    conn.sendall(_HEADER.pack(kind, len(payload)) + payload)


def _receive_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_endpoint(text: str, host: str) -> dict[str, str | int]:
    """A node's endpoint as its agent stored it (`endpoint()`); ValueError naming the host
    when the stored copy is not one (corrupt, or written by something else)."""
    try:
        endpoint = json.loads(text)
    except (ValueError, RecursionError):
        endpoint = None
    fields = {"address": str, "port": int, "token": str}
    if not isinstance(endpoint, dict) or not all(
        isinstance(endpoint.get(name), kind) for name, kind in fields.items()
    ):
        raise ValueError(f"the remote-start endpoint of {host} in the store is unreadable")
    return endpoint


def write_endpoints(path: Path, endpoints: list[dict[str, str | int]]) -> None:
    """Rank 0's file of every node's endpoint, keyed by the address mpirun is given; only
    its owner reads it (it holds the tokens)."""
    table = {str(e["address"]): {"port": e["port"], "token": e["token"]} for e in endpoints}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(table, out)


def _fail(message: str) -> int:
    sys.stderr.write(f"trainctl remote start: {message}\n")
    return SHELL_FAILURE


def main(argv: list[str] | None = None) -> int:
    """mpirun's remote shell: `HOST COMMAND...` runs COMMAND on the job's node at HOST."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        return _fail("usage: python -m trainctl.node.remote_start HOST COMMAND...")
    host, command = args[0], " ".join(args[1:]).strip()
    where = os.environ.get(ENDPOINTS_VARIABLE)
    if not where:
        return _fail(f"{ENDPOINTS_VARIABLE} is not set (a trainctl MPI job's mpirun runs this)")
    try:
        table = json.loads(Path(where).read_text())
        endpoint = table[host]
        port, token = int(endpoint["port"]), str(endpoint["token"])
    except KeyError:
        known = ", ".join(sorted(table)) if isinstance(table, dict) else "none"
        return _fail(f"no node of this job at {host} (its nodes: {known})")
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        return _fail(f"cannot read {where}: {exc}")
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        try:
            conn = socket.create_connection((host.strip("[]"), port), timeout=CONNECT_SECONDS)
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                return _fail(f"cannot reach the trainctl agent at {host}:{port}: {exc}")
            time.sleep(0.5)
    with conn:
        conn.settimeout(None)
        request = json.dumps({"token": token, "command": command}) + "\n"
        try:
            conn.sendall(request.encode())
            return _relay(conn, host)
        except OSError as exc:
            return _fail(f"the connection to {host} broke: {exc}")


def _relay(conn: socket.socket, host: str) -> int:
    out = sys.stderr.buffer
    while True:
        header = _receive_exactly(conn, _HEADER.size)
        if header is None:
            return _fail(f"the trainctl agent at {host} went away")
        kind, size = _HEADER.unpack(header)
        payload = _receive_exactly(conn, size) if size else b""
        if payload is None:
            return _fail(f"the trainctl agent at {host} went away")
        if kind == OUTPUT:
            out.write(payload)
            out.flush()
        elif kind == EXIT:
            (code,) = struct.unpack(">i", payload)
            return code if code >= 0 else 128 - code  # killed by signal N: 128+N, as ssh
        elif kind == REFUSED:
            return _fail(f"{host} refused: {payload.decode(errors='replace')}")
        else:
            return _fail(f"{host} answered something this version does not read ({kind!r})")


if __name__ == "__main__":
    sys.exit(main())
