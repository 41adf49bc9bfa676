"""Scripts written the way SageMaker's examples and its training toolkit's tests write them
(tests/fixtures/sagemaker/, our own code in their style) run unchanged on 2 local nodes; the
classic SM_HOSTS process-group pattern also on 2 sshd hosts and on stand-in EC2 instances
(containers: tests/providers/test_container_run.py). A script that hangs fails with a named reason
within the configured time, instead of hanging silently.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time

import pytest

from tests.helpers import FIXTURES, free_port
from tests.rigs.cloud import cloud
from trainctl import Estimator
from trainctl.estimator import JobFailedError

pytestmark = pytest.mark.e2e
SOURCE = FIXTURES / "sagemaker"
__all__ = ["cloud"]  # the fixture


def sm_estimator(entry_point: str, **fields) -> Estimator:
    base = {"entry_point": entry_point, "source_dir": str(SOURCE), "instance_count": 2}
    return Estimator(**{**base, **fields})


def model_files(job) -> dict[str, bytes]:
    from trainctl.store import open_store

    base, _, key = job.describe()["model_data"].rpartition("/")  # output_path or the store
    data = open_store(base).get_bytes(key)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar if m.isfile()}


def output_files(job) -> dict[str, bytes]:
    data = job.store.get_bytes(f"jobs/{job.name}/output/output.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar if m.isfile()}


def check_sm_hosts_job(job) -> None:
    """The SM_HOSTS script formed its process group: the leader wrote the all_reduce sum."""
    assert job.describe()["state"] == "Completed"
    leader = json.loads(model_files(job)["leader.json"])
    assert leader["sum"] == 3.0  # 1 + 2
    assert leader["leader"] == leader["hosts"][0]
    assert len(set(leader["hosts"])) == 2


def test_sm_hosts_process_group_on_two_local_nodes(home):
    job = sm_estimator("sm_hosts_pg.py", hyperparameters={"port": free_port()}).fit(logs=False)
    check_sm_hosts_job(job)


def test_sm_hosts_process_group_on_two_ssh_hosts(home, sshd):
    hosts = [server.host().model_dump() for server in sshd.servers[:2]]
    est = sm_estimator(
        "sm_hosts_pg.py", instance_type="ssh", hosts=hosts, hyperparameters={"port": free_port()}
    )
    job = est.fit(logs=False)
    check_sm_hosts_job(job)
    leader = json.loads(model_files(job)["leader.json"])
    assert leader["hosts"] == ["127.0.0.2", "127.0.0.3"]


def test_old_sm_env_only_script_on_two_local_nodes(home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.csv", "b.csv"):
        (data / name).write_text("1,2\n")
    est = sm_estimator("sm_legacy.py", hyperparameters={"epochs": 3, "optimizer": "adam"})
    job = est.fit({"training": f"file://{data}"}, logs=False)
    assert job.describe()["state"] == "Completed"
    outputs = output_files(job)
    reports = [json.loads(v) for k, v in outputs.items() if "report-" in k]
    assert len(reports) >= 1
    report = reports[0]
    assert report["hps"] == {"epochs": 3, "optimizer": "adam"}
    assert report["files"] == ["a.csv", "b.csv"]
    assert report["num_gpus"] == 0 and report["num_cpus"] >= 1
    assert report["defaults"] == {"optimizer": "sgd", "momentum": 0.9}
    assert report["training_env_hosts"] == report["hosts"]
    assert json.loads(model_files(job)["defaults.json"]) == report["defaults"]


def test_parse_known_args_with_underscored_hyperparameters(home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")
    est = sm_estimator(
        "known_args.py",
        hyperparameters={"learning_rate": 0.5, "batch_size": 16, "extra_flag": "yes"},
    )
    job = est.fit(f"file://{data}", logs=False)
    assert job.describe()["state"] == "Completed"
    files = model_files(job)
    seen = [json.loads(v) for k, v in files.items() if k.startswith("args-")]
    assert seen, files.keys()
    for args in seen:
        assert args["learning_rate"] == 0.5 and args["batch_size"] == 16
        assert args["unknown"] == ["--extra_flag", "yes"]
        assert args["train"] == ["x.txt"] and args["num_gpus"] == 0


def test_torchrun_script_gets_every_torchelastic_variable(home, monkeypatch):
    """...and its share of the cores: 2 local nodes on this machine, one worker each."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    est = sm_estimator(
        "elastic_env.py", distribution={"torch_distributed": {"enabled": True}}, max_restarts=0
    )
    job = est.fit(logs=False)
    assert job.describe()["state"] == "Completed"
    env = json.loads(model_files(job)["elastic-0.json"])  # rank 0's model is uploaded
    assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "2"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["ROLE_WORLD_SIZE"] == "2"
    assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "rank 1 group 1 restarts 0" in node1  # every variable was there on node 1 too


def test_a_hang_fails_with_a_named_reason_within_the_timeout(home, monkeypatch):
    monkeypatch.setenv("TRAINCTL_STARTUP_TIMEOUT_SECONDS", "6")
    started = time.monotonic()
    with pytest.raises(JobFailedError) as failed:
        sm_estimator("hang.py").fit(logs=False)
    elapsed = time.monotonic() - started
    info = failed.value.job.describe()
    reason = info["failure_reason"]
    assert info["state"] == "Failed"
    assert "no progress for" in reason and "before its first step" in reason
    assert "name resolution: nowhere-host does not resolve" in reason, reason
    assert elapsed < 60, elapsed
    events = [e["type"] for e in failed.value.job.events()]
    assert "hung" in events


def test_sm_hosts_process_group_on_stand_in_ec2_instances(cloud):
    from tests.rigs.cloud import ec2_fields

    est = sm_estimator("sm_hosts_pg.py", hyperparameters={"port": free_port()}, **ec2_fields(cloud))
    job = est.fit(logs=False)
    check_sm_hosts_job(job)
    leader = json.loads(model_files(job)["leader.json"])
    assert leader["hosts"] == [h.address for h in cloud.hosts]  # their private addresses
