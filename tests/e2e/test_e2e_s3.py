"""A whole job with its store in S3: a real moto server on loopback, real boto3/s3transfer."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.helpers import EXAMPLES, log_lines
from tests.rigs.faulty_s3 import moto_s3
from trainctl import Estimator

pytestmark = pytest.mark.e2e


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on 127.0.0.1 and the environment that points boto3 (and nodes) at it."""
    with moto_s3(monkeypatch) as (client, bucket, _):
        yield client, bucket


def test_job_with_s3_store_inputs_and_outputs(home, s3, source, monkeypatch):
    s3, bucket = s3
    monkeypatch.setenv("TRAINCTL_STORE", f"s3://{bucket}/store")
    s3.put_object(Bucket=bucket, Key="data/train/rows.csv", Body=b"4,5,6\n")
    s3.put_object(Bucket=bucket, Key="data/train/sub/more.csv", Body=b"7\n")
    est = Estimator(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_count=2,
        output_path=f"s3://{bucket}/models",
    )
    job = est.fit(inputs={"train": f"s3://{bucket}/data/train"}, logs=False)
    info = job.describe()
    assert info["state"] == "Completed"
    assert info["model_data"] == f"s3://{bucket}/models/{job.name}/output/model.tar.gz"
    assert info["store"] == f"s3://{bucket}/store/jobs/{job.name}"

    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    prefix = f"store/jobs/{job.name}"
    assert {f"{prefix}/job.json", f"{prefix}/events.jsonl"} <= keys
    assert {f"{prefix}/logs/attempt-1/node-0.log", f"{prefix}/logs/attempt-1/node-1.log"} <= keys
    assert any(k.startswith("store/sources/") for k in keys)
    head = s3.head_object(Bucket=bucket, Key=f"{prefix}/job.json")
    assert head["ServerSideEncryption"] == "AES256"

    body = s3.get_object(Bucket=bucket, Key=f"models/{job.name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(body["Body"].read()), mode="r:gz") as tar:
        assert tar.getnames() == ["weights.txt"]

    # both nodes downloaded the channel
    log = s3.get_object(Bucket=bucket, Key=f"{prefix}/logs/attempt-1/node-1.log")
    probe = next(
        json.loads(line[6:])
        for line in log_lines(log["Body"].read().decode())
        if line.startswith("PROBE ")
    )
    assert probe["channels"]["train"] == ["rows.csv", "sub/more.csv"]
    assert probe["channels"]["train:rows.csv"] == "4,5,6\n"


def test_cli_browses_s3_store(home, s3, monkeypatch):
    s3, bucket = s3
    import os
    import subprocess

    from tests.helpers import TRAINCTL

    monkeypatch.setenv("TRAINCTL_STORE", f"s3://{bucket}/store")
    job = Estimator(
        entry_point="train.py",
        source_dir=str(EXAMPLES / "digits"),
        hyperparameters={"epochs": 1},
        job_name="s3-digits",
    ).fit(logs=False)
    assert job.describe()["state"] == "Completed"

    def run(*args):
        return subprocess.run(
            [TRAINCTL, *args], capture_output=True, text=True, timeout=60, env=os.environ.copy()
        )

    tree = run("artifacts", "s3-digits")
    assert tree.returncode == 0, tree.stderr
    assert f"s3://{bucket}/store/jobs/s3-digits" in tree.stdout
    assert "model.tar.gz" in tree.stdout and "node-0.log" in tree.stdout
    listing = run("ls", f"s3://{bucket}/store/jobs/s3-digits/output")
    names = [line.split()[-1] for line in listing.stdout.splitlines()]
    assert "model.tar.gz" in names, listing.stdout
    one = run("ls", "-h", f"s3://{bucket}/store/jobs/s3-digits/output/model.tar.gz")
    assert one.returncode == 0 and one.stdout.split()[-1] == "model.tar.gz", one
    everything = run("ls", "-r", f"s3://{bucket}/store/jobs/s3-digits")
    assert f"s3://{bucket}/store/jobs/s3-digits/output/model.tar.gz" in everything.stdout
    missing = run("ls", f"s3://{bucket}/store/jobs/no-such-job")
    assert missing.returncode == 1 and missing.stderr.startswith("error: nothing at s3://")
    logs = run("logs", "s3-digits")
    assert "test_accuracy=" in logs.stdout
    jobs = json.loads(run("jobs", "-o", "json").stdout)
    assert [j["name"] for j in jobs] == ["s3-digits"]


@pytest.mark.timeout(60)
def test_s3_locations_that_cannot_be_read_fail_at_submit_and_make_nothing(
    home, s3, source, monkeypatch
):
    """Before anything is made: an input with no object, an input or output that the user's
    credentials cannot reach, an unreachable S3 store: one line naming the field, exit 2."""
    import subprocess

    from tests.helpers import TRAINCTL
    from trainctl.errors import SpecError

    client, bucket = s3
    client.put_object(Bucket=bucket, Key="data/one.csv", Body=b"1\n")
    probe = {"entry_point": "probe.py", "source_dir": str(source("probe"))}
    with pytest.raises(SpecError, match=r"inputs\.train: .*/data/missing holds no object"):
        Estimator(**probe).fit(inputs={"train": f"s3://{bucket}/data/missing"}, logs=False)
    # one object, named by its own URI, is an input too
    plan = Estimator(**probe).fit(inputs={"train": f"s3://{bucket}/data/one.csv"}, dry_run=True)
    assert plan["nodes"]
    assert not (home / "store" / "jobs").exists() or not any((home / "store" / "jobs").iterdir())

    # No credentials at all (no keys, no profile, no instance metadata): the probe says so.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for field, args in [
        ("inputs.train", ["--inputs", f"train=s3://{bucket}/data"]),
        ("output_path", ["--output-path", f"s3://{bucket}/models"]),
    ]:
        done = subprocess.run(
            [TRAINCTL, "submit", "probe.py", "--source-dir", probe["source_dir"], *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"error: {field}: s3://{bucket}/"), line
        assert "cannot be reached with your credentials" in line and "NoCredentials" in line
    monkeypatch.setenv("TRAINCTL_STORE", f"s3://{bucket}/store")
    done = subprocess.run(
        [TRAINCTL, "submit", "probe.py", "--source-dir", probe["source_dir"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "error: TRAINCTL_STORE: " in done.stderr, done
    assert not (home / "store").exists()
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="store/")
