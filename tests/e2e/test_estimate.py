"""`trainctl estimate`, through the installed CLI: a job's measured speed replayed through
the controller against a shipped trace, strategy by strategy; bad input is one line and
exit 2."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import FIXTURES, TRAINCTL
from trainctl import Estimator
from trainctl.replay.estimate import Estimate


def _trainctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRAINCTL, *args], capture_output=True, text=True, timeout=240, check=False
    )


@pytest.fixture
def measured_job(home) -> str:
    """A finished job that reported its steps (1 node, 10 steps of 0.1 s)."""
    job = Estimator(
        "train.py",
        source_dir=str(FIXTURES / "tunable"),
        hyperparameters={"steps": 10, "step-seconds": 0.1},
    ).fit(logs=False)
    assert job.describe()["state"] == "Completed"
    return job.name


@contextlib.contextmanager
def _busy_cores():
    """A busy loop on every core while the block runs."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


def _outage_trace(path) -> str:
    """8 nodes for 30 minutes, then none for 40, then 8 for a week (one zone)."""
    rows = [(0, 1800, 8), (1800, 4200, 0), (4200, 4200 + 7 * 86400, 8)]
    trace = {
        "name": "outage-at-30-min",
        "source": "tests/e2e/test_estimate.py",
        "instance_type": "p3.2xlarge",
        "pool_size": 8,
        "prices": {"spot_usd_per_hour": 1.0, "on_demand_usd_per_hour": 4.0, "source": "t"},
        "capacity": [{"zone": "z", "start_s": a, "end_s": b, "available": n} for a, b, n in rows],
    }
    path.write_text(json.dumps(trace))
    return str(path)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_estimate_prints_each_strategy_against_on_demand(measured_job, tmp_path):
    # (replays side by side, a process each: the default; the table below runs them in turn)
    args = (
        "estimate", measured_job, "--trace", _outage_trace(tmp_path / "outage.json"),
        "--instance-type", "p3.2xlarge", "--nodes", "8", "--hours", "1", "--starts", "1",
        "-o", "json",
    )  # fmt: skip
    done = _trainctl(*args)
    assert done.returncode == 0, done.stderr
    # the same inputs, the same figures, to the last digit, on a machine made busy beside it
    with _busy_cores():
        again = _trainctl(*args)
    assert again.stdout == done.stdout
    estimate = Estimate.model_validate_json(done.stdout)
    assert (estimate.nodes, estimate.instance_type, estimate.starts) == (8, "p3.2xlarge", 1)
    assert 0.1 <= estimate.step_seconds < 0.5  # measured from the job's own steps
    by_name = {s.strategy: s for s in estimate.strategies}
    assert list(by_name) == [
        "on-demand", "omniscient", "spot", "elastic", "fallback", "fallback-now",
        "elastic-fallback", "uniform-progress",
    ]  # fmt: skip
    assert all(s.completed == s.runs == 1 for s in estimate.strategies), [
        (s.strategy, s.not_completed_attempts) for s in estimate.strategies if s.completed != 1
    ]
    on_demand, spot, fallback = by_name["on-demand"], by_name["spot"], by_name["fallback"]
    assert on_demand.cost_ratio.median == 1.0 and on_demand.relaunches.max == 0
    # the outage: a notice, a checkpoint, 40 minutes' wait, a relaunch, at a quarter the
    # price (the trace's) for the node-hours held
    assert spot.relaunches.median == 1 and spot.time_ratio.median > 1.5
    assert 0.25 < spot.cost_ratio.median < 0.4
    # the deadline (max_wait 1.15x the training) bounds the fallback: on-demand in time
    assert fallback.time_ratio.median <= 1.2 and fallback.on_demand_share.median > 0.3
    # without one, the fallback is at once (on this trace about when the deadline's is: its
    # slack is under a start-up at the outage), and the rest of the hour is on demand
    at_once = by_name["fallback-now"]
    assert at_once.time_ratio.median <= 1.2 and at_once.on_demand_share.median > 0.3
    # knowing its work, the job waits for spot while ahead of the line to its deadline and
    # takes on-demand once behind: in time too
    uniform = by_name["uniform-progress"]
    assert uniform.time_ratio.median <= 1.2, uniform
    # the limit: what a policy that saw the outage coming could do by the same deadline; no
    # strategy that meets the deadline costs less (its 5-minute steps: within 2 %)
    limit = by_name["omniscient"]
    assert limit.limit_ratio.median == 1.0 and limit.time_ratio.median <= 1.15
    assert limit.cost_ratio.median < fallback.cost_ratio.median
    for deadline in (fallback, uniform):
        assert deadline.limit_ratio.median >= 0.98, deadline

    # on an 80-column terminal: wrapped, a block per strategy (a pipe gets the table)
    narrow = estimate.render(80).splitlines()
    assert all(len(line) <= 80 or " " not in line.strip() for line in narrow), narrow
    for strategy in estimate.strategies:
        at = narrow.index(strategy.title)
        assert narrow[at + 1].startswith("  hours ") and "cost x " in narrow[at + 1], narrow
    assert max(len(line) for line in estimate.render().splitlines()) > 80  # the table whole

    table = _trainctl(
        "estimate", measured_job, "--trace", "synthetic-rare", "--instance-type",
        "p3.2xlarge", "--nodes", "4", "--hours", "0.5", "--starts", "1", "--workers", "1",
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "spot, relaunch at full size" in table.stdout and "cost x" in table.stdout
    assert "synthetic-rare" in table.stdout


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_bad_input_is_one_line_and_exit_2(measured_job, tmp_path):
    not_a_trace = tmp_path / "trace.json"
    not_a_trace.write_text(json.dumps({"name": "x", "capacity": [{"zone": "z"}]}))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x00\xff garbage")
    for args, says in (
        (["--trace", "no-such-trace", "--instance-type", "p3.2xlarge"], "--trace: no trace"),
        (["--trace", "synthetic-rare"], "--instance-type: 'local' is not an EC2 instance"),
        (["--trace", str(not_a_trace), "--instance-type", "p3.2xlarge"], str(not_a_trace)),
        (["--trace", str(binary), "--instance-type", "p3.2xlarge"], "is not JSON"),
        (["--trace", "synthetic-rare", "--instance-type", "p3.2xlarge"], "--hours: "),
        (["--trace", "synthetic-rare", "--nodes", "0"], "--nodes: must be at least 1"),
        (["--trace", "synthetic-rare", "--workers", "0"], "--workers: must be at least 1"),
    ):
        done = _trainctl("estimate", measured_job, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (args, done.stderr)
        assert "Traceback" not in done.stderr


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_on_a_terminal_the_head_comes_at_once_then_a_bar_over_the_replays(measured_job, tmp_path):
    """What is known before any replay (the job, the trace, the prices) is printed first,
    while the replays run under a bar that counts them; the table after."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    args = [
        "estimate", measured_job, "--trace", _outage_trace(tmp_path / "outage.json"),
        "--instance-type", "p3.2xlarge", "--nodes", "8", "--hours", "1", "--starts", "2",
        "--workers", "1",
    ]  # fmt: skip
    proc = subprocess.Popen([TRAINCTL, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    seen, head_while_running = b"", None
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
                if head_while_running is None and b"against outage-at-30-min" in seen:
                    head_while_running = proc.poll() is None and b"strategy" not in seen
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = seen.decode(errors="replace")
    assert head_while_running, text  # the head, before any figure, the replays still running
    assert "13 replays" in text, text  # the bar's label (on-demand once, 6 strategies x 2)
    assert text.index("against outage-at-30-min") < text.rindex("on-demand only")


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_its_replay_processes_end_with_it_when_it_is_killed(measured_job):
    """`trainctl estimate` killed outright (no chance to end its pool): its replays' processes
    end too, within seconds (left, one that hung ran for good)."""
    from trainctl.procs import alive, descendants

    estimate = subprocess.Popen(
        [TRAINCTL, "estimate", measured_job, "--trace", "aws-p3-16node-2023-08",
         "--instance-type", "p3.2xlarge", "--nodes", "64", "--hours", "6", "-o", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(replaying := descendants(estimate.pid)) < 3:  # a server, its workers
            assert estimate.poll() is None and time.monotonic() < deadline, replaying
            time.sleep(0.1)
    finally:
        estimate.kill()
        estimate.wait(timeout=10)
    deadline = time.monotonic() + 20
    while left := [pid for pid in replaying if alive(pid)]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
