"""Warm capacity (`keep_alive_period_in_seconds`) on EC2, end to end with no cloud: moto for
EC2 and S3, the sshd stand-ins for the instances (tests/cloud.py).

A job that keeps its instances warm hands them to a pool; the next job with the same
capacity spec starts on them with no new instance, one with another spec does not; a pool
that lost a member to a spot reclaim is released and the job launches anew; an expired pool
is released by `trainctl gc`, any pool by `trainctl warm --release`; the warm time is billed
to the job that left the instances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.rigs.cloud import HPS, cloud, ec2_digits, job_resources
from trainctl.record.jobstore import JobStore

pytestmark = pytest.mark.e2e
__all__ = ["cloud"]  # the fixture, used by every test here

SHORT = {**HPS, "epochs": 1}
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def _instances(ec2, state: str | None = None) -> dict[str, dict]:
    filters = [{"Name": "instance-state-name", "Values": [state]}] if state else []
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return {i["InstanceId"]: i for r in reservations for i in r["Instances"]}


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def _fit(cloud, name: str, **fields):
    job = ec2_digits(cloud, job_name=name, hyperparameters=SHORT, **fields).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    return job, info


def _trainctl(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [TRAINCTL, *args], capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )
    assert done.returncode == 0, done.stderr
    return done


def _job_record(job):
    return JobStore(job.store, job.name).load()


@pytest.mark.timeout(300)
def test_same_spec_reuses_warm_instances_another_spec_does_not(cloud):
    first_name = f"warm-a-{uuid.uuid4().hex[:6]}"
    first, _ = _fit(cloud, first_name, keep_alive_period_in_seconds=600)
    pool = f"warm.{first_name}"
    kept = {
        i: x
        for i, x in _instances(cloud.ec2, "running").items()
        if _tags(x)["trainctl:job"] == pool
    }
    assert len(kept) == 2, "the job's instances were not kept warm"
    # The job itself holds nothing any more: its groups went to the pool with the instances.
    assert job_resources(cloud.ec2, first_name)["instances"] == []
    assert job_resources(cloud.ec2, pool)["security_groups"]
    events = [
        json.loads(line)
        for line in first.store.get_text(f"jobs/{first_name}/events.jsonl").splitlines()
    ]
    assert any(e.get("type") == "kept_warm" for e in events)

    listed = json.loads(_trainctl("warm", "-o", "json").stdout)["pools"]
    assert [(p["pool"], p["count"], p["state"]) for p in listed] == [(pool, 2, "warm")]
    assert listed[0]["from_job"] == first_name and listed[0]["expires_in_seconds"] > 500

    # The dry run of a job with the same capacity spec says it would reuse them.
    plan = ec2_digits(cloud, job_name="warm-plan", hyperparameters=SHORT).fit(dry_run=True)
    assert plan["capacity"].startswith(f"reuses warm pool {pool}"), plan["capacity"]
    assert all(i in plan["capacity"] for i in kept)

    before = set(_instances(cloud.ec2))
    second_name = f"warm-b-{uuid.uuid4().hex[:6]}"
    second, info = _fit(cloud, second_name, keep_alive_period_in_seconds=600)
    assert set(_instances(cloud.ec2)) == before, "a new instance was launched (RunInstances)"
    assert {i["instance_id"] for i in info["instances"] if not i["warm"]} == set(kept)
    # Where its start-up went, per stage: no capacity wait, no agent upload on warm hosts.
    startup = info["attempts"][0]["startup"]
    assert {"capacity", "ssh", "agent", "code", "venv", "launch", "to_first_step"} <= set(startup)
    log = second.store.get_text(f"jobs/{second_name}/logs/attempt-1/node-0.log")
    assert "test_accuracy=" in log
    events = second.store.get_text(f"jobs/{second_name}/events.jsonl")
    assert f'"from_job": "{first_name}"' in events
    # The first job is billed for the time its instances waited, warm.
    warm_rows = [c for c in _job_record(first).instances if c.warm]
    assert {c.instance_id for c in warm_rows} == set(kept)
    assert all(c.seconds >= 0 for c in warm_rows)
    # They are the second job's warm pool now.
    pool2 = f"warm.{second_name}"
    assert {
        i for i, x in _instances(cloud.ec2, "running").items() if _tags(x)["trainctl:job"] == pool2
    } == set(kept)

    # Another capacity spec (a bigger root volume) does not take them: new instances.
    third_name = f"warm-c-{uuid.uuid4().hex[:6]}"
    _, info = _fit(cloud, third_name, volume_size=300)
    third_ids = {i["instance_id"] for i in info["instances"]}
    assert len(third_ids) == 2 and not third_ids & set(kept)
    assert set(_instances(cloud.ec2, "running")) == set(kept), "the pool was touched"

    # `trainctl warm --release` ends the pool now: instances, groups, key pair.
    done = _trainctl("warm", "--release", pool2)
    assert pool2 in done.stdout and "released" in done.stdout
    assert not _instances(cloud.ec2, "running")
    assert job_resources(cloud.ec2, pool2) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }
    assert {c.instance_id for c in _job_record(second).instances if c.warm} == set(kept)
    assert "no warm capacity" in _trainctl("warm").stdout


@pytest.mark.timeout(300)
def test_a_reclaimed_warm_instance_breaks_its_pool_and_gc_ends_expired_ones(cloud):
    first_name = f"warm-s-{uuid.uuid4().hex[:6]}"
    _fit(cloud, first_name, keep_alive_period_in_seconds=600, use_spot_instances=True)
    pool = f"warm.{first_name}"
    kept = sorted(
        i for i, x in _instances(cloud.ec2, "running").items() if _tags(x)["trainctl:job"] == pool
    )
    assert len(kept) == 2
    # EC2 reclaims one warm spot instance: the pool cannot give a whole cluster any more.
    cloud.ec2.terminate_instances(InstanceIds=[kept[1]])
    assert json.loads(_trainctl("warm", "-o", "json").stdout)["pools"][0]["state"].startswith(
        "instance(s)"
    )

    second_name = f"warm-t-{uuid.uuid4().hex[:6]}"
    _, info = _fit(cloud, second_name, keep_alive_period_in_seconds=2, use_spot_instances=True)
    ids = {i["instance_id"] for i in info["instances"] if not i["warm"]}
    assert len(ids) == 2 and not ids & set(kept), "the broken pool was used"
    assert _instances(cloud.ec2)[kept[0]]["State"]["Name"] == "terminated", (
        "the pool's survivor was kept"
    )
    assert job_resources(cloud.ec2, pool) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }

    # The second job's pool expires after 2 s; gc ends it (on EC2 it also halts itself).
    pool2 = f"warm.{second_name}"
    assert {_tags(x)["trainctl:job"] for x in _instances(cloud.ec2, "running").values()} == {pool2}
    time.sleep(2.5)
    listed = _trainctl("gc", "-o", "json")
    assert any(
        f["kind"] == "warm-pool" and f["id"] == pool2 for f in json.loads(listed.stdout)["found"]
    )
    assert _instances(cloud.ec2, "running"), "gc without --yes deleted something"
    _trainctl("gc", "--yes")
    assert not _instances(cloud.ec2, "running")
    assert job_resources(cloud.ec2, pool2) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }


@pytest.mark.timeout(300)
def test_a_tuning_jobs_next_trial_starts_on_the_warm_nodes_of_the_one_before(cloud):
    """Trials share their capacity spec: with one trial at a time, trial 0's two instances
    wait warm (the tuning job sets the keep-alive) and trial 1 starts on them with no new
    instance; trial 1, the last, keeps nothing; nothing is left running at the end. Each
    trial's start cost, and whether it was warm, is in the analytics."""
    from trainctl.tuning import ContinuousParameter, HyperparameterTuner

    tuner = HyperparameterTuner(
        ec2_digits(cloud, hyperparameters={k: v for k, v in SHORT.items() if k != "lr"}),
        objective_metric_name="test_accuracy",
        hyperparameter_ranges={"lr": ContinuousParameter(0.05, 0.2)},
        strategy="Random",
        max_jobs=2,
        max_parallel_jobs=1,
        base_tuning_job_name=f"warmtune-{uuid.uuid4().hex[:6]}",
    )
    tuner.fit(logs=False)
    assert tuner.describe()["trials"] == {"Completed": 2}, tuner.describe()
    frame = tuner.analytics().dataframe().sort_values("TrainingJobName")
    first, second = (JobStore(tuner.estimator.store(), n) for n in frame["TrainingJobName"])
    kept = {c.instance_id for c in first.load().instances if c.warm}
    assert len(kept) == 2, "trial 0's instances were not kept warm for trial 1"
    claimed = second.load()
    assert claimed.attempts[0].warm_pool == f"warm.{first.name}"
    assert {c.instance_id for c in claimed.instances if not c.warm} == kept
    assert claimed.spec.keep_alive_period_in_seconds == 0  # the last trial keeps nothing
    assert list(frame["WarmStart"]) == [False, True]
    # (on the stand-ins a cold start is nearly as quick as a warm one: moto's instances run
    # at once; docs/benchmarks.md has cold vs warm, and what a real boot adds)
    assert all(seconds > 0 for seconds in frame["StartSeconds"]), frame["StartSeconds"]
    assert not _instances(cloud.ec2, "running"), "a trial's instance was left running"
    assert "no warm capacity" in _trainctl("warm").stdout


@pytest.mark.timeout(60)
def test_only_one_of_two_claims_gets_a_pool_and_a_broken_pool_says_why(monkeypatch):
    """The pool tags on moto directly: a claim is the creation of a key pair that only one
    caller can create; a pool missing a member, or past its time, cannot be claimed."""
    import boto3
    from moto import mock_aws

    from trainctl.provisioning.aws import warm

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

        def pool_of(job: str, seconds: float) -> list[dict]:
            tags = [{"Key": "trainctl:job", "Value": job}, {"Key": "trainctl:owner", "Value": "me"}]
            made = ec2.run_instances(
                ImageId=image,
                MinCount=2,
                MaxCount=2,
                InstanceType="g5.2xlarge",
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )["Instances"]
            for rank, instance in enumerate(made):
                ec2.create_tags(
                    Resources=[instance["InstanceId"]],
                    Tags=[{"Key": "trainctl:rank", "Value": str(rank)}],
                )
            warm.park(ec2, job, made, key="k", seconds=seconds, placement_groups=False)
            return made

        made = pool_of("a", 600)
        (pool,) = warm.find_pools(ec2, "us-east-1", ["k"])
        assert pool.name == "warm.a" and pool.problem(time.time()) is None
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqKcD4rR5T3rV0t0r2V4xHhx5mJ2bWzK1Xq3XxXxXxX t"
        got = warm.claim(ec2, pool, "b", 1, public_key=key, owner="me", placement_groups=False)
        again = warm.claim(ec2, pool, "c", 1, public_key=key, owner="me", placement_groups=False)
        assert [i["InstanceId"] for i in got] == [i["InstanceId"] for i in made]
        assert again is None, "two jobs got the same pool"
        claimed = ec2.describe_instances(InstanceIds=[i["InstanceId"] for i in made])
        tags = [_tags(i) for r in claimed["Reservations"] for i in r["Instances"]]
        assert {t["trainctl:job"] for t in tags} == {"b"}
        assert not any(k.startswith("trainctl:warm") for t in tags for k in t)
        assert not warm.find_pools(ec2, "us-east-1", ["k"])

        # A member reclaimed: the pool says so and cannot be claimed.
        broken = pool_of("d", 600)
        ec2.terminate_instances(InstanceIds=[broken[0]["InstanceId"]])
        (pool,) = warm.find_pools(ec2, "us-east-1", ["k"])
        assert pool.problem(time.time()).startswith("instance(s)")
        assert (
            warm.claim(ec2, pool, "e", 1, public_key=key, owner="me", placement_groups=False)
            is None
        )
        # Past its time: expired.
        ec2.terminate_instances(InstanceIds=[broken[1]["InstanceId"]])
        pool_of("f", 0)
        (pool,) = warm.find_pools(ec2, "us-east-1", ["k"])
        assert pool.problem(time.time()) == "expired"
