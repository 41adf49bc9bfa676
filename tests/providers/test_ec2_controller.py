"""`controller="ec2"`: trainctl launches its own small controller instance, which runs the
job and terminates itself when idle; gc then finds what it left (its security group and key
pair). Every part real but AWS: moto on loopback, a third sshd server standing in for the
controller instance (`controller_ssh_address_override`), the two of tests/cloud.py for the
nodes, and the IMDS stand-in giving the controller its instance-profile credentials.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.helpers import TRAINCTL
from tests.rigs.cloud import TRUST_EC2, USER_SECRET, cloud, ec2_digits, job_resources
from tests.rigs.sshd import _environ, processes_with_env
from trainctl.provisioning.aws.keys import default_key_path, ensure_key
from trainctl.record.jobstore import JobStore

pytestmark = pytest.mark.e2e
__all__ = ["cloud"]


@pytest.fixture
def controller_host(cloud, sshd, monkeypatch):
    """127.0.0.5 stands in for the controller instance: it accepts trainctl's key (as EC2
    installs the key pair), and its own trainctl key is accepted by the node stand-ins (as
    EC2 installs the controller's key pair on the nodes it launches)."""
    import boto3

    host = sshd.start("127.0.0.5")
    laptop_key = ensure_key(default_key_path())
    authorized = host.root / "authorized_keys"
    authorized.write_text(authorized.read_text() + laptop_key.strip() + "\n")
    relative = default_key_path().relative_to(default_key_path().parents[1])
    controller_key = ensure_key(host.home / ".trainctl" / relative)
    for node in cloud.hosts:
        keys = node.root / "authorized_keys"
        keys.write_text(keys.read_text() + controller_key.strip() + "\n")

    profile = f"trainctl-controller-{uuid.uuid4().hex[:8]}"
    iam = boto3.client("iam")
    iam.create_role(RoleName=profile, AssumeRolePolicyDocument=json.dumps(TRUST_EC2))
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
    for key, value in {
        "TRAINCTL_CONTROLLER_INSTANCE_PROFILE": profile,
        "TRAINCTL_CONTROLLER_IMAGE": cloud.image_id,
        "TRAINCTL_CONTROLLER_SSH_ADDRESS_OVERRIDE": f"{host.address}:{host.port}",
        "TRAINCTL_CONTROLLER_PYTHON": sys.executable,
        "TRAINCTL_CONTROLLER_IDLE_SECONDS": "3",
    }.items():
        monkeypatch.setenv(key, value)
    return host


def _controller_instances(ec2, states):
    filters = [
        {"Name": "tag:trainctl:role", "Values": ["controller"]},
        {"Name": "instance-state-name", "Values": states},
    ]
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def test_ec2_controller_runs_the_job_and_ends_itself(cloud, controller_host):
    from trainctl.estimator import TrainingJob

    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:  # the submitter's secret in no process of the controller "instance"
        while not done.is_set():
            for pid in processes_with_env("HOME", str(controller_host.home)):
                if any(USER_SECRET.encode() in v for v in _environ(pid).values()):
                    seen.append(str(pid))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        job = ec2_digits(cloud, controller="ec2").fit(wait=False)
        jobs = JobStore(job.store, job.name)
        launched = [e for e in jobs.events() if e["type"] == "controller_instance"]
        assert len(launched) == 1 and launched[0]["launched"] is True
        instance_id = launched[0]["instance_id"]
        holder = jobs.read_lease()
        assert holder["pid"] in processes_with_env("HOME", str(controller_host.home))

        described = TrainingJob.attach(job.name).wait(timeout=300)
        assert described["state"] == "Completed"
        assert len(jobs.load().attempts) == 1  # run by the controller, not taken over
        assert job_resources(cloud.ec2, job.name) == {
            "instances": [],
            "security_groups": [],
            "key_pairs": [],
        }

        # Idle: the service ends and terminates its own instance.
        deadline = time.monotonic() + 60
        while _controller_instances(cloud.ec2, ["pending", "running"]):
            assert time.monotonic() < deadline, "the idle controller instance is still running"
            time.sleep(0.5)
        ended = _controller_instances(cloud.ec2, ["shutting-down", "terminated"])
        assert [i["InstanceId"] for i in ended] == [instance_id]
    finally:
        done.set()
        watcher.join(timeout=5)
    assert not seen, f"the submitter's secret was in the environment of {seen}"
    for path in controller_host.home.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert USER_SECRET.encode() not in path.read_bytes(), path

    # gc knows the controller: its security group and key pair are leftovers now.
    listed = subprocess.run(
        [TRAINCTL, "gc", "--region", "us-east-1", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)["found"]
    kinds = sorted(i["kind"] for i in found if i["job"].startswith("controller-ec2-"))
    assert kinds == ["key-pair", "security-group"], found


def test_ec2_controller_needs_its_instance_profile(cloud, controller_host, monkeypatch):
    monkeypatch.setenv("TRAINCTL_CONTROLLER_INSTANCE_PROFILE", "no-such-profile")
    from trainctl.errors import SpecError

    with pytest.raises(SpecError, match="controller: 'ec2': the controller's instance profile"):
        ec2_digits(cloud, controller="ec2").fit(wait=False)
    assert not _controller_instances(cloud.ec2, ["pending", "running"])
    from trainctl.store import default_store

    assert not list(default_store().list("jobs/")), "a job was recorded"
