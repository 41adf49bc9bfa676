"""`fit()` on an EC2 instance type, end to end, with no cloud: every part real but AWS.

- EC2, IAM, SSM, STS and S3 are a real moto server on 127.0.0.1 that the real boto3 and
  s3transfer code paths talk to (AWS_ENDPOINT_URL).
- The "instances" moto launches are stood in for by real OpenSSH servers on 127.0.0.2 and
  127.0.0.3 (`ssh_address_override`, the documented test seam): the controller reaches them
  with trainctl's own key pair, bootstraps the agent and streams its output over SSH.
- Each node gets its store credentials from an IMDSv2 stand-in serving instance-profile
  credentials; the test checks that none of the submitter's credentials reach a node.
- A real 2-node torchrun job runs across the two hosts, with checkpoints and outputs in S3.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid

import pytest

from tests.helpers import TORCHRUN, TRAINCTL, wait_for_uploaded_checkpoint
from tests.rigs.cloud import HPS, INSTANCE_TYPE, USER_SECRET, cloud, ec2_digits, job_resources
from tests.rigs.sshd import job_processes
from trainctl import Estimator
from trainctl.node.imds import SPOT_INSTANCE_ACTION_PATH
from trainctl.record.jobstore import JobStore

pytestmark = pytest.mark.e2e
__all__ = ["cloud"]  # the fixture, used by every test here


def _no_user_credentials_on_nodes(job: str, seen: list[dict[bytes, bytes]]) -> None:
    for environ in seen:
        assert b"AWS_SECRET_ACCESS_KEY" not in environ
        assert all(USER_SECRET.encode() not in v for v in environ.values())


def _watch_node_environments(job: str, stop: threading.Event, seen: list) -> None:
    """Record the environment of every process of the job on the hosts while it runs."""
    from tests.rigs.sshd import _environ

    while not stop.is_set():
        for pid in job_processes(job):
            environ = _environ(pid)
            if environ:
                seen.append(environ)
        time.sleep(0.5)


def _all_attempt_instances(ec2, job: str) -> list[dict]:
    tag = [{"Name": "tag:trainctl:job", "Values": [job]}]
    return [i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]


@pytest.mark.timeout(240)
def test_fit_on_ec2_runs_two_nodes_over_ssh_and_leaves_nothing(cloud):
    job_name = f"aws-e2e-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    seen: list = []
    watcher = threading.Thread(target=_watch_node_environments, args=(job_name, stop, seen))
    watcher.start()
    try:
        # torchrun, as most jobs run; the faults below use the plain launcher (helpers.py)
        job = ec2_digits(cloud, job_name=job_name, distribution=TORCHRUN).fit(logs=False)
    finally:
        stop.set()
        watcher.join()
    info = job.describe()
    assert info["state"] == "Completed", info
    assert len(info["attempts"]) == 1
    assert seen, "no process of the job was seen on the hosts"
    _no_user_credentials_on_nodes(job_name, seen)

    # Model and checkpoints in S3, written by the nodes with the instance-profile keys.
    keys = {o["Key"] for o in cloud.s3.list_objects_v2(Bucket=cloud.bucket)["Contents"]}
    assert f"models/{job_name}/output/model.tar.gz" in keys
    assert any(k.startswith("checkpoints/step-") for k in keys)
    # Both nodes' logs came back over SSH and are in the store.
    store = job.store
    for rank in (0, 1):
        log = store.get_text(f"jobs/{job_name}/logs/attempt-1/node-{rank}.log")
        assert "launching:" in log
    assert "test_accuracy=" in store.get_text(f"jobs/{job_name}/logs/attempt-1/node-0.log")

    # The instances were real moto instances with the requested options, now terminated.
    instances = _all_attempt_instances(cloud.ec2, job_name)
    assert len(instances) == 2
    assert {i["State"]["Name"] for i in instances} == {"terminated"}
    assert {i["InstanceType"] for i in instances} == {INSTANCE_TYPE}
    # Every created resource is gone.
    assert job_resources(cloud.ec2, job_name) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }
    # The job's cost was recorded per instance (on-demand list price of p3.2xlarge).
    assert info["cost"] is not None and len(info["instances"]) == 2
    assert {i["market"] for i in info["instances"]} == {"on-demand"}
    # ... and `status` shows the store's share beside it (the nodes' requests to S3)
    assert info["cost"]["store_usd"] > 0
    status = subprocess.run(
        [TRAINCTL, "status", job_name], capture_output=True, text=True, timeout=60
    ).stdout
    share = r"the nodes' store requests about \$[0-9.]+ more, [0-9.e-]+ % of that"
    assert re.search(share, status), status
    assert not job_processes(job_name)


def _run_in_background(est: Estimator) -> tuple[threading.Thread, dict]:
    done: dict = {}

    def run() -> None:
        try:
            done["job"] = est.fit(logs=False)
        except Exception as exc:  # reported by the caller's assertion
            done["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    return runner, done


def _wait_for_checkpoint(job_name: str, step: int, runner: threading.Thread) -> bool:
    """True once the current attempt of `job_name` has a checkpoint at `step` or later
    (under CI's load two EC2 stand-ins take up to two minutes to start training)."""
    from trainctl.errors import NotFoundError
    from trainctl.store import default_store

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and runner.is_alive():
        try:
            record = JobStore(default_store(), job_name).load()
        except NotFoundError:
            record = None
        attempt = record.attempts[-1] if record and record.attempts else None
        if attempt and (attempt.last_checkpoint_step or 0) >= step:
            return True
        time.sleep(0.3)
    return False


@pytest.mark.timeout(480)
def test_spot_notice_from_imds_checkpoints_and_loses_no_step(cloud):
    job_name = f"aws-notice-{uuid.uuid4().hex[:6]}"
    est = ec2_digits(
        cloud,
        job_name=job_name,
        use_spot_instances=True,
        hyperparameters={**HPS, "epochs": 8, "step-delay": 0.05},
    )
    runner, done = _run_in_background(est)
    reached = _wait_for_checkpoint(job_name, 20, runner)
    notice = {}
    if reached:  # EC2's two-minute warning, as the nodes' IMDS serves it (to these sessions)
        notice = cloud.imds.set_spot_instance_action("terminate", only_current_sessions=True)
    runner.join(timeout=240)
    assert reached, "the job never reached step 20"
    assert "error" not in done, done.get("error")
    info = done["job"].describe()
    assert info["state"] == "Completed", info
    first, *rest = info["attempts"]
    assert rest, "no relaunch"
    assert first["outcome"] == "interrupted" and "interruption notice" in first["cause"]
    assert first["faults"] == []  # nothing injected: the notice came from IMDS alone
    assert first["steps_lost"] == 0, info["attempts"]  # the emergency checkpoint saved all
    assert rest[0]["outcome"] == "completed"
    assert rest[0]["resumed_from_step"] == first["last_step"] > 0
    assert cloud.imds.sessions_served(SPOT_INSTANCE_ACTION_PATH)  # the agents polled it
    # Both instances get the notice; whichever agent polls IMDS first stops the workers, and
    # its peer's may end (the workers agreed to stop) before its own next poll.
    store = done["job"].store
    logs = [store.get_text(f"jobs/{job_name}/logs/attempt-1/node-{r}.log") for r in (0, 1)]
    assert any(f"spot interruption notice: terminate at {notice['time']}" in log for log in logs)
    # The relaunch is new capacity: it watches IMDS too, and no notice is served to it.
    later = store.get_text(f"jobs/{job_name}/logs/attempt-2/node-0.log")
    assert "watching spot interruption notices at " + cloud.imds.endpoint in later
    assert "spot interruption notice:" not in later


@pytest.mark.timeout(480)
def test_spot_reclaim_mid_training_relaunches_on_new_capacity(cloud):
    job_name = f"aws-spot-{uuid.uuid4().hex[:6]}"
    est = ec2_digits(
        cloud,
        job_name=job_name,
        use_spot_instances=True,
        hyperparameters={**HPS, "epochs": 8, "step-delay": 0.05},
    )
    runner, done = _run_in_background(est)
    reclaimed = None
    uploaded = wait_for_uploaded_checkpoint(job_name, 20, 180, runner.is_alive)
    if uploaded is not None:
        # The reclaim: EC2 terminates the spot instance of rank 1.
        node = next(
            i
            for i in _all_attempt_instances(cloud.ec2, job_name)
            if {"Key": "trainctl:rank", "Value": "1"} in i.get("Tags", [])
            and i["State"]["Name"] == "running"
        )
        reclaimed = node["InstanceId"]
        cloud.ec2.terminate_instances(InstanceIds=[reclaimed])  # its processes end with it
    runner.join(timeout=240)
    assert reclaimed is not None, "no checkpoint of step 20 uploaded by every node"
    assert "error" not in done, done.get("error")
    info = done["job"].describe()
    assert info["state"] == "Completed", info
    first, *rest = info["attempts"]
    steps = [(a["resumed_from_step"], a["last_step"], a["steps_lost"]) for a in info["attempts"]]
    assert rest, "no relaunch"
    assert first["outcome"] == "interrupted" and "algo-2" in first["cause"], first
    # No warning, so what the nodes saved but had not all uploaded goes with the instance
    # (under load the uploads trail the saves by seconds): the relaunch resumes from the
    # newest checkpoint every node had uploaded at the reclaim, or a newer one, and counts
    # the steps redone.
    resumed = rest[0]["resumed_from_step"]
    assert resumed is not None and resumed >= uploaded, (uploaded, steps)
    # a checkpoint boundary, or the attempt's last step: an emergency checkpoint, where the
    # controller saw the instance go before its processes went and stopped every node in time
    # (CI: resumed at 43, 0 steps lost)
    assert resumed % HPS["checkpoint-every"] == 0 or resumed == first["last_step"], steps
    assert first["steps_lost"] == first["last_step"] - resumed, steps
    # New capacity: the relaunch ran on other instances than the reclaimed one.
    instances = _all_attempt_instances(cloud.ec2, job_name)
    assert len({i["InstanceId"] for i in instances}) >= 4
    assert all(i.get("InstanceLifecycle") == "spot" for i in instances)
    assert job_resources(cloud.ec2, job_name)["instances"] == []


def test_dry_run_for_an_ec2_job_makes_no_call_that_changes_anything(cloud):
    plan = ec2_digits(cloud, job_name="aws-plan").fit(dry_run=True)
    operations = [(r["service"], r["operation"]) for r in plan["requests"]]
    assert ("ec2", "RunInstances") in operations
    assert operations[0] == ("s3", "PutObject")
    assert job_resources(cloud.ec2, "aws-plan") == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }
    text = json.dumps(plan)
    assert USER_SECRET not in text


@pytest.mark.timeout(240)
def test_a_deadline_job_that_knows_its_work_takes_on_demand_behind_and_spot_again_ahead(
    cloud, monkeypatch
):
    """Uniform Progress on EC2's stand-ins: the job gives its work (total_steps); EC2 has no
    spot for the first attempt, and the deadline's slack does not allow a wait: on-demand.
    Once ahead of the line to max_wait by two restarts, the job checkpoints, relaunches, and
    is back on spot (Uniform Progress's hysteresis)."""
    from tests.rigs.cloud import refuse_capacity

    monkeypatch.setenv("TRAINCTL_MIN_RESTART_SECONDS", "1")
    refused = refuse_capacity(
        monkeypatch,
        lambda params, tags: (
            tags.get("trainctl:attempt") == "1" and "InstanceMarketOptions" in params
        ),
    )
    job = ec2_digits(
        cloud,
        hyperparameters={**HPS, "step-delay": 0.1},
        use_spot_instances=True,
        on_demand_fallback=True,
        max_run=120,
        max_wait=700,  # (the slack, 580 s, is under a start-up: on-demand at once)
        total_steps=138,  # 6 epochs of 23 steps (the script says so too, once it runs)
    ).fit(logs=False)
    info = job.describe()
    causes = [(a["outcome"], a["cause"]) for a in info["attempts"]]
    assert info["state"] == "Completed", causes
    assert refused, "spot was never refused"
    first, second = info["attempts"][0], info["attempts"][-1]
    assert first["cause"].startswith("trying spot again after"), causes
    assert "ahead of the deadline's line" in first["cause"], causes
    markets = {(i["attempt"], i["market"]) for i in info["instances"]}
    assert (1, "on-demand") in markets and (second["number"], "spot") in markets, markets
    assert info["progress"]["fraction"] == 1.0, info["progress"]
    assert job_resources(cloud.ec2, job.name) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
        "placement_groups": [],
    } or not any(job_resources(cloud.ec2, job.name).values())
