"""A controller that does not live on the laptop: `controller=` an SSH host (a real sshd on
loopback), the store in S3 (a moto server). The submitting process exits right after
submit; the controller service on the host runs the job; any process that reads the store
follows it; and when the controller's host dies, the laptop takes the job over.

The host reaches S3 with credentials of its own (its ~/.aws/credentials); the submitter's
secret must never reach it: not in a process environment there, not in a file there.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid

import pytest

from tests.helpers import EXAMPLES, TRAINCTL, free_port, log_lines, point_aws_at
from tests.rigs.sshd import _environ, job_processes, kill_all, processes_with_env
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys
from trainctl.record.locations import checkpoint_store

pytestmark = pytest.mark.e2e

SUBMITTER_SECRET = "submitter-secret-never-on-the-controller-host"
HOST_SECRET = "the-controller-hosts-own-secret"
HPS = {"epochs": 4, "lr": 0.1, "seed": 0, "checkpoint-every": 10}
POOL = "ctl"


@pytest.fixture
def remote(home, sshd, monkeypatch):
    """moto S3 as the store + sshd host 127.0.0.2 as the controller host (pool `ctl`)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    point_aws_at(monkeypatch, endpoint, key="AKIASUBMITTER0000000", secret=SUBMITTER_SECRET)
    bucket = f"trainctl-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)

    host = sshd.servers[0]
    aws = host.home / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIACONTROLLERHOST00\n"
        f"aws_secret_access_key = {HOST_SECRET}\n"
    )
    home.mkdir(parents=True, exist_ok=True)
    entry = host.host()
    (home / "config.yaml").write_text(
        "pools:\n"
        f"  {POOL}:\n"
        "    provider: ssh\n"
        "    hosts:\n"
        f"      - {{address: '{entry.address}', port: {entry.port}, "
        f"key_file: '{entry.key_file}', python: '{entry.python}'}}\n"
        "  nowhere:\n"
        "    provider: ssh\n"
        "    hosts:\n"
        f"      - {{address: '127.0.0.9', port: {free_port('127.0.0.9')}, "
        f"key_file: '{entry.key_file}', python: '{entry.python}'}}\n"
    )
    for key, value in {
        "TRAINCTL_STORE": f"s3://{bucket}/store",
        "TRAINCTL_NODE_ENVIRONMENT": json.dumps(
            {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        ),
        "TRAINCTL_CONTROLLER_IDLE_SECONDS": "3",
        "TRAINCTL_HEARTBEAT_SECONDS": "1",
        "TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS": "8",
        "TRAINCTL_LEASE_SECONDS": "6",
    }.items():
        monkeypatch.setenv(key, value)

    class Remote:
        pass

    r = Remote()
    r.host, r.bucket, r.endpoint = host, bucket, endpoint
    try:
        yield r
    finally:
        server.stop()


def _store():
    from trainctl.store import default_store

    return default_store()


def _service_pids(host) -> list[int]:
    return [
        pid
        for pid in processes_with_env("HOME", str(host.home))
        if b"serve" in _cmdline(pid) and b"trainctl.controller" in _cmdline(pid)
    ]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _submit_argv(*extra: str) -> list[str]:
    argv = [TRAINCTL, "submit", "train.py", "--source-dir", str(EXAMPLES / "digits")]
    argv += ["--instance-count", "2", "--distribution", "torch_distributed"]
    for key, value in HPS.items():
        argv += ["-p", f"{key}={value}"]
    return [*argv, *extra]


def test_submitter_exits_and_the_remote_controller_runs_the_job(remote):
    start = time.monotonic()
    submitted = subprocess.run(
        _submit_argv("--controller", POOL, "--detach"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr
    name = submitted.stdout.strip()
    submit_seconds = time.monotonic() - start

    # The submitter is gone; the job's lease is held by the service on the host.
    jobs = JobStore(_store(), name)
    holder = jobs.read_lease()
    service = _service_pids(remote.host)
    assert service, "no controller service runs on the host"
    assert holder["pid"] in service, (holder, service)

    # Meanwhile nothing of the submitter's secret is in any process there.
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in processes_with_env("HOME", str(remote.host.home)):
                env = _environ(pid)
                if any(SUBMITTER_SECRET.encode() in v for v in env.values()):
                    seen.append(f"pid {pid}")
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    followed = subprocess.run(
        [TRAINCTL, "logs", name, "-f"], capture_output=True, text=True, timeout=240
    )
    done.set()
    watcher.join(timeout=5)
    assert followed.returncode == 0, followed.stderr

    record = jobs.load()
    assert record.state.value == "Completed", record.failure_reason
    assert len(record.attempts) == 1
    store = _store()
    assert store.exists(f"{JobKeys(name).output}/model.tar.gz")
    # `logs -f` from another process printed every line of every node once.
    printed = followed.stdout.splitlines()
    for rank in (0, 1):
        text = store.get_text(f"{JobKeys(name).prefix}/logs/attempt-1/node-{rank}.log")
        lines = [ln for ln in log_lines(text) if "@@trainctl@@" not in ln]
        assert lines, f"node {rank} logged nothing"
        ours = [ln for ln in printed if ln.startswith(f"[algo-{rank + 1}] ")]
        assert ours == [f"[algo-{rank + 1}] {ln}" for ln in lines]
    events = [e["type"] for e in jobs.events()]
    assert "controller_assigned" in events

    # The service goes away when idle; the submitter's secret never reached the host.
    _wait(lambda: not _service_pids(remote.host), 30, "the idle service to exit")
    assert not seen, f"the submitter's secret was in the environment of {seen}"
    for path in remote.host.home.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert SUBMITTER_SECRET.encode() not in path.read_bytes(), path
    print(f"submit --controller {POOL} --detach returned in {submit_seconds:.1f} s")


def test_laptop_takes_over_when_the_controller_host_dies(remote):
    from tests.helpers import digits_estimator
    from trainctl.estimator import TrainingJob

    est = digits_estimator({**HPS, "epochs": 6, "step-delay": 0.05}, controller=POOL)
    job = est.fit(wait=False)
    jobs = JobStore(job.store, job.name)

    def progressed():
        # The script said it saved, and its sync put the save in the store: the record
        # counts a checkpoint when the script says so, before the upload ends (a host
        # killed in between leaves nothing to resume from, as CI once saw).
        record = jobs.load()
        said = record.attempts and (record.attempts[-1].last_checkpoint_step or 0) > 0
        return said and any(True for _ in checkpoint_store(record).list(""))

    _wait(progressed, 120, "a checkpoint on the remote-controlled job")
    # The host dies: its sshd, its controller service and the nodes it ran.
    remote.host.stop()
    kill_all(processes_with_env("HOME", str(remote.host.home)))

    described = TrainingJob.attach(job.name).wait(timeout=240)
    assert described["state"] == "Completed"
    record = jobs.load()
    assert record.attempts[0].cause == "controller lost", record.attempts[0]
    assert record.attempts[1].resumed_from_step, record.attempts[1]
    types = [e["type"] for e in jobs.events()]
    assert "takeover" in types


@pytest.mark.parametrize(
    ("controller", "store", "expected"),
    [
        ("ftp://x", None, "controller: 'ftp://x' is not a controller: use 'local', 'ec2'"),
        ("nope", None, "controller: no pool named 'nope' (pools: ctl, nowhere)"),
        ("ec2", "file", "controller: 'ec2' runs the controller on an EC2 instance"),
        ("nowhere", None, "controller: nowhere: "),
    ],
)
def test_bad_controller_fails_before_anything_is_made(
    remote, controller, store, expected, tmp_path
):
    env = dict(os.environ)
    if store == "file":
        env["TRAINCTL_STORE"] = f"file://{tmp_path / 'store'}"
    result = subprocess.run(
        _submit_argv("--controller", controller, "--detach"),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert SUBMITTER_SECRET not in result.stderr
    assert not list(_store().list("")), "something was written to the store"


def test_stop_from_another_process_reaches_the_remote_controller(remote):
    from tests.helpers import digits_estimator

    est = digits_estimator({**HPS, "epochs": 50, "step-delay": 0.05}, controller=POOL)
    job = est.fit(wait=False)
    jobs = JobStore(job.store, job.name)
    _wait(lambda: jobs.load().state.value == "Training", 90, "the job to train")
    stopped = subprocess.run(
        [TRAINCTL, "stop", job.name], capture_output=True, text=True, timeout=120
    )
    assert stopped.returncode == 0, stopped.stderr
    record = jobs.load()
    assert record.state.value == "Stopped", record.state
    assert record.stop_reason == "stopped by the user"
    # Its nodes on the controller host are gone, and so, once idle, is the service.
    _wait(lambda: not job_processes(job.name), 30, "the job's nodes to end")
    _wait(lambda: not _service_pids(remote.host), 60, "the idle service to exit")
