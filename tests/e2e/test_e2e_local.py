"""End to end on the local provider: real agents, real torchrun (gloo on loopback)."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, FIXTURES, TRAINCTL, log_lines
from tests.rigs.sshd import job_processes
from trainctl import Estimator, TrainingJob, protocol
from trainctl.errors import SpecError
from trainctl.estimator import JobFailedError
from trainctl.state import JobState

pytestmark = pytest.mark.e2e

TORCHRUN = {"torch_distributed": {"enabled": True}}


def probe_records(job: TrainingJob, attempt: int = 1) -> dict[str, dict]:
    """The PROBE line of every node, keyed by host, read from the node logs in the store."""
    out = {}
    for info in job.store.list(f"jobs/{job.name}/logs/attempt-{attempt}"):
        for line in log_lines(job.store.get_text(info.key)):
            if line.startswith("PROBE "):
                rec = json.loads(line[6:])
                out[rec["env"]["SM_CURRENT_HOST"]] = rec
    return out


def read_tar(store, key: str) -> dict[str, bytes]:
    data = store.get_bytes(key)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_digits_two_nodes_trains_to_accuracy(home, capsys):
    """The README's example: 2 nodes under torchrun reach >= 0.95 and yield model.pt."""
    import torch

    est = Estimator(
        entry_point="train.py",
        source_dir=str(EXAMPLES / "digits"),
        instance_type="local",
        instance_count=2,
        hyperparameters={"epochs": 12, "lr": 0.1, "seed": 0},
        distribution=TORCHRUN,
        environment={"MY_FLAG": "1"},
    )
    job = est.fit(wait=True, logs=True)
    console = capsys.readouterr().out
    info = job.describe()
    assert info["state"] == "Completed"
    assert info["exit_code"] == 0
    # live, prefixed log lines from both nodes
    assert "[algo-1] rank 0/2" in console and "[algo-2] rank 1/2" in console
    accuracy = [line for line in console.splitlines() if "test_accuracy=" in line]
    assert accuracy, console
    assert float(accuracy[-1].split("test_accuracy=")[1]) >= 0.95
    assert f"job {job.name}: Completed" in console

    # the model artifact holds a loadable state_dict
    assert est.model_data == info["model_data"]
    assert info["model_data"].endswith(f"jobs/{job.name}/output/model.tar.gz")
    files = read_tar(job.store, f"jobs/{job.name}/output/model.tar.gz")
    state = torch.load(io.BytesIO(files["model.pt"]), weights_only=True)
    assert all(not k.startswith("module.") for k in state)

    # both nodes' logs are in the store
    logs = {i.key.rsplit("/", 1)[-1]: i for i in job.store.list(f"jobs/{job.name}/logs/attempt-1")}
    assert set(logs) == {"node-0.log", "node-1.log"}
    assert "test_accuracy=" in job.store.get_text(logs["node-0.log"].key)
    assert "rank 1/2" in job.store.get_text(logs["node-1.log"].key)

    # the event timeline goes through every state in order
    states = [e["state"] for e in job.events() if e["type"] == "state"]
    assert states == [
        "Pending",
        "Provisioning",
        "Starting",
        "Training",
        "Uploading",
        "Completed",
    ]
    assert info["attempts"][0]["outcome"] == "completed"
    assert len(info["attempts"][0]["nodes"]) == 2

    # attach gives a handle to the same job
    attached = Estimator.attach(job.name)
    assert attached.describe()["model_data"] == info["model_data"]


def test_node_contract_under_torchrun(home, source, tmp_path):
    """The SageMaker in-node contract: layout, SM_* variables, channels, args, working dir."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.csv").write_text("1,2,3\n")
    src = source("probe")
    est = Estimator(
        entry_point="probe.py",
        source_dir=str(src),
        instance_count=2,
        hyperparameters={"batch-size": 32, "batch_size": 16, "lr": 0.1, "name": "a b"},
        distribution=TORCHRUN,
        environment={"MY_FLAG": "1"},
    )
    job = est.fit(inputs={"train": data.as_uri()}, logs=False)
    probes = probe_records(job)
    hosts = ["127.0.1.1", "127.0.1.2"]  # numeric loopback names: they resolve anywhere
    assert set(probes) == set(hosts)
    for host, rank in ((hosts[0], 0), (hosts[1], 1)):
        rec = probes[host]
        env = rec["env"]
        root = Path(env["SM_MODEL_DIR"]).parent.parent.parent  # <root>/opt/ml/model
        assert rec["argv"] == [
            "--batch-size",
            "32",
            "--batch_size",
            "16",
            "--lr",
            "0.1",
            "--name",
            "a b",
        ]
        assert rec["cwd"] == str(root / "opt/ml/code") == rec["script_dir"]
        assert json.loads(env["SM_HOSTS"]) == hosts
        assert env["SM_CURRENT_HOST_RANK"] == str(rank)
        assert env["SM_HOST_COUNT"] == "2"
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["SM_MASTER_ADDR"] == hosts[0]
        assert env["SM_CHANNEL_TRAIN"] == str(root / "opt/ml/input/data/train")
        assert json.loads(env["SM_CHANNELS"]) == ["train"]
        assert json.loads(env["SM_HPS"])["batch-size"] == 32
        assert env["SM_HP_BATCH_SIZE"] == "16" or env["SM_HP_BATCH_SIZE"] == "32"
        assert env["SM_CHECKPOINT_DIR"] == str(root / "opt/ml/checkpoints")
        assert env["MY_FLAG"] == "1"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        assert json.loads(env["SM_TRAINING_ENV"])["current_host"] == host
        assert rec["configs"]["hyperparameters.json"]["lr"] == 0.1
        assert rec["configs"]["resourceconfig.json"]["current_host"] == host
        assert rec["configs"]["resourceconfig.json"]["hosts"] == hosts
        assert "train" in rec["configs"]["inputdataconfig.json"]
        assert rec["channels"]["train"] == ["rows.csv"]
        assert rec["channels"]["train:rows.csv"] == "1,2,3\n"
    # rank 0's model and output data dirs are packed into the store
    assert read_tar(job.store, f"jobs/{job.name}/output/model.tar.gz") == {
        "weights.txt": b"trained\n"
    }
    assert read_tar(job.store, f"jobs/{job.name}/output/output.tar.gz") == {"report.txt": b"ok\n"}


def test_plain_python_per_host_starts_its_own_process_group(home, source):
    """No distribution: the script runs once per host and can build its own process group."""
    job = Estimator(entry_point="train.py", source_dir=str(source("ownpg")), instance_count=2).fit(
        logs=False
    )
    assert job.describe()["state"] == "Completed"
    assert job.describe()["launcher"] == "python"
    text = "".join(
        job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{r}.log") for r in (0, 1)
    )
    assert "host 127.0.1.1 allreduce=3.0" in text
    assert "host 127.0.1.2 allreduce=3.0" in text


def _mpi_allreduce(source, **fields) -> Estimator:
    """tests/fixtures/mpi on 2 local nodes under mpirun (skipped without it, off CI)."""
    from tests.helpers import require_mpirun

    require_mpirun()
    base = {"source_dir": str(source("mpi")), "instance_count": 2, "distribution": "mpi"}
    return Estimator(entry_point="allreduce.py", **{**base, **fields})


@pytest.mark.mpirun
@pytest.mark.timeout(120)
def test_mpi_runs_every_process_from_the_first_host(home, source):
    """distribution mpi: algo-1 runs `mpirun` over both hosts' slots (one address here, so
    no remote shell), algo-2 runs nothing; the processes find each other by Open MPI's
    ranks and all-reduce. Each process's lines stay whole in the log, with its rank, while
    both print at once (untagged, two processes' lines shared one: "SUM 1 3SUM 0 3").
    A remote-start endpoint an agent left (killed before it could remove it) goes with the
    attempt."""
    from trainctl.record.keys import JobKeys

    job = _mpi_allreduce(source, hyperparameters={"lines": 400}).fit(wait=False)
    left = JobKeys(job.name).remote_start(1, 1)
    job.store.put_text(left, json.dumps({"address": "127.0.0.1", "port": 1, "token": "f" * 64}))
    job.wait(timeout=100)
    assert not job.store.exists(left)
    info = job.describe()
    assert info["state"] == "Completed", info
    assert info["launcher"] == "mpi"
    node0 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "launching: mpirun --allow-run-as-root --host 127.0.0.1:2 -np 2" in node0
    assert "[rank 0]\tSUM 0 3" in node0 and "[rank 1]\tSUM 1 3" in node0
    printed = [line[line.index("[rank") :] for line in node0.splitlines() if "LINE" in line]
    whole = {f"[rank {r}]\tLINE {r} {i} {'x' * 40}" for r in (0, 1) for i in range(400)}
    assert sorted(printed) == sorted(whole), [p for p in printed if p not in whole][:5]
    assert "MPI rank" not in node1 and "runs no launcher of its own" in node1


@pytest.mark.mpirun
@pytest.mark.timeout(120)
def test_mpi_process_that_fails_fails_the_job_with_its_error(home, source):
    with pytest.raises(JobFailedError) as raised:
        _mpi_allreduce(source, hyperparameters={"fail-rank": 1}).fit(logs=False)
    info = raised.value.job.describe()
    assert info["state"] == "Failed"
    assert info["exit_code"] not in (None, 0)
    # The script's own error; mpirun may abort before it forwards the failing process's
    # output (seen under load), and then its own report names the rank and the exit code.
    assert info["failure_reason"] in (
        "algo-1: ValueError: rank 1 was told to fail",
        "algo-1: mpirun: MPI rank 1 exited with code 1 (its error output did not arrive)",
    ), info
    if "ValueError" in info["failure_reason"]:  # the traceback is the process's, in order
        node0 = raised.value.job.store.get_text(f"jobs/{info['name']}/logs/attempt-1/node-0.log")
        assert "[rank 1]\tTraceback (most recent call last):" in node0
        assert "[rank 1]\tValueError: rank 1 was told to fail" in node0


def test_failing_script_fails_job_with_traceback(home, source, capsys):
    """A script that raises: Failed, its exit code, its traceback, the other node ended."""
    est = Estimator(
        entry_point="train.py",
        source_dir=str(source("fail")),
        instance_count=2,
        distribution=TORCHRUN,
    )
    with pytest.raises(JobFailedError) as raised:
        est.fit()
    console = capsys.readouterr().out
    info = raised.value.job.describe()
    assert info["state"] == "Failed"
    assert info["exit_code"] not in (None, 0)
    assert info["failure_reason"] == "algo-2: ValueError: learning rate 10.0 is too large"
    assert "load_config" in info["failure_detail"]
    assert "ValueError: learning rate 10.0 is too large" in console
    assert info["attempts"][0]["outcome"] == "failed"
    failure = raised.value.job.store.get_text(f"jobs/{raised.value.job.name}/output/failure")
    assert "ValueError" in failure
    assert "ValueError: learning rate" in str(raised.value)


def test_failure_file_is_the_reason(home, tmp_path):
    """/opt/ml/output/failure, when the script writes it, is the reason shown."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.environ['SM_OUTPUT_DIR'], 'failure'), 'w')"
        ".write('dataset shard 3 is corrupt\\n')\n"
        "sys.exit(3)\n"
    )
    with pytest.raises(JobFailedError) as raised:
        Estimator(entry_point="train.py", source_dir=str(src)).fit(logs=False)
    info = raised.value.job.describe()
    assert info["failure_reason"] == "algo-1: dataset shard 3 is corrupt"
    assert info["exit_code"] == 3


def test_detached_fit_wait_and_stop(home, source):
    """fit(wait=False) returns at once; stop() returns once every process of the job has
    ended and its nodes are gone (the record turns Stopped before that teardown is done)."""
    est = Estimator(
        entry_point="train.py",
        source_dir=str(source("sleeper")),
        instance_count=2,
        distribution=TORCHRUN,
    )
    job = est.fit(wait=False)
    _wait_for_state(job, JobState.TRAINING)
    _wait_for_log(job, "rank 1 step 3")
    info = job.stop()
    assert info["state"] == "Stopped"
    assert info["stop_reason"] == "stopped by the user"
    assert info["attempts"][0]["outcome"] == "stopped"
    assert not job_processes(job.name)
    assert not (home / "nodes" / job.name).exists()


def test_detached_fit_then_wait(home, source):
    est = Estimator(entry_point="probe.py", source_dir=str(source("probe")), instance_count=2)
    job = est.fit(wait=False)
    assert not job.state.is_terminal() or job.state is JobState.COMPLETED
    info = job.wait(timeout=120)
    assert info["state"] == "Completed"
    assert est.model_data == info["model_data"] is not None
    # The detached controller's log follows its job into the store as it ends, and goes
    # with the job
    from trainctl.controller.detached import controller_log_path
    from trainctl.errors import NotFoundError

    key = f"jobs/{job.name}/controller.log"
    deadline = time.monotonic() + 60
    while True:
        try:
            filed = job.store.get_text(key)
            break
        except NotFoundError:
            assert time.monotonic() < deadline, "the controller did not file its log"
            time.sleep(0.1)
    assert f"job {job.name}: provisioning 2 x local" in filed, filed
    assert not controller_log_path(job.name).exists()
    job.remove()
    assert not list(job.store.list(f"jobs/{job.name}/"))


def test_processes_per_host(home, source):
    """torchrun runs processes_per_host workers on each node: global ranks 0..N*P-1."""
    job = Estimator(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_count=2,
        processes_per_host=2,
        distribution=TORCHRUN,
    ).fit(logs=False)
    seen = set()
    for info in job.store.list(f"jobs/{job.name}/logs/attempt-1"):
        for line in job.store.get_text(info.key).splitlines():
            if "RANKINFO " in line:
                seen.add(tuple(line.split("RANKINFO ", 1)[1].split()[:4]))
    assert seen == {
        ("127.0.1.1", "0", "0", "4"),
        ("127.0.1.1", "1", "1", "4"),
        ("127.0.1.2", "2", "0", "4"),
        ("127.0.1.2", "3", "1", "4"),
    }


def test_requirements_install_into_isolated_env(home, source):
    """requirements.txt is installed for the job only, never into trainctl's own env."""
    import importlib.util

    src = source("reqs")
    deps = src / "deps"
    deps.mkdir()
    _write_wheel(deps / "tinydep-0.1-py3-none-any.whl")
    (src / "requirements.txt").write_text("./deps/tinydep-0.1-py3-none-any.whl\n")
    job = Estimator(entry_point="train.py", source_dir=str(src)).fit(logs=False)
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "tinydep=42" in log
    assert str(home / "envs") in log.split("from=")[1]
    assert importlib.util.find_spec("tinydep") is None  # the user's environment is untouched
    # a second job with the same requirements reuses the environment
    job2 = Estimator(entry_point="train.py", source_dir=str(src)).fit(logs=False)
    assert "requirements: reusing" in job2.store.get_text(
        f"jobs/{job2.name}/logs/attempt-1/node-0.log"
    )


def test_unchanged_source_is_uploaded_once(home, source):
    src = source("probe")
    first = Estimator(entry_point="probe.py", source_dir=str(src)).fit(logs=False)
    second = Estimator(entry_point="probe.py", source_dir=str(src)).fit(logs=False)
    a, b = (TrainingJob(j.name)._record() for j in (first, second))
    assert a.source_uri == b.source_uri
    assert len(list(first.store.list("sources"))) == 1


def test_max_run_stops_the_job(home, source):
    est = Estimator(entry_point="train.py", source_dir=str(source("sleeper")), max_run=2)
    with pytest.raises(JobFailedError):
        est.fit(logs=False)
    info = est.latest_training_job.describe()
    assert info["state"] == "Stopped"
    assert info["stop_reason"].startswith("MaxRuntimeExceeded")


def test_metric_definitions_are_recorded(home):
    est = Estimator(
        entry_point="train.py",
        source_dir=str(EXAMPLES / "digits"),
        hyperparameters={"epochs": 2},
        metric_definitions=[{"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"}],
    )
    job = est.fit(logs=False)
    assert 0 < job.describe()["metrics"]["test:accuracy"] <= 1


def test_a_control_message_inside_a_printed_line_leaves_the_line_whole(home, source):
    job = Estimator(entry_point="train.py", source_dir=str(source("midline"))).fit(logs=False)
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    lines = log_lines(log)
    assert "SPLIT first half and second half" in lines and "NEXT line" in lines, log
    assert protocol.CONTROL_PREFIX not in log
    assert job.describe()["attempts"][0]["last_step"] == 7


# -- helpers --------------------------------------------------------------------------------


def _wait_for_state(job: TrainingJob, state: JobState, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.state is state:
            return
        assert not job.state.is_terminal(), job.describe()
        time.sleep(0.2)
    raise AssertionError(f"job never reached {state}: {job.describe()}")


def _wait_for_log(job: TrainingJob, text: str, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in job.store.list(f"jobs/{job.name}/logs"):
            if text in job.store.get_text(info.key):
                return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in the logs")


def _write_wheel(path: Path) -> None:
    files = {
        "tinydep/__init__.py": "VALUE = 42\n",
        "tinydep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinydep\nVersion: 0.1\n",
        "tinydep-0.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "tinydep-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
        whl.writestr("tinydep-0.1.dist-info/RECORD", record)


def test_stop_of_fit_running_in_a_thread(home, source, monkeypatch):
    """stop() reaches an attached fit() in a worker thread through the store, not a signal
    (a SIGTERM would kill the user's whole process, this test run included). It returns once
    the teardown is done, not when the record turns Stopped (just before it): here a slow
    one, as removing containers or terminating instances is."""
    import threading
    import time

    from trainctl.provisioning.local import LocalProvider

    torn_down = threading.Event()
    terminate = LocalProvider.terminate

    def slow_terminate(self, job: str, *, grace: float) -> None:
        time.sleep(2)
        terminate(self, job, grace=grace)
        torn_down.set()

    monkeypatch.setattr(LocalProvider, "terminate", slow_terminate)
    est = Estimator(entry_point="train.py", source_dir=str(source("sleeper")))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            est.fit(logs=False)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while est.latest_training_job is None and time.monotonic() < deadline:
        time.sleep(0.1)
    _wait_for_state(est.latest_training_job, JobState.TRAINING)
    assert est.latest_training_job.stop()["state"] == "Stopped"
    assert torn_down.is_set()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert isinstance(outcome[0], JobFailedError)


def test_deterministic_failure_ends_after_max_restarts(home, source):
    """A script that always fails is retried max_restarts times, then Failed: no endless loop."""
    est = Estimator(entry_point="train.py", source_dir=str(source("fail")), max_restarts=2)
    with pytest.raises(JobFailedError):
        est.fit(logs=False)
    info = est.latest_training_job.describe()
    assert info["state"] == "Failed"
    assert [a["outcome"] for a in info["attempts"]] == ["failed", "failed", "failed"]
    interrupted = [
        e["cause"]
        for e in est.latest_training_job.events()
        if e["type"] == "state" and e["state"] == "Interrupted"
    ]
    assert len(interrupted) == 2
    assert interrupted[0].endswith("(restart 1 of 2)") and interrupted[1].endswith("of 2)")
    assert info["failure_reason"] == "algo-1: ValueError: learning rate 10.0 is too large"


def test_max_wait_stops_a_job_that_keeps_being_interrupted(home, source):
    """max_wait bounds the whole job, relaunches included, and ends it clearly."""
    est = Estimator(
        entry_point="train.py",
        source_dir=str(source("sleeper")),
        instance_count=2,
        max_wait=6,
        faults=["kill:1@1"],
    )
    with pytest.raises(JobFailedError):
        est.fit(logs=False)
    info = est.latest_training_job.describe()
    assert info["state"] == "Stopped"
    assert info["stop_reason"].startswith("MaxWaitTimeExceeded")
    assert [a["outcome"] for a in info["attempts"]] == ["interrupted", "stopped"]


def test_a_fault_the_job_ended_before_is_said_at_the_end(home, tmp_path):
    """`kill:0@600` on a job that trains for a second never fires: the test it was meant for
    tested nothing, and the job's end says so (an event, and the controller's warning)."""
    from trainctl.record.jobstore import JobStore

    (tmp_path / "quick.py").write_text("print('done')\n")
    job = Estimator(entry_point="quick.py", source_dir=str(tmp_path), faults=["kill:0@600"]).fit(
        logs=False
    )
    assert job.describe()["state"] == "Completed"
    events = JobStore(job.store, job.name).events()
    assert [e["faults"] for e in events if e["type"] == "faults_not_fired"] == [["kill:0@600"]]
    said = "fault(s) kill:0@600 never fired: the job ended first"
    assert job.describe()["warnings"] == [said]
    status = subprocess.run([TRAINCTL, "status", job.name], capture_output=True, text=True)
    assert said in " ".join(status.stdout.split()), status.stdout  # (however it wraps)


def test_a_fault_at_the_nth_checkpoint_file_hits_a_script_that_reports_no_steps(home):
    """The DDP tutorial unchanged (snapshot.pt every epoch, no report_step): `kill:0@ckpt2`
    fires once its node has stored the snapshot twice, and the relaunch resumes from it."""
    from tests.helpers import TORCHRUN

    job = Estimator(
        entry_point="multinode.py", source_dir=str(FIXTURES / "snapshot"),
        distribution=TORCHRUN, arguments=["8", "1"], hyperparameters={"epoch_delay": 0.3},
        faults=["kill:0@ckpt2"],
    ).fit(logs=False)  # fmt: skip
    info = job.describe()
    assert info["state"] == "Completed" and len(info["attempts"]) == 2, info["attempts"]
    first, second = info["attempts"]
    assert first["cause"] == "algo-1 lost: killed by injected fault kill:0@ckpt2", first
    assert second["started_from"].startswith("restored snapshot.pt"), second


SLOW_START = """
import sys, time
import torch
time.sleep(2)  # 40 s of imports and data loading, shortened
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    opt.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    opt.step()
    print(f"trained step {step}", flush=True)
    time.sleep(0.05)
"""


def test_a_fault_after_the_first_step_waits_out_a_slow_start(home, tmp_path):
    """`kill:0@first+1` on a script with a slow start that reports no steps: the worker
    hook sees its first optimizer step, the fault fires a second after it (a plain `@1`
    lands in the imports), and the start-up's stages are known without a reported step."""
    from trainctl.record.jobstore import JobStore

    (tmp_path / "slow.py").write_text(SLOW_START)
    job = Estimator(entry_point="slow.py", source_dir=str(tmp_path), faults=["kill:0@first+1"]).fit(
        logs=False
    )
    info = job.describe()
    assert info["state"] == "Completed" and len(info["attempts"]) == 2, info["attempts"]
    assert info["attempts"][0]["cause"] == "algo-1 lost: killed by injected fault kill:0@first+1"
    logs = job.store.list(f"jobs/{job.name}/logs/attempt-1")
    lines = [ln for i in logs for ln in log_lines(job.store.get_text(i.key))]
    trained = [ln for ln in lines if ln.startswith("trained step ")]
    # hit after training began, not in the imports: a second of steps is ~20 on a quiet
    # machine, fewer on a busy one (and a killed node's last lines may not reach the store)
    assert 2 <= len(trained) < 40, lines
    events = JobStore(job.store, job.name).events()
    assert [e["attempt"] for e in events if e["type"] == "startup"][:1] == [1], events


def test_nodes_that_never_start_fail_the_job_after_three_attempts(home, source):
    """Lost capacity is retried, but nodes that cannot even start (here: an agent
    interpreter that exits at once) would fail the same way on new capacity: after three
    attempts in a row that never trained, the job fails instead of relaunching forever."""
    from trainctl.controller.controller import MAX_ATTEMPTS_NEVER_STARTED, Controller
    from trainctl.controller.submit import create_job
    from trainctl.provisioning.local import LocalProvider
    from trainctl.spec.build import build_spec
    from trainctl.store import default_store

    class BrokenNodes(LocalProvider):
        def node_runner(self, cluster, rank):
            return dataclasses.replace(super().node_runner(cluster, rank), python="/bin/false")

    store = default_store()
    record = create_job(build_spec(entry_point=str(source("probe") / "probe.py")), store)
    final = Controller(store, record.name, provider=BrokenNodes()).run()
    assert final.state is JobState.FAILED
    assert len(final.attempts) == MAX_ATTEMPTS_NEVER_STARTED == 3
    assert final.failure_reason.startswith("nodes failed to start 3 times in a row: algo-1 lost")


def test_a_relaunch_goes_on_when_the_last_attempts_capacity_was_not_all_released(
    home, source, capsys
):
    """A teardown that fails between attempts (a container engine that hangs) is said, and
    the job relaunches all the same; the job's final teardown tries again."""
    from trainctl.controller.controller import MAX_ATTEMPTS_NEVER_STARTED, Controller
    from trainctl.controller.submit import create_job
    from trainctl.image.container import ContainerCleanupError
    from trainctl.provisioning.local import LocalProvider
    from trainctl.record.jobstore import JobStore
    from trainctl.spec.build import build_spec
    from trainctl.store import default_store

    teardowns: list[str] = []

    class StuckEngine(LocalProvider):
        def node_runner(self, cluster, rank):
            return dataclasses.replace(super().node_runner(cluster, rank), python="/bin/false")

        def terminate(self, job, *, grace):
            super().terminate(job, grace=grace)
            teardowns.append(job)
            raise ContainerCleanupError("`podman rm -f` did not answer within 120 s")

    store = default_store()
    record = create_job(build_spec(entry_point=str(source("probe") / "probe.py")), store)
    final = Controller(store, record.name, provider=StuckEngine()).run()
    assert len(final.attempts) == MAX_ATTEMPTS_NEVER_STARTED
    assert final.failure_reason.startswith("nodes failed to start 3 times in a row")
    assert len(teardowns) == MAX_ATTEMPTS_NEVER_STARTED  # two relaunches and the last
    said = capsys.readouterr().err
    assert "attempt 1's capacity was not all released: `podman rm -f` did not answer" in said
    events = JobStore(store, record.name).events()
    failed = [e for e in events if e["type"] == "teardown_failed"]
    assert [e["attempt"] for e in failed] == [1, 2]


def test_a_script_that_writes_into_its_channel_leaves_the_source_untouched(home, source, tmp_path):
    """File mode (the default) gives each node a copy of a file:// channel, as SageMaker's
    File mode does; FastFile links the original, read-only in the job's view as SageMaker's
    FastFile mount is: the careless script fails on its write, the original as it was."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("original\n")
    est = Estimator(entry_point="train.py", source_dir=str(source("writer")))
    job = est.fit(inputs={"train": data.as_uri()}, logs=False)
    assert job.describe()["state"] == "Completed"
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]
    assert (data / "a.txt").read_text() == "original\n"
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "channel train: copied 1 file(s)" in log
    assert '"TrainingInputMode": "File"' in log

    from trainctl.estimator.inputs import TrainingInput

    with pytest.raises(JobFailedError) as raised:
        est.fit(inputs={"train": TrainingInput(data.as_uri(), input_mode="FastFile")}, logs=False)
    linked = raised.value.job
    assert "Read-only file system" in linked.describe()["failure_reason"]
    log = linked.store.get_text(f"jobs/{linked.name}/logs/attempt-1/node-0.log")
    assert "FastFile: read in place, read-only" in log
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]
    assert (data / "a.txt").read_text() == "original\n"


def test_a_channel_whose_copies_do_not_fit_is_refused_before_anything_is_made(home, tmp_path):
    """A (sparse) 10 TB channel copied to each of 2 nodes: one line naming the channel, with
    the way out (FastFile); nothing recorded or uploaded."""
    data = tmp_path / "huge"
    data.mkdir()
    with open(data / "big.bin", "wb") as f:
        f.truncate(10**13)  # sparse: takes no space itself
    est = Estimator(entry_point="probe.py", source_dir=str(FIXTURES / "probe"), instance_count=2)
    with pytest.raises(SpecError) as raised:
        est.fit(inputs={"train": data.as_uri()}, logs=False)
    assert raised.value.field == "inputs.train"
    assert "a copy per node needs 20.0 TB" in str(raised.value) and "FastFile" in str(raised.value)
    assert not (home / "store").exists()
