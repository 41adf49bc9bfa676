"""One behaviour, every provider: the same job and the same faults on `local`, `ssh`, EC2 and
Slurm (the plug-in in plugins/trainctl-slurm, on a real cluster of this machine).

Each provider gets a rig (tests/rigs/providers.py): the Estimator fields that put a 2-node
job on it, where its nodes are, and what of a job could be left on it. Every test runs real
2-node jobs of examples/digits (the plain launcher: see tests/helpers.py; torchrun on these
providers is in their own files, and today's checkpoint patterns in test_resume_patterns).

What stays provider-specific lives in the provider's own file: the node contract over SSH,
unreachable hosts, the EC2 dry run's requests, spot notices through IMDS, a reclaimed spot
instance, the credentials a node never sees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from tests.helpers import TRAINCTL, log_lines, wait_for_uploaded_checkpoint
from tests.rigs.cloud import cloud, refuse_capacity
from tests.rigs.providers import PROVIDERS, rig
from tests.rigs.slurm import slurm_cluster
from tests.rigs.sshd import job_processes
from trainctl.record.jobstore import JobStore
from trainctl.store import default_store

pytestmark = pytest.mark.e2e
__all__ = ["cloud", "rig", "slurm_cluster"]  # the fixtures behind the rigs

# ~23 steps an epoch; the step delay only stretches time (~8 s of training), so a fault
# sent after the first checkpoint lands mid-training even on a loaded machine. (A notice
# that lands after the workers finished still ends the attempt as preempted: the job then
# relaunches from its last checkpoint and the notice test would count lost steps.)
HPS = {"epochs": 6, "lr": 0.1, "seed": 0, "checkpoint-every": 10, "step-delay": 0.06}


def _attempts(job) -> list[dict[str, Any]]:
    return job.describe()["attempts"]


@pytest.mark.timeout(60)
def test_dry_run_shows_every_node_and_makes_nothing(rig):
    plan = rig.estimator(job_name=f"plan-{rig.provider}").fit(dry_run=True)
    assert [n["rank"] for n in plan["nodes"]] == [0, 1]
    assert all(n["command"] for n in plan["nodes"])
    assert plan["requests"], "a dry run lists the requests it would make"
    assert rig.left(f"plan-{rig.provider}") == []
    assert not default_store().exists(f"jobs/plan-{rig.provider}/job.json")  # no record


def _first_checkpoint(job, timeout: float = 120.0) -> tuple[Any, int]:
    """(the first attempt's cluster, its checkpoint step) once it has checkpointed."""
    from trainctl.cluster import ClusterInfo
    from trainctl.record.keys import JobKeys

    deadline = time.monotonic() + timeout
    step = None
    while time.monotonic() < deadline and not step:
        attempts = _attempts(job)
        step = attempts and attempts[0]["last_checkpoint_step"]
        time.sleep(0.2)
    assert step, job.describe()
    cluster = ClusterInfo.model_validate_json(job.store.get_text(JobKeys(job.name).cluster(1)))
    return cluster, step


@pytest.mark.timeout(300)
def test_a_lost_node_is_relaunched_from_the_last_checkpoint(rig):
    """A node taken away without warning, from outside the job (a fresh provider, as a spot
    reclaim or a dead machine would): the attempt ends, the job resumes on new capacity."""
    from trainctl.provisioning import get_provider

    job = rig.estimator().fit(wait=False)
    cluster, _ = _first_checkpoint(job)
    uploaded = wait_for_uploaded_checkpoint(job.name, 1, 120)
    assert uploaded is not None, "no checkpoint uploaded by every node"
    get_provider(cluster.instance_type, rig.fields.get("region")).kill_node(cluster, 1)
    info = job.wait(timeout=240, raise_on_failure=False)
    assert info["state"] == "Completed", info
    first, second = info["attempts"]
    assert first["outcome"] == "interrupted" and first["cause"].startswith("algo-2 lost"), first
    # From the newest checkpoint every node had uploaded, or a newer one: what a node saved
    # but had not uploaded when it died without warning is gone with it (under load the
    # uploads trail the saves by seconds). The steps redone are counted.
    resumed = second["resumed_from_step"]
    steps = [(a["resumed_from_step"], a["last_step"], a["steps_lost"]) for a in info["attempts"]]
    assert uploaded <= resumed <= first["last_checkpoint_step"], (uploaded, steps)
    # a checkpoint boundary, or the attempt's last step: an emergency checkpoint, where the
    # controller saw the instance go before its processes went and stopped every node in time
    # (CI: resumed at 43, 0 steps lost)
    assert resumed % HPS["checkpoint-every"] == 0 or resumed == first["last_step"], steps
    assert first["steps_lost"] == first["last_step"] - resumed, steps
    rig.assert_nothing_left(job.name)


@pytest.mark.timeout(300)
def test_a_notice_ends_the_attempt_at_an_emergency_checkpoint_losing_no_step(rig):
    """An interruption notice relayed by the controller in its lease (how every provider's
    agents get one; EC2's own IMDS notice is tested in test_e2e_aws), after the first
    checkpoint (step 10): no step is lost. This is also the conformance check that a job
    runs on the provider's nodes and leaves nothing (a job of one attempt is each provider's
    first test in its own file: test_e2e_local, _ssh, _aws)."""
    job = rig.estimator(faults=["notice:0@step12"]).fit(wait=False)
    info = job.wait(timeout=240, raise_on_failure=False)
    assert info["state"] == "Completed", info
    first, second = info["attempts"]
    assert first["outcome"] == "interrupted" and "notice" in first["cause"], first
    logs = "\n".join(
        job.store.get_text(f"jobs/{job.name}/logs/attempt-{a}/node-{r}.log")[-3000:]
        for a in (1, 2)
        for r in (0, 1)
    )
    assert first["steps_lost"] == 0, (info["attempts"], logs)
    assert second["resumed_from_step"] == first["last_step"], info["attempts"]
    # each rank on the provider's node for it, in every attempt, and the model in the store
    for attempt in info["attempts"]:
        assert [n["address"] for n in attempt["nodes"]] == rig.addresses, attempt["nodes"]
    assert info["model_data"] and info["model_data"].endswith("/output/model.tar.gz")
    rig.assert_nothing_left(job.name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rig", ["aws"], indirect=True)
def test_an_unchanged_tutorial_script_goes_back_to_spot_from_its_working_directory(
    rig, source, monkeypatch
):
    """The DDP tutorial's pattern (positional arguments, snapshot.pt saved to a relative path
    by each node, loaded at start if present) as a spot job with on_demand_fallback: EC2 has
    no spot for its first attempt (a botocore hook on RunInstances, the one part AWS itself
    would play), so it runs on demand; once its snapshot is in the store and
    spot_probe_seconds have passed, it relaunches, gets spot, and resumes from its working
    directory. On EC2 stand-ins here; the working directory after a lost node, on local
    nodes through the CLI in test_e2e_cli."""
    from trainctl.record.keys import JobKeys

    monkeypatch.setenv("TRAINCTL_SPOT_PROBE_SECONDS", "2")
    refused = refuse_capacity(
        monkeypatch,
        lambda params, tags: (
            tags.get("trainctl:attempt") == "1" and "InstanceMarketOptions" in params
        ),  # no spot at first
    )
    tutorial = {"entry_point": "multinode.py", "source_dir": str(source("snapshot"))}
    job = rig.estimator(
        # 120 epochs, 18 s of training: the snapshot stored (workdir sync, 2 s), the probe's
        # 2 s and the lease's notice (within control_poll_seconds) all before the end, on a
        # loaded machine too (with 6 s a CI-like run once ended first: one attempt)
        **tutorial, arguments=["120", "1"], hyperparameters={"epoch_delay": 0.15},
        use_spot_instances=True, on_demand_fallback=True,
    ).fit(logs=False)  # fmt: skip
    info = job.describe()
    causes = [(a["outcome"], a.get("cause")) for a in info["attempts"]]
    assert info["state"] == "Completed", causes
    assert refused, "spot was never refused"
    # (under load a third attempt could come from elsewhere: its cause is then shown)
    assert len(info["attempts"]) == 2, causes
    first, second = info["attempts"]
    assert first["cause"].startswith("trying spot again after"), first
    assert second["started_from"].startswith("restored snapshot.pt"), second
    markets = {(i["attempt"], i["market"]) for i in info["instances"]}
    assert markets == {(1, "on-demand"), (2, "spot")}, info["instances"]
    probes = [e for e in JobStore(job.store, job.name).events() if e["type"] == "spot_probe"]
    assert [(p["attempt"], p["found"]) for p in probes] == [(2, True)], probes
    logs = [job.store.get_text(JobKeys(job.name).log(2, rank)) for rank in (0, 1)]
    starts = {line for log in logs for line in log_lines(log) if line.startswith("Resuming")}
    assert len(starts) == 1 and not starts.pop().endswith(" 0"), logs
    rig.assert_nothing_left(job.name)


def _wait_training(job, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while job.describe()["state"] != "Training" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.describe()["state"] == "Training", job.describe()


def _stop(job_name: str) -> None:
    done = subprocess.run(
        [TRAINCTL, "stop", job_name], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(300)
def test_stop_leaves_nothing_with_or_without_a_live_controller(rig, source):
    """`trainctl stop` (another process) of a detached job; then of one whose controller was
    killed (kill -9, as a closed laptop ends it): stop takes over and terminates."""
    sleeper = {"entry_point": "train.py", "source_dir": str(source("sleeper"))}
    sleeper.update(hyperparameters={}, distribution=None)
    job = rig.estimator(**sleeper).fit(wait=False)
    _wait_training(job)
    _stop(job.name)
    assert job.describe()["state"] == "Stopped"
    rig.assert_nothing_left(job.name)

    orphan = rig.estimator(**sleeper).fit(wait=False)
    _wait_training(orphan)
    lease = json.loads(orphan.store.get_text(f"jobs/{orphan.name}/lease.json"))
    os.kill(int(lease["pid"]), signal.SIGKILL)
    assert job_processes(orphan.name), "the nodes outlive their controller"
    _stop(orphan.name)
    info = orphan.describe()
    assert info["state"] == "Stopped"
    assert info["stop_reason"] == "stopped by the user (no controller was running)"
    rig.assert_nothing_left(orphan.name)


def test_every_provider_is_covered() -> None:
    from trainctl.provisioning import get_provider

    types = ("local", "ssh", "g5.2xlarge", "slurm")
    names = {get_provider(t, "us-east-1").name for t in types}
    assert names == set(PROVIDERS)
