"""mpirun's remote shell between a job's nodes (trainctl.node.remote_start), with a real
agent-side server on loopback and the real client as mpirun runs it. A stand-in `orted` on
the server's PATH says what it was given; the real Open MPI runs in the e2e test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl.node.remote_start import (
    ENDPOINTS_VARIABLE,
    RemoteStartServer,
    main,
    write_endpoints,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]

FAKE_ORTED = """#!/bin/sh
echo "orted given: $*"
echo "node env: $NODE_VALUE"
echo "$$" > "$PID_FILE"
if [ "$1" = "--sleep" ]; then sleep 60; fi
exit 3
"""


@pytest.fixture
def node(tmp_path):
    """A node's server at 127.0.0.1 whose environment finds the stand-in orted, and the
    endpoint table rank 0 would write for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "orted").write_text(FAKE_ORTED)
    (bin_dir / "orted").chmod(0o755)
    pid_file = tmp_path / "orted.pid"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NODE_VALUE": "from-the-node",
        "PID_FILE": str(pid_file),
    }
    logged: list[str] = []
    server = RemoteStartServer("127.0.0.1", lambda: env, tmp_path, logged.append)
    table = tmp_path / "remote-starts.json"
    write_endpoints(table, [server.endpoint()])
    server.logged = logged
    server.table = table
    server.pid_file = pid_file
    yield server
    server.close()


def run_client(node, monkeypatch, capfd, *args: str) -> tuple[int, str]:
    monkeypatch.setenv(ENDPOINTS_VARIABLE, str(node.table))
    code = main(list(args))
    return code, capfd.readouterr().err


def test_orted_runs_on_the_node_with_its_environment_and_its_exit_status(node, monkeypatch, capfd):
    """As Open MPI calls its remote shell: HOST, then the daemon's command in pieces with
    shell quoting; the node's own environment, the output back, the exit status as ssh's."""
    code, err = run_client(node, monkeypatch, capfd, "127.0.0.1", " orted", "-mca", 'ess "env"')
    assert code == 3
    assert "orted given: -mca ess env" in err
    assert "node env: from-the-node" in err
    assert any(line.startswith("mpirun on 127.0.0.1 started orted here") for line in node.logged)
    assert node.token not in "\n".join(node.logged)
    assert oct(node.table.stat().st_mode & 0o777) == "0o600"


def test_only_orted_with_the_right_token_is_started(node, monkeypatch, capfd, tmp_path):
    marker = tmp_path / "ran"
    code, err = run_client(node, monkeypatch, capfd, "127.0.0.1", "sh", "-c", f"'touch {marker}'")
    assert code == 255
    assert "127.0.0.1 refused: only Open MPI's orted is started here, not 'sh'" in err
    wrong = json.loads(node.table.read_text())
    wrong["127.0.0.1"]["token"] = "0" * 64
    node.table.write_text(json.dumps(wrong))
    code, err = run_client(node, monkeypatch, capfd, "127.0.0.1", "orted")
    assert code == 255 and "127.0.0.1 refused: wrong token" in err
    assert not marker.exists() and not node.pid_file.exists()
    assert [line.split(": ", 1)[1] for line in node.logged] == [
        "only Open MPI's orted is started here, not 'sh'",
        "wrong token",
    ]


def test_garbage_and_floods_are_refused_and_the_node_keeps_serving(node, monkeypatch, capfd):
    deep = b"[" * 60_000 + b"\n"  # deeper than json reads: no traceback either
    for junk in (b"\xff\x00binary\n", b"[1, 2]\n", b"x" * (70 * 1024), b"{}\n", b"", deep):
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as conn:
            # The node may refuse and close before all is sent or read (the flood, or a
            # request it has already judged): the connection is then reset or gone.
            try:
                conn.sendall(junk)
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(4096):
                    pass
            except OSError:
                pass
    assert len(node.logged) == 6
    assert node.logged[5].endswith("a request that is not JSON")
    assert "a request over 65536 bytes" in node.logged[2]
    assert not node.pid_file.exists()
    code, _ = run_client(node, monkeypatch, capfd, "127.0.0.1", "orted")
    assert code == 3


def test_a_host_that_is_not_a_node_of_the_job_is_one_line(node, monkeypatch, capfd):
    code, err = run_client(node, monkeypatch, capfd, "10.0.0.9", "orted")
    assert code == 255
    assert err == "trainctl remote start: no node of this job at 10.0.0.9 (its nodes: 127.0.0.1)\n"
    monkeypatch.delenv(ENDPOINTS_VARIABLE)
    assert main(["127.0.0.1", "orted"]) == 255
    assert "TRAINCTL_REMOTE_STARTS is not set" in capfd.readouterr().err


@pytest.mark.timeout(120)
def test_when_mpirun_ends_its_remote_shell_the_daemon_ends_too(node, tmp_path):
    """mpirun kills its remote shells to end a job's daemons: the node ends what it started
    (the client here is the real module, started as mpirun starts it)."""
    env = {**os.environ, ENDPOINTS_VARIABLE: str(node.table)}
    client = subprocess.Popen(
        [sys.executable, "-m", "trainctl.node.remote_start", "127.0.0.1", "orted", "--sleep"],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        # Two Python starts (the client, the node's stand-in orted): seconds each on a
        # loaded 2-core machine, so the wait is generous; a dead client fails at once.
        deadline = time.monotonic() + 60
        while not node.pid_file.exists() or not node.pid_file.read_text().strip():
            assert client.poll() is None, f"the client ended: {client.stderr.read()!r}"
            assert time.monotonic() < deadline, "orted never started"
            time.sleep(0.05)
        orted = int(node.pid_file.read_text())
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=10)
        deadline = time.monotonic() + 10
        while node.started[0].poll() is None:
            assert time.monotonic() < deadline, "the daemon outlived its remote shell"
            time.sleep(0.05)
        assert not Path(f"/proc/{orted}").exists() or _zombie(orted)
    finally:
        client.kill()
        client.wait(timeout=10)
        assert client.stderr is not None
        client.stderr.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
