"""A job outlives the process that controls it: kill -9 of a detached controller (a closed
laptop, a crashed kernel, an OOM kill), then any client takes the job over.

Real 2-node jobs of examples/digits on the local provider (the plain launcher, as in
test_fault_tolerance; the closed-terminal test's two jobs run under torchrun, alike in
speed, so neither is near its end when the other reaches the step the test waits for); the
controller is a real detached process killed with SIGKILL; the takeover runs in this process
(`TrainingJob.wait()`) or in `trainctl attach` processes racing each other.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.helpers import TRAINCTL
from tests.rigs.sshd import job_processes, kill_all
from tests.train.test_fault_tolerance import assert_bit_identical, digits, model_tensors
from trainctl.procs import alive
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys

pytestmark = pytest.mark.e2e

STEP_DELAY = 0.06  # with EPOCHS, stretches an attempt to ~11 s: a kill lands mid-training
EPOCHS = 8


@pytest.fixture(autouse=True)
def quick_heartbeats(monkeypatch):
    """Nodes write their status every second (the default 5 s only slows the tests)."""
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_SECONDS", "1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The model of an uninterrupted run: what a taken-over job must end with, bit for bit."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINCTL_HOME", str(tmp_path_factory.mktemp("uninterrupted")))
    mp.delenv("TRAINCTL_STORE", raising=False)
    try:
        # The step delay only stretches time (the model does not depend on it): none here.
        job = digits(epochs=EPOCHS, step_delay=0.0).fit(logs=False)
        assert job.describe()["state"] == "Completed"
        return model_tensors(job)
    finally:
        mp.undo()


def _kill_controller(job) -> int:
    lease = json.loads(job.store.get_text(JobKeys(job.name).lease))
    pid = int(lease["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # SIGKILL is sent at once, the process ends a bit later
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def _statuses(job) -> list[dict]:
    return [
        json.loads(job.store.get_text(k.key))
        for k in job.store.list(f"jobs/{job.name}/attempts/attempt-1")
        if k.key.endswith(".status.json")
    ]


def _wait_step(job, step: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [s.get("checkpoint", 0) for s in _statuses(job)]
        if len(steps) == 2 and min(steps) >= step:
            return
        info = job.describe()  # a job that ended (or relaunched) never gets there: say why
        assert info["state"] not in ("Completed", "Failed", "Stopped"), (steps, info)
        assert len(info["attempts"]) <= 1, (steps, info)
        time.sleep(0.2)
    raise AssertionError(f"the job never checkpointed step {step}: {job.describe()}")


def _events(job, kind: str) -> list[dict]:
    return [e for e in JobStore(job.store, job.name).events() if e.get("type") == kind]


@pytest.mark.timeout(240)
def test_nodes_still_training_are_adopted_and_lose_no_step(home, uninterrupted):
    job = digits(epochs=EPOCHS, step_delay=STEP_DELAY).fit(wait=False)
    _wait_step(job, 20)
    # What a taking-over controller learns from the store: the nodes stored a checkpoint (a
    # relaunch by choice would resume from it). Step 10's upload is long done by step 20.
    assert all(s.get("state_stored") for s in _statuses(job)), _statuses(job)
    _kill_controller(job)
    info = job.describe()
    assert info["state"] == "Training"
    assert info["controller"]["lost"], info["controller"]  # the record no longer lies
    status = subprocess.run(
        [TRAINCTL, "status", job.name], capture_output=True, text=True, timeout=60, check=True
    )
    assert "controller lost" in status.stdout
    assert re.search(rf"^take over\s+trainctl attach {job.name}$", status.stdout, re.M)
    listed = subprocess.run([TRAINCTL, "jobs"], capture_output=True, text=True, timeout=60)
    assert f"trainctl attach {job.name}" in listed.stderr, listed
    final = job.wait(timeout=180)  # this process takes the job over
    assert final["state"] == "Completed", final
    (attempt,) = final["attempts"]  # adopted, not relaunched
    assert attempt["outcome"] == "completed" and attempt["steps_lost"] in (None, 0), attempt
    assert len(_events(job, "takeover")) == 1
    assert_bit_identical(model_tensors(job), uninterrupted)
    assert job.describe()["controller"] is None  # ended: no controller to speak of


@pytest.mark.timeout(240)
def test_nodes_that_finished_are_recorded_from_their_results(home):
    job = digits(epochs=EPOCHS, step_delay=0.02).fit(wait=False)
    _wait_step(job, 10)
    _kill_controller(job)
    keys = JobKeys(job.name)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
        job.store.exists(keys.node_result(1, rank)) for rank in (0, 1)
    ):
        time.sleep(0.2)
    assert job.describe()["state"] == "Training"  # what the dead controller left
    final = job.wait(timeout=60)
    assert final["state"] == "Completed", final
    assert final["model_data"] and job.store.exists(f"jobs/{job.name}/output/model.tar.gz")
    assert [a["outcome"] for a in final["attempts"]] == ["completed"]
    assert _events(job, "takeover") and _events(job, "teardown")


@pytest.mark.timeout(240)
def test_nodes_gone_with_their_controller_relaunch_from_the_checkpoint(home, monkeypatch):
    # Short, so the takeover finds the dead nodes soon; not 3 s: under CI's load nodes still
    # starting were silent that long, twice, and the job never reached step 20 in attempt 1
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", "10")
    job = digits(epochs=EPOCHS, step_delay=STEP_DELAY).fit(wait=False)
    _wait_step(job, 20)
    _kill_controller(job)
    kill_all(job_processes(job.name))  # the nodes went down with it
    final = job.wait(timeout=180)
    assert final["state"] == "Completed", final
    first, second = final["attempts"]
    assert first["outcome"] == "interrupted" and first["cause"] == "controller lost", first
    assert second["resumed_from_step"] >= 20, final["attempts"]
    assert final["exit_code"] == 0 and final["failure_reason"] is None


@pytest.mark.timeout(300)
def test_a_takeover_knows_the_faults_that_fired_and_a_node_gone_meanwhile(home, uninterrupted):
    """What the dead controller knew is the next one's: the fault it fired (attempt 1's kill)
    does not fire again under the controller that takes over, and a node lost while no
    controller ran is found at once (its processes are gone), not after a heartbeat timeout.
    The job resumes from its checkpoint and ends with the uninterrupted run's model."""
    from trainctl.cluster import ClusterInfo
    from trainctl.provisioning.local import LocalProvider
    from trainctl.record.keys import parse_iso

    job = digits(epochs=EPOCHS, step_delay=STEP_DELAY, faults=["kill:1@step15"]).fit(wait=False)
    deadline = time.monotonic() + 150

    def resumed() -> bool:  # attempt 2 resumed from attempt 1's checkpoint
        return any(e["attempt"] == 2 and e["step"] for e in _events(job, "resumed"))

    while not resumed() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert resumed(), job.describe()
    _kill_controller(job)
    cluster = ClusterInfo.model_validate_json(job.store.get_text(JobKeys(job.name).cluster(2)))
    LocalProvider().kill_node(cluster, 1)  # no controller sees this one go
    final = job.wait(timeout=200)  # this process takes the job over
    assert final["state"] == "Completed", final
    assert len(_events(job, "fault")) == 1, _events(job, "fault")  # fired once, not again
    attempts = final["attempts"]
    assert [a["faults"] for a in attempts] == [["kill:1@step15"], [], []], attempts
    (takeover,) = _events(job, "takeover")
    ended = next(e for e in _events(job, "attempt_end") if e["attempt"] == 2)
    assert ended["cause"].startswith("algo-2 lost: its processes are gone"), ended
    waited = parse_iso(ended["time"]) - parse_iso(takeover["time"])
    assert waited < 15, waited  # the heartbeat timeout is 60 s
    assert attempts[2]["resumed_from_step"] >= 10, attempts  # from its checkpoint
    assert_bit_identical(model_tensors(job), uninterrupted)


@pytest.mark.timeout(240)
def test_two_clients_racing_to_take_over_one_wins_the_other_follows(home):
    job = digits(epochs=EPOCHS, step_delay=STEP_DELAY).fit(wait=False)
    _wait_step(job, 10)
    _kill_controller(job)
    attach = [TRAINCTL, "attach", job.name]
    racers = [
        subprocess.Popen(attach, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = []
    try:
        for racer in racers:
            out, _ = racer.communicate(timeout=180)
            outputs.append(out)
            assert racer.returncode == 0, out
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    assert len(_events(job, "takeover")) == 1
    taken = [o for o in outputs if "taking over attempt 1" in o]
    assert len(taken) == 1, outputs
    for out in outputs:  # both followed it to the end
        assert f"job {job.name}: Completed" in out
    assert job.describe()["state"] == "Completed"


@pytest.mark.timeout(120)
def test_a_live_controller_is_not_taken_over(home):
    # Stopped a few seconds in: a long job costs no time here, and a loaded machine that
    # starves the nodes' status writes (they yield the CPU to training) cannot see it end
    # before its first checkpoint is in their status.
    job = digits(epochs=5 * EPOCHS, step_delay=STEP_DELAY).fit(wait=False)
    _wait_step(job, 1)
    result: dict = {}

    def wait() -> None:
        result["info"] = job.wait(timeout=120, raise_on_failure=False)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(2)
    job.stop()
    waiter.join(timeout=60)
    assert result["info"]["state"] == "Stopped"
    assert _events(job, "takeover") == []


FIT_SCRIPT = """import json, sys
from trainctl import Estimator
est = Estimator(entry_point="train.py", source_dir=sys.argv[1], instance_count=2,
                distribution={"torch_distributed": {"enabled": True}},
                hyperparameters=json.loads(sys.argv[2]), job_name="hangup-fit")
job = est.fit()  # returns at the job's end, terminal or not
open(sys.argv[3], "w").write(job.describe()["state"])
"""


def _on_a_pty(argv: list[str]) -> tuple[subprocess.Popen, int]:
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=os.environ.copy())
    os.close(slave)
    return proc, master


@pytest.mark.timeout(240)
def test_a_closed_terminal_hands_a_foreground_job_to_a_detached_controller(
    home, uninterrupted, tmp_path
):
    """`trainctl submit`, and a script's `fit()`, in a terminal that closes (SIGHUP): the
    terminal only followed the job. A detached controller takes it over, adopts its nodes
    (no relaunch, no step lost, the same model) and runs it to its end; `fit()` returns
    then, as it would have. (Both at once: one test's time.)"""
    import sys

    from tests.helpers import EXAMPLES
    from tests.train.test_fault_tolerance import HYPERPARAMETERS
    from trainctl.estimator import TrainingJob

    hyperparameters = {**HYPERPARAMETERS, "epochs": EPOCHS, "step-delay": STEP_DELAY}
    pairs = [f"{k}={v}" for k, v in hyperparameters.items()]
    (tmp_path / "fit.py").write_text(FIT_SCRIPT)
    returned = tmp_path / "returned"
    started = [
        _on_a_pty(
            [TRAINCTL, "submit", "train.py", "--source-dir", str(EXAMPLES / "digits"),
             "--instance-count", "2", "--distribution", "torch_distributed",
             "--job-name", "hangup", *[a for p in pairs for a in ("-p", p)]]
        ),
        _on_a_pty(
            [sys.executable, str(tmp_path / "fit.py"), str(EXAMPLES / "digits"),
             json.dumps(hyperparameters), str(returned)]
        ),
    ]  # fmt: skip
    try:
        for name in ("hangup", "hangup-fit"):
            deadline = time.monotonic() + 60
            while not JobStore(_store(home), name).exists():
                assert time.monotonic() < deadline, f"{name} was never recorded"
                time.sleep(0.2)
            _wait_step(TrainingJob.attach(name), 20)
        for proc, master in started:
            os.close(master)  # the terminal closes...
            proc.send_signal(signal.SIGHUP)  # ...and its session is hung up
        submit, script = (proc for proc, _ in started)
        assert submit.wait(timeout=30) == 129
        script.wait(timeout=180)  # it follows the job to its end, silently
        assert script.returncode != -signal.SIGHUP
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.kill()
    assert returned.read_text() == "Completed"
    for name in ("hangup", "hangup-fit"):
        job = TrainingJob.attach(name)
        deadline = time.monotonic() + 180
        while not (record := JobStore(job.store, name).load()).state.is_terminal():
            assert time.monotonic() < deadline, record.state
            time.sleep(0.5)
        assert record.state.value == "Completed", record.failure_reason
        why = [e["why"] for e in _events(job, "handed_off")]
        assert why == ["the terminal closed (SIGHUP)"], (name, why)
        assert len(_events(job, "controller_spawned")) == 1
        assert len(_events(job, "takeover")) == 1
        (attempt,) = record.attempts  # adopted, not relaunched
        assert attempt.outcome == "completed" and attempt.steps_lost in (None, 0), attempt
        assert_bit_identical(model_tensors(job), uninterrupted)


def _store(home):
    from trainctl.store import open_store

    return open_store((home / "store").resolve().as_uri())
