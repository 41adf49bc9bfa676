"""A cloud node that outlives its controller halts itself (and EC2 then terminates it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainctl.node.agent import power_off


@pytest.mark.timeout(30)
def test_power_off_halts_the_machine_with_shutdown(tmp_path: Path, monkeypatch) -> None:
    # A stand-in `shutdown` (and `sudo`) first on PATH records how it was called.
    calls = tmp_path / "calls"
    for name in ("shutdown", "sudo"):
        tool = tmp_path / "bin" / name
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    said: list[str] = []
    power_off(said.append)
    expected = "shutdown -h now" if os.geteuid() == 0 else "sudo -n shutdown -h now"
    assert calls.read_text().splitlines() == [expected]
    assert said == [f"powering off this node: {expected}"]


@pytest.mark.timeout(30)
def test_killing_a_node_spares_the_next_attempt_on_the_same_rank(home) -> None:
    """A node killed from outside its controller (a spot reclaim, a test) while the
    controller already relaunches on that rank: only the old attempt's processes end (seen
    on a fast machine: the kill's rescans took the next attempts' agents, 3 in a row)."""
    import subprocess
    import sys

    from trainctl.cluster import ClusterInfo, NodeInfo
    from trainctl.procs import ATTEMPT_TAG, JOB_TAG, NODE_TAG
    from trainctl.provisioning.local import LocalProvider

    def node(attempt: int) -> subprocess.Popen:
        tags = {JOB_TAG: "j", NODE_TAG: "0", ATTEMPT_TAG: str(attempt)}
        env = {**os.environ, **tags}
        code = "import time; time.sleep(60)"
        return subprocess.Popen([sys.executable, "-c", code], env=env)

    old, new = node(1), node(2)
    try:
        nodes = [NodeInfo(rank=0, host="127.0.1.1", address="127.0.0.1", root=str(home))]
        cluster = ClusterInfo(
            job="j", attempt=1, provider="local", instance_type="local", nodes=nodes,
            master_port=29500, processes_per_host=1,
        )  # fmt: skip
        LocalProvider().kill_node(cluster, 0)
        assert old.wait(timeout=10) == -9
        assert new.poll() is None, "the next attempt's process was killed"
    finally:
        for proc in (old, new):
            proc.kill()
            proc.wait()


def _agent_start_result(store: str, env: dict[str, str]) -> dict:
    """The result an agent reports when it cannot start (its one control message)."""
    import json
    import subprocess
    import sys

    from trainctl.protocol import CONTROL_PREFIX, EXIT_INFRA

    argv = ["--store", store, "--job", "gone", "--attempt", "1", "--rank", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "trainctl.node.agent", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == EXIT_INFRA, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(CONTROL_PREFIX)]
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0][len(CONTROL_PREFIX) :])


@pytest.mark.timeout(90)
def test_an_agent_that_cannot_reach_the_store_is_the_machines_failure(
    tmp_path, home, monkeypatch
) -> None:
    """No store from this node (here: S3 at a port nothing listens on; on EC2: no instance
    profile credentials yet) is infrastructure: the controller relaunches, as for a node
    that fails its health check. A job whose record is gone is not: no relaunch brings it
    back."""
    from tests.helpers import point_aws_at
    from trainctl.provisioning.ports import free_port

    result = _agent_start_result(str(tmp_path / "store"), os.environ.copy())  # no such job
    assert result["unhealthy"] is False, result

    point_aws_at(monkeypatch, f"http://127.0.0.1:{free_port()}")
    result = _agent_start_result("s3://nowhere/store", os.environ.copy())
    assert result["event"] == "result" and result["unhealthy"] is True, result
    assert result["reason"].startswith("agent start failed: "), result
