"""The `trainctl` command end to end, as a user runs it (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, TRAINCTL

pytestmark = pytest.mark.e2e


def trainctl(*args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [TRAINCTL, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def job_state(name: str) -> dict:
    return json.loads(trainctl("status", name, "-o", "json", check=True).stdout)


def wait_state(name: str, states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    info: dict = {}
    while time.monotonic() < deadline:
        proc = trainctl("status", name, "-o", "json")
        if proc.returncode == 0:  # the job may not be recorded yet
            info = json.loads(proc.stdout)
            if info["state"] in states:
                return info
        time.sleep(0.3)
    raise AssertionError(f"{name} never reached {states}: {info}")


def wait_log(home: Path, job: str, text: str, timeout: float = 90) -> None:
    """Until `text` is in one of the job's node logs in the (file) store."""
    logs = home / "store" / "jobs" / job / "logs"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in p.read_text(errors="replace") for p in logs.glob("attempt-*/node-*.log")):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in the logs of {job}")


def end(proc: subprocess.Popen) -> None:
    """Make sure a process a test started is gone (politely first: it may own a job)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sleeper_args(source, name: str) -> list[str]:
    """`submit` of a 2-node torchrun job that trains until it is stopped."""
    return [
        "submit",
        "train.py",
        "--source-dir",
        str(source("sleeper")),
        "--instance-count",
        "2",
        "--distribution",
        "torch_distributed",
        "--job-name",
        name,
    ]


@pytest.mark.smoke
def test_submit_digits_two_nodes_json(home):
    proc = trainctl(
        "submit",
        "train.py",
        "--source-dir",
        str(EXAMPLES / "digits"),
        "--instance-count",
        "2",
        "--distribution",
        "torch_distributed",
        "-p",
        "epochs=8",
        "-p",
        "lr=0.1",
        "-p",
        "seed=0",
        "--job-name",
        "digits-cli",
        "-o",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)  # stdout is only the describe dict; logs went to stderr
    assert info["name"] == "digits-cli"
    assert info["state"] == "Completed"
    assert info["model_data"].endswith("jobs/digits-cli/output/model.tar.gz")
    assert info["hyperparameters"] == {"epochs": 8, "lr": 0.1, "seed": 0}
    assert "[algo-1]" in proc.stderr and "[algo-2]" in proc.stderr
    assert "test_accuracy=" in proc.stderr

    # jobs, status, logs, artifacts, artifacts get, ls
    listing = json.loads(trainctl("jobs", "-o", "json", check=True).stdout)
    assert [j["name"] for j in listing] == ["digits-cli"]
    text = trainctl("status", "digits-cli", check=True).stdout
    assert "Completed" in text and "model.tar.gz" in text and "attempts" in text
    logs = trainctl("logs", "digits-cli", check=True).stdout
    assert "[algo-1]" in logs and "test_accuracy=" in logs and "[algo-2]" in logs
    tree = trainctl("artifacts", "digits-cli", check=True).stdout
    for name in ("model.tar.gz", "node-0.log", "node-1.log", "job.json", "events.jsonl"):
        assert name in tree
    dest = home.parent / "model.tar.gz"
    got = trainctl("artifacts", "digits-cli", "get", "output/model.tar.gz", str(dest), check=True)
    assert got.stdout.strip() == str(dest) and dest.stat().st_size > 0
    missing = trainctl("artifacts", "digits-cli", "get", "output/nope.bin")
    assert missing.returncode != 0 and "not found" in missing.stderr
    store_uri = (home / "store").resolve().as_uri()
    ls = trainctl("ls", f"{store_uri}/jobs/digits-cli/output", check=True).stdout
    assert "model.tar.gz" in ls

    # a second job with the same name is refused before anything runs
    again = trainctl(
        "submit", "train.py", "--source-dir", str(EXAMPLES / "digits"), "--job-name", "digits-cli"
    )
    assert again.returncode == 2 and "job_name" in again.stderr


@pytest.mark.smoke
def test_submit_failing_script_exits_nonzero_with_reason(home, source):
    src = source("fail")
    proc = trainctl("submit", str(src / "train.py"), "--job-name", "fails")
    assert proc.returncode == 1
    assert "ValueError: learning rate 10.0 is too large" in proc.stdout
    info = job_state("fails")
    assert info["state"] == "Failed"
    assert info["exit_code"] == 1
    status = trainctl("status", "fails").stdout
    assert "Failed" in status and "ValueError: learning rate 10.0 is too large" in status


def test_detach_logs_follow_and_stop(home, source):
    proc = trainctl(*sleeper_args(source, "sleepy"), "--detach")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "sleepy"
    wait_state("sleepy", {"Training"})
    follower = subprocess.Popen(
        [TRAINCTL, "logs", "sleepy", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for rank in (0, 1):  # (a condition, not a sleep: a slow machine is slower)
            wait_log(home, "sleepy", f"rank {rank} step")
        stopped = trainctl("stop", "sleepy")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == "sleepy: Stopped"
        out, _ = follower.communicate(timeout=30)  # -f ends by itself once the job ends
    finally:
        end(follower)
    # like attach: the verdict, and non-zero unless the job Completed
    assert follower.returncode == 1
    assert "[trainctl] job sleepy: Stopped in" in out and "stopped: stopped by the user" in out
    # (a relaunch nothing asked for would show its lines as algo-1#2: the status says why)
    assert "[algo-1] rank 0 step" in out and "[algo-2] rank 1 step" in out, (
        out,
        trainctl("status", "sleepy").stdout,
    )
    info = job_state("sleepy")
    assert info["state"] == "Stopped"
    assert info["stop_reason"] == "stopped by the user"
    # stopping an ended job is a no-op that still answers
    assert trainctl("stop", "sleepy", check=True).stdout.strip() == "sleepy: Stopped"
    as_json = json.loads(trainctl("stop", "sleepy", "-o", "json", check=True).stdout)
    assert as_json["name"] == "sleepy" and as_json["state"] == "Stopped"
    # attach to an ended job: its verdict; -o json: the record on stdout, the lines on stderr
    attached = trainctl("attach", "sleepy", "-o", "json")
    assert attached.returncode == 1 and json.loads(attached.stdout)["state"] == "Stopped"
    assert "[trainctl] job sleepy: Stopped in" in attached.stderr


def test_ctrl_c_on_attached_submit_stops_everything(home, source):
    submit = subprocess.Popen(
        [TRAINCTL, *sleeper_args(source, "interrupted")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_log(home, "interrupted", "rank 1 step 2")  # training, not just launched
        submit.send_signal(signal.SIGINT)
        out, _ = submit.communicate(timeout=60)
    finally:
        end(submit)
    assert submit.returncode == 130, out
    info = job_state("interrupted")
    assert info["state"] == "Stopped"
    assert "Ctrl-C" in info["stop_reason"]
    assert "rank 1 step" in out


def test_submit_from_job_file_with_flag_override(home, source, tmp_path):
    src = source("probe")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"entry_point: probe.py\nsource_dir: {src}\ninstance_count: 2\n"
        "hyperparameters: {lr: 0.5, epochs: 1}\nenvironment: {MY_FLAG: from-file}\n"
    )
    proc = trainctl(
        "submit",
        "-f",
        str(job_file),
        "-p",
        "lr=0.25",
        "--instance-count",
        "1",
        "--job-name",
        "from-file",
        "-o",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["instance_count"] == 1
    assert info["hyperparameters"] == {"lr": 0.25, "epochs": 1}
    assert "MY_FLAG" in proc.stderr and "from-file" in proc.stderr


@pytest.mark.smoke
def test_help_is_instant_and_lists_commands():
    start = time.monotonic()
    proc = trainctl("--help", check=True)
    elapsed = time.monotonic() - start
    for command in ("submit", "jobs", "status", "logs", "stop", "artifacts", "ls"):
        assert command in proc.stdout
    # no heavy SDK is imported for --help
    probe = subprocess.run(
        [
            str(Path(TRAINCTL).parent / "python"),
            "-c",
            "import sys; from trainctl.cli import app; "
            "print(sorted(m for m in ('torch','boto3','botocore','paramiko') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"
    assert elapsed < 10  # generous: a loaded CI machine; what matters is the import check


def test_dead_controller_nodes_shut_down_and_stop_takes_over(home, source, monkeypatch):
    """kill -9 of a detached controller: nodes end after the orphan timeout; stop records it."""
    monkeypatch.setenv("TRAINCTL_LEASE_SECONDS", "2")
    monkeypatch.setenv("TRAINCTL_ORPHAN_TIMEOUT_SECONDS", "3")
    proc = trainctl(*sleeper_args(source, "orphan"), "--detach")
    assert proc.returncode == 0, proc.stderr
    wait_state("orphan", {"Training"})
    from tests.helpers import tagged_processes, wait_no_leftovers
    from trainctl.procs import CONTROLLER_TAG, find_tagged

    controllers = find_tagged(CONTROLLER_TAG, "orphan")
    assert len(controllers) == 1
    os.kill(controllers[0], signal.SIGKILL)
    assert tagged_processes()  # the nodes outlive their controller for a while...
    assert wait_no_leftovers(timeout=30) == []  # ...then shut themselves down
    stopped = trainctl("stop", "orphan")
    assert stopped.returncode == 0, stopped.stderr
    info = job_state("orphan")
    assert info["state"] == "Stopped"
    assert "no controller" in info["stop_reason"]


def wait_for_state_copy(home: Path, job: str, rank: int, path: str, timeout: float = 120) -> None:
    """Until node `rank`'s copy of its working directory in the store lists `path`."""
    manifest = home / "store" / "jobs" / job / "workdir" / f"node-{rank}" / "manifest.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if f"code/{path}" in json.loads(manifest.read_text())["files"]:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"node {rank} of {job} never copied {path}")


@pytest.mark.timeout(240)
def test_an_unchanged_torchrun_tutorial_script_resumes_from_its_working_directory(home, source):
    """The PyTorch DDP tutorial's pattern, unchanged: positional arguments after `--`, a
    snapshot.pt that global rank 0 saves to a relative path and every worker loads at start.
    Node 2, which never saved it, is killed (no warning) once rank 0's snapshot is in the
    store: the relaunch puts rank 0's files on every node, every rank resumes from the
    snapshot, the survivor says in one line why it stopped, and each of the 4 processes'
    lines carries its rank."""
    from trainctl.cluster import ClusterInfo
    from trainctl.provisioning.local import LocalProvider
    from trainctl.record.keys import JobKeys

    name = "tutorial"
    proc = subprocess.Popen(
        [
            TRAINCTL, "submit", "multinode.py", "--source-dir", str(source("snapshot")),
            "--instance-count", "2", "--processes-per-host", "2",
            "--distribution", "torch_distributed", "--job-name", name,
            "-p", "epoch_delay=0.15", "--", "24", "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_for_state_copy(home, name, 0, "snapshot.pt")
        store = home / "store"
        cluster = ClusterInfo.model_validate_json((store / JobKeys(name).cluster(1)).read_text())
        LocalProvider().kill_node(cluster, 1)
        out, _ = proc.communicate(timeout=180)
    finally:
        end(proc)
    assert proc.returncode == 0, out
    info = job_state(name)
    first, second = info["attempts"]
    assert first["cause"].startswith("algo-2 lost"), first
    assert second["started_from"].startswith("restored snapshot.pt"), second
    assert "on every node, from attempt 1" in second["started_from"], second
    resumed = [line for line in out.splitlines() if "Resuming training from snapshot" in line]
    assert {line.split("]")[0] + "]" for line in resumed} == {
        "[algo-1:0]", "[algo-1:1]", "[algo-2:2]", "[algo-2:3]"
    }, out  # fmt: skip
    epochs = {int(line.rsplit(" ", 1)[1]) for line in resumed}
    assert len(epochs) == 1 and epochs.pop() >= 1, resumed  # every rank from the same point
    assert "[algo-1] [trainctl] stopped: algo-2 was lost" in out, out
    survivor = (store / JobKeys(name).log(1, 0)).read_text()
    assert "SignalException" not in survivor and "node failed" not in survivor, survivor
    assert "[rank 1]\tEpoch 0 | Training snapshot saved" not in survivor  # local rank 0 saves
    assert "[rank 0]\tEpoch 0 | Training snapshot saved at snapshot.pt" in survivor
    status = trainctl("status", name, check=True).stdout
    assert "restored snapshot.pt" in status
    assert "algo-1: snapshot.pt" in status and "algo-2: snapshot.pt" in status, status
    # one worker process's lines, of the relaunch, from the stored logs
    rank2 = trainctl("logs", name, "--rank", "2", "--attempt", "2", check=True).stdout
    assert rank2 and all(line.startswith("[algo-2:2#2] ") for line in rank2.splitlines())
    assert "Resuming training from snapshot" in rank2, rank2
