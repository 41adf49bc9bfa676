"""The Slurm provider (plugins/trainctl-slurm) on a real cluster of this machine
(tests/rigs/slurm.py: munged, slurmctld, three slurmd): what only Slurm has. The faults every
provider shares (a lost node, a notice, stop) are test_provider_conformance's, on this rig
too.

- the digits example through `trainctl submit` (with `--slurm-*` flags) and `Estimator.fit()`
  on 2 nodes of the allocation; the dry run's batch script and srun lines; the Slurm job id
  of each attempt in `trainctl status`;
- a node drained mid-run: the attempt's node is lost, the job relaunches in a new allocation
  on the other nodes and ends with the model an uninterrupted run gives, bit for bit;
- Slurm's preemption (an `urgent` partition's job takes the nodes): SIGTERM to the steps is
  a notice, 0 steps lost; the relaunch waits in the queue with Slurm's reason, shown;
- the user's `scancel` stops the job, and leaves nothing.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import EXAMPLES, TRAINCTL, digits_estimator
from tests.rigs.providers import rig
from tests.rigs.slurm import SlurmRig, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]
__all__ = ["rig", "slurm_cluster"]

SLURM = {"instance_type": "slurm", "slurm": {"partition": "batch"}}
# as the conformance suite's: ~23 steps an epoch, a checkpoint every 10
HPS = {"epochs": 6, "lr": 0.1, "seed": 0, "checkpoint-every": 10, "step-delay": 0.06}


def _trainctl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=timeout)


def _nodes_of(cluster: SlurmRig, slurm_job: str) -> list[str]:
    nodelist = cluster.slurm("squeue", "-h", "--states=all", f"--jobs={slurm_job}", "-o", "%N")
    return cluster.slurm("scontrol", "show", "hostnames", nodelist.strip()).split()


def _model(job) -> bytes:
    from trainctl.store import open_store

    parent, _, leaf = job.describe()["model_data"].rpartition("/")
    data = open_store(parent).get_bytes(leaf)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("model.pt")
        assert member is not None
        return member.read()


def _first_checkpoint(job, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        attempts = job.describe()["attempts"]
        if attempts and attempts[0]["last_checkpoint_step"]:
            return attempts[0]
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint: {job.describe()}")


@pytest.mark.parametrize("rig", ["slurm"], indirect=True)
@pytest.mark.timeout(300)
def test_digits_trains_on_two_slurm_nodes_from_the_cli_and_the_dry_run_shows_the_script(
    rig, slurm_cluster
):
    args = [
        "submit", "train.py", "--source-dir", str(EXAMPLES / "digits"),
        "--instance-type", "slurm", "--instance-count", "2", "--slurm-partition", "batch",
        "-p", "epochs=2", "-p", "seed=0",
    ]  # fmt: skip
    plan = _trainctl(*args, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=batch",
        "#SBATCH --no-requeue",
        "#SBATCH --signal=USR1@120",
        "exec sleep infinity",
    ):
        assert f"| {line}\n" in plan.stdout, plan.stdout  # fmt: skip
    starts = [line for line in plan.stdout.splitlines() if "agent: srun " in line]
    assert len(starts) == 2 and all("--ntasks=1" in line for line in starts), plan.stdout
    assert slurm_cluster.queue() == []  # a dry run asks Slurm for nothing

    done = _trainctl(*args, "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    info = json.loads(done.stdout)
    assert info["state"] == "Completed", info
    (attempt,) = info["attempts"]
    slurm_job = attempt["capacity_id"]
    assert len(set(_nodes_of(slurm_cluster, slurm_job))) == 2  # one task on each of 2 nodes
    status = _trainctl("status", info["name"], timeout=60)
    assert " ID " in status.stdout and f" {slurm_job} " in status.stdout, status.stdout
    assert re.search(r"progress +46/46 steps \(100%\)", status.stdout), status.stdout
    rig.assert_nothing_left(info["name"])


@pytest.mark.parametrize("rig", ["slurm"], indirect=True)
@pytest.mark.timeout(420)
def test_a_drained_node_is_relaunched_elsewhere_and_the_model_is_the_uninterrupted_ones(
    rig, slurm_cluster
):
    uninterrupted = digits_estimator(HPS, **SLURM).fit(logs=False)
    assert uninterrupted.describe()["state"] == "Completed"

    job = digits_estimator(HPS, **SLURM).fit(wait=False)
    first = _first_checkpoint(job)
    drained = _nodes_of(slurm_cluster, first["capacity_id"])[1]
    slurm_cluster.slurm("scontrol", "update", f"NodeName={drained}", "State=DRAIN",
                        "Reason=maintenance")  # fmt: skip
    try:
        info = job.wait(timeout=300, raise_on_failure=False)
    finally:
        slurm_cluster.slurm("scontrol", "update", f"NodeName={drained}", "State=RESUME")
    causes = [(a["outcome"], a["cause"]) for a in info["attempts"]]
    assert info["state"] == "Completed", causes
    first, second = info["attempts"]
    assert first["cause"].startswith(f"algo-2 lost: Slurm node {drained} is drain"), causes
    assert "maintenance" in first["cause"], causes
    assert drained not in _nodes_of(slurm_cluster, second["capacity_id"])
    resumed = second["resumed_from_step"]
    assert resumed and resumed % HPS["checkpoint-every"] == 0, causes
    assert _model(job) == _model(uninterrupted), "not the uninterrupted run's model"
    rig.assert_nothing_left(job.name)


@pytest.mark.parametrize("rig", ["slurm"], indirect=True)
@pytest.mark.timeout(300)
def test_slurms_preemption_is_a_notice_losing_no_step_and_the_wait_shows_slurms_reason(
    rig, slurm_cluster
):
    job = digits_estimator(HPS, **SLURM).fit(wait=False)
    _first_checkpoint(job)
    urgent = slurm_cluster.slurm(
        "sbatch", "--parsable", "--partition=urgent", "--nodes=3", "--output=/dev/null",
        "--wrap", "sleep 10",
    ).strip()  # fmt: skip
    waiting = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and waiting is None:
        waiting = job.describe()["waiting"]
        time.sleep(0.2)
    assert waiting is not None and "is pending in the queue (" in waiting, job.describe()
    info = job.wait(timeout=240, raise_on_failure=False)
    assert info["state"] == "Completed", info
    first, second = info["attempts"]
    assert first["outcome"] == "interrupted" and "notice" in first["cause"], first
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "SIGTERM from the scheduler (preemption or time limit)" in log, log[-2000:]
    assert first["steps_lost"] == 0, info["attempts"]
    assert second["resumed_from_step"] == first["last_step"], info["attempts"]
    assert info["waiting"] is None
    assert urgent not in slurm_cluster.queue()
    rig.assert_nothing_left(job.name)


@pytest.mark.parametrize("rig", ["slurm"], indirect=True)
@pytest.mark.timeout(240)
def test_scancel_stops_the_job(rig, slurm_cluster, source):
    sleeper = {"entry_point": "train.py", "source_dir": str(source("sleeper"))}
    job = rig.estimator(**sleeper, hyperparameters={}, distribution=None).fit(wait=False)
    deadline = time.monotonic() + 120
    while job.describe()["state"] != "Training" and time.monotonic() < deadline:
        time.sleep(0.2)
    slurm_job = job.describe()["attempts"][0]["capacity_id"]
    slurm_cluster.slurm("scancel", slurm_job)
    info = job.wait(timeout=120, raise_on_failure=False)
    assert info["state"] == "Stopped", info
    assert info["stop_reason"].startswith(f"Slurm job {slurm_job} was cancelled"), info
    assert len(info["attempts"]) == 1, info["attempts"]
    rig.assert_nothing_left(job.name)


@pytest.mark.timeout(60)
def test_a_relaunch_can_ask_slurm_how_many_nodes_it_could_have(slurm_cluster, tmp_path):
    """The provider's count (CapacityProbe) is the partition's idle nodes: an elastic job
    grows once they are there instead of requeueing to find out."""
    from trainctl_slurm.provider import SlurmProvider

    from trainctl.spec.job import JobSpec
    from trainctl.spec.request import CapacityRequest

    (tmp_path / "train.py").write_text("pass\n")
    spec = JobSpec(
        entry_point="train.py", source_dir=str(tmp_path), instance_count=2,
        instance_type="slurm", provider_options={"slurm": SLURM["slurm"]},
    )  # fmt: skip
    request = CapacityRequest.of(spec)
    provider = SlurmProvider()
    slurm_cluster.wait_idle(len(slurm_cluster.nodes))
    assert provider.available_nodes(request, "j") == len(slurm_cluster.nodes)
    drained = slurm_cluster.nodes[0]
    slurm_cluster.slurm("scontrol", "update", f"NodeName={drained}", "State=DRAIN",
                        "Reason=test")  # fmt: skip
    try:
        assert provider.available_nodes(request, "j") == len(slurm_cluster.nodes) - 1
    finally:
        slurm_cluster.slurm("scontrol", "update", f"NodeName={drained}", "State=RESUME")
    slurm_cluster.wait_idle(len(slurm_cluster.nodes))


@pytest.mark.timeout(60)
def test_slurm_with_no_cluster_in_reach_is_one_line_and_makes_no_job(tmp_path):
    """Slurm's commands but no cluster they can find (no slurm.conf; SLURM_CONF naming
    nothing): one line saying so and where to look, exit 2, no job recorded."""
    import os

    from tests.helpers import require_part
    from tests.rigs.slurm import missing_slurm

    require_part("slurm", missing_slurm())
    (tmp_path / "train.py").write_text("print('hello')\n")
    env = {**os.environ, "TRAINCTL_HOME": str(tmp_path / "home")}
    env.pop("TRAINCTL_STORE", None)
    cases = {"SLURM_CONF naming no file": str(tmp_path / "no-such-slurm.conf")}
    if not Path("/etc/slurm/slurm.conf").exists():  # (a machine that is a login node has it)
        cases["no slurm.conf"] = None
    for case, conf in cases.items():
        env.pop("SLURM_CONF", None)
        if conf is not None:
            env["SLURM_CONF"] = conf
        done = subprocess.run(
            [TRAINCTL, "submit", "train.py", "--source-dir", str(tmp_path), "--instance-type",
             "slurm"],
            capture_output=True, text=True, timeout=40, env=env,
        )  # fmt: skip
        assert done.returncode == 2, (case, done.stdout + done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: instance_type: 'slurm': "), lines
        assert "SLURM_CONF" in lines[0], (case, lines)
        if conf is None:
            assert "no Slurm cluster answers from this machine (sinfo: " in lines[0], lines
            assert "docs/providers.md" in lines[0]
        jobs = tmp_path / "home" / "store" / "jobs"
        assert not jobs.exists() or not any(jobs.iterdir()), case
