"""A cloud on this machine for EC2 jobs: moto (EC2, IAM, SSM, STS, S3) on 127.0.0.1 that the
real boto3 and s3transfer code paths talk to, two sshd "instances" standing in for what moto
launches (`ssh_address_override`, the documented test seam), and an IMDSv2 stand-in serving
instance-profile credentials and spot notices. Used by the EC2 end-to-end tests and the
provider conformance suite."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import digits_estimator, free_port, point_aws_at
from tests.rigs.imds_server import ImdsStandIn
from tests.rigs.sshd import _environ, job_processes, kill_all
from trainctl import Estimator
from trainctl.procs import ATTEMPT_TAG

USER_SECRET = "submitter-secret-key-never-on-a-node"
REGION = "us-east-1"
PROFILE = "trainctl-node"
HPS = {"epochs": 6, "lr": 0.1, "seed": 0, "checkpoint-every": 10}
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
    with stand_in_cloud(monkeypatch, sshd.servers[:2]) as c:
        yield c


class Cloud:
    """What `stand_in_cloud` made: the endpoint, a bucket, clients, the node profile..."""

    def __init__(self, monkeypatch, endpoint: str, bucket: str, imds, hosts) -> None:
        import boto3

        self.monkeypatch, self.endpoint, self.bucket, self.imds = (
            monkeypatch,
            endpoint,
            bucket,
            imds,
        )
        self.s3, self.ec2 = boto3.client("s3"), boto3.client("ec2")
        self.hosts: list = []
        self.image_id = self.profile = ""
        self.machines: TerminationEndsProcesses | None = None
        self.use_hosts(hosts)

    def use_hosts(self, hosts) -> None:
        """Make `hosts` (sshd servers) the stand-ins of the instances moto launches."""
        from trainctl.provisioning.aws.keys import default_key_path, ensure_key

        # trainctl's own key pair is what EC2 would install on the instances: the sshd
        # stand-ins authorize it.
        public_key = ensure_key(default_key_path())
        for host in hosts:
            authorized = host.root / "authorized_keys"
            authorized.write_text(authorized.read_text() + public_key.strip() + "\n")
        overrides = [f"{h.address}:{h.port}" for h in hosts]
        self.monkeypatch.setenv("TRAINCTL_SSH_ADDRESS_OVERRIDE", json.dumps(overrides))
        self.hosts = list(hosts)
        if self.machines is not None:
            self.machines.hosts = self.hosts


@contextlib.contextmanager
def stand_in_cloud(monkeypatch, hosts) -> Iterator[Cloud]:
    """The stand-in cloud for the EC2 provider, its settings set through `monkeypatch`
    (a pytest fixture's, or `pytest.MonkeyPatch.context()` outside tests: bench/)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    imds = None
    c = None
    try:
        endpoint = f"http://127.0.0.1:{port}"
        point_aws_at(monkeypatch, endpoint, key="AKIASUBMITTER0000000", secret=USER_SECRET)

        bucket = f"trainctl-{uuid.uuid4().hex[:10]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        iam = boto3.client("iam")
        # moto keeps its state per process, not per server: names of its own per test.
        profile = f"{PROFILE}-{uuid.uuid4().hex[:8]}"
        iam.create_role(RoleName=profile, AssumeRolePolicyDocument=json.dumps(TRUST_EC2))
        iam.create_instance_profile(InstanceProfileName=profile)
        iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
        image = next(
            i
            for i in boto3.client("ec2").describe_images(Owners=["amazon"])["Images"]
            if i.get("Architecture") == "x86_64" and i.get("RootDeviceName")
        )
        imds = ImdsStandIn("127.0.0.4", role=profile)
        imds.__enter__()
        node_env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }
        for key, value in {
            "TRAINCTL_STORE": f"s3://{bucket}/store",
            "TRAINCTL_NODE_ENVIRONMENT": json.dumps(node_env),
            "TRAINCTL_SSH_USER": "root",
            "TRAINCTL_AWS_NODE_PYTHON": sys.executable,
            "TRAINCTL_AWS_SSH_CIDR": "127.0.0.1/32",
            "TRAINCTL_IMDS_POLL_SECONDS": "0.5",
            # moto has no placement-group API (2-node jobs ask for a cluster placement group;
            # tests/unit/test_aws_provider.py covers it with an in-test stand-in).
            "TRAINCTL_AWS_CLUSTER_PLACEMENT_GROUP": "false",
            # An orphaned EC2 node halts itself; the stand-in hosts are this machine.
            "TRAINCTL_POWEROFF_WHEN_ORPHANED": "false",
        }.items():
            monkeypatch.setenv(key, value)
        c = Cloud(monkeypatch, endpoint, bucket, imds, hosts)
        c.image_id, c.profile = image["ImageId"], profile
        c.machines = TerminationEndsProcesses(boto3.client("ec2"), c.hosts)
        c.machines.start()
        yield c
    finally:
        if c is not None and c.machines is not None:
            c.machines.stop()
        if imds is not None:
            imds.__exit__(None, None, None)
        server.stop()


class TerminationEndsProcesses(threading.Thread):
    """What EC2 does and the stand-ins cannot: a terminated instance's processes end with
    it. Whenever moto says an instance of a job is shutting down or terminated, the
    processes of that job on the stand-in host of the instance's rank are killed, and again
    at each look for KILL_WINDOW seconds (an agent whose start over SSH raced the
    termination appears after it).

    It looks every 0.3 s at the instances' states only; the full descriptions (for the tags)
    of newly ended ones alone. moto keeps every instance the worker process ever ran: a full
    describe of all ended instances grew with each test to ~0.15 CPU-s a look at 40."""

    KILL_WINDOW = 20.0

    def __init__(self, ec2, hosts) -> None:
        super().__init__(name="ec2-termination", daemon=True)
        self.ec2, self.hosts = ec2, hosts
        self._done = threading.Event()
        # instance id -> when this rig first saw it ended; those of earlier tests: long ago
        self._ended_since = dict.fromkeys(self._ended_instances(), float("-inf"))

    def run(self) -> None:
        while not self._done.wait(0.3):
            try:
                self.end_terminated()
            except Exception:  # the moto server is stopping: nothing more to emulate
                pass

    def _ended_instances(self) -> list[str]:
        gone = [{"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]}]
        statuses = self.ec2.describe_instance_status(IncludeAllInstances=True, Filters=gone)
        return [s["InstanceId"] for s in statuses["InstanceStatuses"]]

    def end_terminated(self) -> None:
        now = time.monotonic()
        recent = [
            i
            for i in self._ended_instances()
            if now - self._ended_since.setdefault(i, now) < self.KILL_WINDOW
        ]
        if not recent:
            return
        reservations = self.ec2.describe_instances(InstanceIds=recent)["Reservations"]
        for instance in (i for r in reservations for i in r["Instances"]):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            job, rank = tags.get("trainctl:job"), tags.get("trainctl:rank", "")
            if job and rank.isdigit() and int(rank) < len(self.hosts):
                home = str(self.hosts[int(rank)].home)
                attempt = tags.get("trainctl:attempt")
                wanted = {b"HOME": home.encode(), ATTEMPT_TAG.encode(): (attempt or "").encode()}
                kill_all(
                    [pid for pid in job_processes(job) if wanted.items() <= _environ(pid).items()]
                )

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def refuse_capacity(
    monkeypatch, refuse: Callable[[dict[str, Any], dict[str, str]], bool]
) -> list[dict[str, Any]]:
    """EC2 answers RunInstances with InsufficientInstanceCapacity where `refuse(params,
    tags)` says so: a botocore hook on the provider's sessions, the one part AWS itself would
    play. Returns the refused requests' parameters, filled as they come."""
    import botocore.exceptions

    from trainctl.provisioning.aws import clients

    refused: list[dict[str, Any]] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        specs = params.get("TagSpecifications", [])
        tags = {t["Key"]: t["Value"] for spec in specs for t in spec["Tags"]}
        if refuse(params, tags):
            refused.append(params)
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none left"}},
                "RunInstances",
            )

    plain = clients.default_session

    def session(region):
        made = plain(region)
        made.events.register("provide-client-params.ec2.RunInstances", hook)
        return made

    monkeypatch.setattr(clients, "default_session", session)
    return refused


def ec2_fields(cloud) -> dict:
    """The Estimator fields that put a job on the cloud's EC2, its data in its S3."""
    return {
        "instance_type": INSTANCE_TYPE,
        "region": REGION,
        "instance_profile": cloud.profile,
        "image_id": cloud.image_id,
        "checkpoint_s3_uri": f"s3://{cloud.bucket}/checkpoints",
        "output_path": f"s3://{cloud.bucket}/models",
    }


def ec2_digits(cloud, **kwargs) -> Estimator:
    return digits_estimator(HPS, **{**ec2_fields(cloud), **kwargs})


def job_resources(ec2, job: str) -> dict[str, list[str]]:
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
