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
import threading
import time
import uuid

import pytest

from tests.conftest import EXAMPLES, free_port, point_aws_at
from tests.imds_server import ImdsStandIn
from tests.sshd import job_processes, kill_all
from trainctl import Estimator
from trainctl.record import JobStore

pytestmark = pytest.mark.e2e

USER_SECRET = "submitter-secret-key-never-on-a-node"
REGION = "us-east-1"
PROFILE = "trainctl-node"
HPS = {"epochs": 6, "lr": 0.1, "seed": 0, "checkpoint-every": 10}
TORCHRUN = {"torch_distributed": {"enabled": True}}
TRUST_EC2 = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}
# moto's us-east-1 offerings include the g5 family (not p3); one GPU: one worker per node.
INSTANCE_TYPE = "g5.2xlarge"


@pytest.fixture
def cloud(home, sshd, monkeypatch, tmp_path):
    """moto (EC2, IAM, SSM, STS, S3) + two sshd "instances" + an IMDS stand-in."""
    import boto3
    from moto.server import ThreadedMotoServer

    from trainctl.provisioning.aws.keys import default_key_path, ensure_key

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    point_aws_at(monkeypatch, endpoint, key="AKIASUBMITTER0000000", secret=USER_SECRET)

    s3 = boto3.client("s3")
    bucket = f"trainctl-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    iam = boto3.client("iam")
    # moto keeps its state per process, not per server: names of its own per test.
    profile = f"{PROFILE}-{uuid.uuid4().hex[:8]}"
    iam.create_role(RoleName=profile, AssumeRolePolicyDocument=json.dumps(TRUST_EC2))
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
    ec2 = boto3.client("ec2")
    image = next(
        i
        for i in ec2.describe_images(Owners=["amazon"])["Images"]
        if i.get("Architecture") == "x86_64" and i.get("RootDeviceName")
    )

    # trainctl's own key pair is what EC2 would install on the instances: the sshd
    # stand-ins authorize it.
    public_key = ensure_key(default_key_path())
    hosts = sshd.servers[:2]
    for host in hosts:
        authorized = host.root / "authorized_keys"
        authorized.write_text(authorized.read_text() + public_key.strip() + "\n")

    imds = ImdsStandIn("127.0.0.4", role=profile)
    imds.__enter__()
    overrides = [f"{h.address}:{h.port}" for h in hosts]
    node_env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    import sys

    for key, value in {
        "TRAINCTL_STORE": f"s3://{bucket}/store",
        "TRAINCTL_SSH_ADDRESS_OVERRIDE": json.dumps(overrides),
        "TRAINCTL_NODE_ENVIRONMENT": json.dumps(node_env),
        "TRAINCTL_SSH_USER": "root",
        "TRAINCTL_AWS_NODE_PYTHON": sys.executable,
        "TRAINCTL_AWS_SSH_CIDR": "127.0.0.1/32",
        "TRAINCTL_IMDS_POLL_SECONDS": "0.5",
        "TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS": "20",
        # moto has no placement-group API (2-node jobs ask for a cluster placement group;
        # tests/test_aws_provider.py covers it with an in-test stand-in).
        "TRAINCTL_AWS_CLUSTER_PLACEMENT_GROUP": "false",
        # An orphaned EC2 node halts itself; the stand-in hosts are this machine.
        "TRAINCTL_POWEROFF_WHEN_ORPHANED": "false",
    }.items():
        monkeypatch.setenv(key, value)

    class Cloud:
        pass

    c = Cloud()
    c.endpoint, c.bucket, c.s3, c.ec2, c.imds, c.hosts = endpoint, bucket, s3, ec2, imds, hosts
    c.image_id, c.profile = image["ImageId"], profile
    try:
        yield c
    finally:
        imds.__exit__(None, None, None)
        server.stop()


def digits(cloud, **kwargs) -> Estimator:
    fields = {
        "entry_point": "train.py",
        "source_dir": str(EXAMPLES / "digits"),
        "instance_type": INSTANCE_TYPE,
        "instance_count": 2,
        "region": REGION,
        "instance_profile": cloud.profile,
        "image_id": cloud.image_id,
        "hyperparameters": HPS,
        "distribution": TORCHRUN,
        "checkpoint_s3_uri": f"s3://{cloud.bucket}/checkpoints",
        "output_path": f"s3://{cloud.bucket}/models",
    }
    return Estimator(**{**fields, **kwargs})


def _job_resources(ec2, job: str) -> dict[str, list[str]]:
    """What of `job` still exists in EC2 (found by its tag, as gc would)."""
    tag = [{"Name": "tag:trainctl:job", "Values": [job]}]
    live = [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]}]
    reservations = ec2.describe_instances(Filters=[*tag, *live])["Reservations"]
    return {
        "instances": [i["InstanceId"] for r in reservations for i in r["Instances"]],
        "security_groups": [
            g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]
        ],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]],
    }


def _no_user_credentials_on_nodes(job: str, seen: list[dict[bytes, bytes]]) -> None:
    for environ in seen:
        assert b"AWS_SECRET_ACCESS_KEY" not in environ
        assert all(USER_SECRET.encode() not in v for v in environ.values())


def _watch_node_environments(job: str, stop: threading.Event, seen: list) -> None:
    """Record the environment of every process of the job on the hosts while it runs."""
    from tests.sshd import _environ

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
        job = digits(cloud, job_name=job_name).fit(logs=False)
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
    assert _job_resources(cloud.ec2, job_name) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }
    # The job's cost was recorded per instance (on-demand list price of p3.2xlarge).
    assert info["cost"] is not None and len(info["instances"]) == 2
    assert {i["market"] for i in info["instances"]} == {"on-demand"}
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
    """True once the current attempt of `job_name` has a checkpoint at `step` or later."""
    from trainctl.controller.submit import default_store
    from trainctl.errors import NotFoundError

    deadline = time.monotonic() + 120
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


@pytest.mark.timeout(300)
def test_spot_notice_from_imds_checkpoints_and_loses_no_step(cloud):
    job_name = f"aws-notice-{uuid.uuid4().hex[:6]}"
    est = digits(
        cloud,
        job_name=job_name,
        use_spot_instances=True,
        hyperparameters={**HPS, "epochs": 8, "step-delay": 0.05},
    )
    runner, done = _run_in_background(est)
    reached = _wait_for_checkpoint(job_name, 20, runner)
    if reached:  # EC2's two-minute warning, as the nodes' IMDS serves it
        cloud.imds.set_spot_instance_action("terminate", only_current_sessions=True)
    runner.join(timeout=240)
    assert reached, "the job never reached step 20"
    assert "error" not in done, done.get("error")
    info = done["job"].describe()
    assert info["state"] == "Completed", info
    first, *rest = info["attempts"]
    assert rest, "no relaunch"
    assert first["outcome"] == "interrupted" and "notice" in first["cause"]
    assert first["steps_lost"] == 0
    assert rest[0]["resumed_from_step"] == first["last_step"]
    log = done["job"].store.get_text(f"jobs/{job_name}/logs/attempt-1/node-0.log")
    assert "spot interruption notice: terminate at" in log


@pytest.mark.timeout(300)
def test_spot_reclaim_mid_training_relaunches_on_new_capacity(cloud):
    job_name = f"aws-spot-{uuid.uuid4().hex[:6]}"
    est = digits(
        cloud,
        job_name=job_name,
        use_spot_instances=True,
        hyperparameters={**HPS, "epochs": 8, "step-delay": 0.05},
    )
    runner, done = _run_in_background(est)
    reclaimed = None
    if _wait_for_checkpoint(job_name, 20, runner):
        # The reclaim: EC2 terminates the spot instance of rank 1 and its processes die.
        node = next(
            i
            for i in _all_attempt_instances(cloud.ec2, job_name)
            if {"Key": "trainctl:rank", "Value": "1"} in i.get("Tags", [])
            and i["State"]["Name"] == "running"
        )
        reclaimed = node["InstanceId"]
        cloud.ec2.terminate_instances(InstanceIds=[reclaimed])
        host = cloud.hosts[1]
        kill_all([p for p in job_processes(job_name) if _home_of(p) == str(host.home)])
    runner.join(timeout=240)
    assert reclaimed is not None, "the job never reached step 20"
    assert "error" not in done, done.get("error")
    info = done["job"].describe()
    assert info["state"] == "Completed", info
    first, *rest = info["attempts"]
    assert rest, "no relaunch"
    assert first["outcome"] == "interrupted" and "algo-2" in first["cause"]
    assert first["steps_lost"] is not None and first["steps_lost"] <= 10 + 1
    # New capacity: the relaunch ran on other instances than the reclaimed one.
    instances = _all_attempt_instances(cloud.ec2, job_name)
    assert len({i["InstanceId"] for i in instances}) >= 4
    assert all(i.get("InstanceLifecycle") == "spot" for i in instances)
    assert _job_resources(cloud.ec2, job_name)["instances"] == []


def _home_of(pid: int) -> str | None:
    from tests.sshd import _environ

    return (_environ(pid).get(b"HOME") or b"").decode() or None


def test_dry_run_for_an_ec2_job_makes_no_call_that_changes_anything(cloud):
    plan = digits(cloud, job_name="aws-plan").fit(dry_run=True)
    operations = [(r["service"], r["operation"]) for r in plan["requests"]]
    assert ("ec2", "RunInstances") in operations
    assert operations[0] == ("s3", "PutObject")
    assert _job_resources(cloud.ec2, "aws-plan") == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }
    text = json.dumps(plan)
    assert USER_SECRET not in text
