"""Trust boundaries, tried as an attacker and a careless user would: each numbered defect of
issue 23 as the attack, and the proof that nothing outside the job changed.

1. one job reaching another's data through its checkpoint/output/input URIs
2. tampered code in the store
3. two submits racing for one job name
4. a system directory as the local checkpoint path
5. secrets in records, logs, events, status and the dashboard
6. user environment overriding trainctl's own
7. processes escaping the job's end
8. unreadable records breaking the CLI and the dashboard
9. odd input: huge, deep, aliased, duplicated, binary
10. checkpoints unpickled fully by default
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import re
import socket
import stat
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import TRAINCTL, free_port

pytestmark = pytest.mark.e2e

PASSWORD = "hunter2-very-secret"
API_KEY = "sk-live-abcdefghijklmnop"
DECLARED = "declared-secret-value"
ESCAPED = "quo\"te\\back'slash"

TRAIN = """\
import hashlib, os, sys
print("argv", sys.argv[1:], flush=True)
print("env", os.environ.get("MY_API_KEY"), os.environ.get("PLAIN_BUT_SECRET"), flush=True)
digest = hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()
print("argv-sha", digest, flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w") as f:
    f.write("weights")
"""


def cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRAINCTL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or os.environ.copy(),
    )


def one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The error of a refused command: exit `code`, one line on stderr, no traceback."""
    text = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert len(text.splitlines()) == 1, text
    return text


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "train.py").write_text(TRAIN)
    return d


def store_root(home: Path) -> Path:
    return home / "store"


def snapshot(root: Path) -> dict[str, str]:
    """Every object of a store directory with its content hash."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".tmp-" not in path.name:
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def finished_job(home: Path, src: Path, name: str, *extra: str) -> None:
    proc = cli("submit", "train.py", "--source-dir", str(src), "--job-name", name, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- 1. prefix isolation ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_job_cannot_point_its_uris_at_the_store_or_another_job(home, src):
    finished_job(home, src, "victim")
    store = store_root(home)
    before = snapshot(store)
    attacks = [
        ("--checkpoint-s3-uri", store.as_uri(), "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", str(store), "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", (store / "jobs" / "victim").as_uri(), "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", (store / "sources").as_uri(), "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", home.as_uri(), "checkpoint_s3_uri"),  # holds the store
        ("--output-path", store.as_uri(), "output_path"),
        ("--output-path", (store / "jobs").as_uri(), "output_path"),
        ("--inputs", f"train={store.as_uri()}", "inputs.train"),
        ("--inputs", f"train={(store / 'jobs' / 'victim').as_uri()}", "inputs.train"),
    ]
    link = home.parent / "link-to-store"
    link.symlink_to(store)
    attacks.append(("--checkpoint-s3-uri", link.as_uri(), "checkpoint_s3_uri"))

    def attempt(attack):
        flag, value, field = attack
        return field, cli("submit", "train.py", "--source-dir", str(src), flag, value)

    with ThreadPoolExecutor(4) as pool:
        for field, proc in pool.map(attempt, attacks):
            assert one_line_error(proc).startswith(f"error: {field}: "), proc.stderr
    assert snapshot(store) == before, "a refused submit changed the store"
    assert sorted(p.name for p in (store / "jobs").iterdir()) == ["victim"]
    # Reading another job's results stays allowed (fine-tuning from its model).
    output = (store / "jobs" / "victim" / "output").as_uri()
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--inputs", f"m={output}", "--dry-run"
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(120)
def test_a_node_refuses_a_record_that_reaches_outside_the_job(home, src):
    """Defence in depth: a record edited in the store (or written by an older trainctl) to
    checkpoint into the store root fails on the node, named, not retried; other jobs' records
    are neither restored onto the node nor overwritten or deleted."""
    from trainctl.controller.submit import create_job, start_detached
    from trainctl.controller.supervise import supervise
    from trainctl.record.jobstore import JobStore
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    finished_job(home, src, "victim")
    store = open_store(store_root(home).as_uri())
    victim_before = snapshot(store_root(home) / "jobs" / "victim")
    spec = build_spec(
        entry_point="train.py", source_dir=str(src), job_name="attacker", max_restarts=3
    )
    record = create_job(spec, store)
    jobs = JobStore(store, "attacker")
    record.spec = record.spec.model_copy(update={"checkpoint_s3_uri": store.uri})
    jobs.save(record)
    start_detached(store, record)
    final = supervise(store, "attacker", timeout=90)
    assert final.state.value == "Failed"
    assert "refused" in (final.failure_reason or "") and "the store itself" in final.failure_reason
    assert len(final.attempts) == 1, "a refusal must not be retried"
    assert snapshot(store_root(home) / "jobs" / "victim") == victim_before


@pytest.mark.timeout(60)
def test_system_directories_are_not_checkpoint_paths(home, src):
    for path in ("/etc", "/proc/1", "/", "/root", "/tmp", "/opt/ml", str(Path.home()), "/usr/lib"):
        proc = cli("submit", "train.py", "--source-dir", str(src), "--checkpoint-local-path", path)
        assert one_line_error(proc).startswith("error: checkpoint_local_path: "), proc.stderr
    assert not (store_root(home) / "jobs").exists()


@pytest.mark.timeout(120)
def test_a_non_empty_local_checkpoint_dir_of_someone_else_is_refused_on_the_node(
    home, src, tmp_path
):
    """Not a system path, but not the job's either: the node refuses it instead of uploading
    what it holds as the job's checkpoints."""
    theirs = tmp_path / "someone-elses"
    theirs.mkdir()
    (theirs / "private.key").write_text("not for the store")
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--job-name", "borrower",
        "--checkpoint-local-path", str(theirs), "--max-restarts", "2",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    info = json.loads(cli("status", "borrower", "-o", "json").stdout)
    assert info["state"] == "Failed" and "not empty" in info["failure_reason"]
    assert len(info["attempts"]) == 1
    stored = [p.name for p in store_root(home).rglob("*") if p.is_file()]
    assert "private.key" not in stored
    assert (theirs / "private.key").read_text() == "not for the store"
    # A fresh directory is the job's: its relaunches may use it again.
    fresh = tmp_path / "fresh"
    finished_job(home, src, "owner", "--checkpoint-local-path", str(fresh))


@pytest.mark.timeout(60)
def test_two_running_jobs_cannot_share_a_checkpoint_uri(home, src, tmp_path):
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    store = open_store(store_root(home).as_uri())
    shared = (tmp_path / "ckpt").as_uri()
    create_job(
        build_spec(entry_point="train.py", source_dir=str(src), checkpoint_s3_uri=shared), store
    )
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--checkpoint-s3-uri", shared + "/sub"
    )
    assert "overlaps the checkpoints of job" in one_line_error(proc)


# -- 2. code integrity --------------------------------------------------------------------


def _evil_archive(path: Path) -> None:
    data = b'print("PWNED: this is not the submitted code")\n'
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@pytest.mark.timeout(180)
def test_tampered_code_never_runs(home, src):
    from trainctl.controller.submit import create_job, start_detached
    from trainctl.controller.supervise import supervise
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    finished_job(home, src, "first")
    sources = list((store_root(home) / "sources").rglob("sourcedir.tar.gz"))
    assert len(sources) == 1
    _evil_archive(sources[0])  # someone with write access to the store replaces the code
    # A new submit of the unchanged directory re-verifies the stored object: sent again.
    finished_job(home, src, "second")
    logs = cli("logs", "second").stdout
    assert "argv-sha" in logs and "PWNED" not in logs
    # A job recorded before the replacement (detached, or relaunched later) refuses it.
    store = open_store(store_root(home).as_uri())
    record = create_job(
        build_spec(entry_point="train.py", source_dir=str(src), max_restarts=3), store
    )
    _evil_archive(sources[0])
    start_detached(store, record)
    final = supervise(store, record.name, timeout=90)
    assert final.state.value == "Failed" and len(final.attempts) == 1
    assert "sha256" in final.failure_reason and "tampered" in final.failure_reason
    assert "PWNED" not in cli("logs", record.name).stdout


# -- 3. atomic job creation ---------------------------------------------------------------


@pytest.mark.timeout(60)
def test_of_two_submits_racing_for_one_name_exactly_one_wins(home, tmp_path, monkeypatch):
    """Both passed the "is the name free?" check (the window a 30 MB upload opens); the
    record is written create-if-absent, so the second one gets the one-line refusal and the
    winner's record still runs the winner's code."""
    from trainctl.controller.submit import create_job
    from trainctl.errors import SpecError
    from trainctl.record.jobstore import JobStore
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    store = open_store(store_root(home).as_uri())
    monkeypatch.setattr(JobStore, "exists", lambda self: False)  # both checked before either wrote
    a, b = tmp_path / "a", tmp_path / "b"
    for d, word in ((a, "A"), (b, "B")):
        d.mkdir()
        (d / "train.py").write_text(f"print({word!r})\n")
    results: dict[str, object] = {}

    def submit(d: Path) -> None:
        try:
            results[d.name] = create_job(
                build_spec(entry_point="train.py", source_dir=str(d), job_name="same"), store
            )
        except SpecError as exc:
            results[d.name] = exc

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(submit, (a, b)))
    errors = [r for r in results.values() if isinstance(r, SpecError)]
    winners = [r for r in results.values() if not isinstance(r, SpecError)]
    assert len(errors) == 1 and len(winners) == 1, results
    assert "already exists" in str(errors[0])
    assert JobStore(store, "same").load().source_sha256 == winners[0].source_sha256
    events = JobStore(store, "same").events()
    assert [e["type"] for e in events] == ["state", "source"], "the loser wrote events"


# -- 5. secrets ---------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_secrets_stay_out_of_everything_shown(home, src, tmp_path):
    finished_job(
        home, src, "secretive",
        "-p", f"password={PASSWORD}", "-p", "epochs=2",
        "--environment", f"MY_API_KEY={API_KEY}", "--environment", f"PLAIN_BUT_SECRET={DECLARED}",
        "--secret-env", "PLAIN_BUT_SECRET",
        # printed by the script inside repr() (argv), so escaped; and one too short to
        # search for inside words, hidden where it stands alone
        "-p", f"escaped_secret={ESCAPED}", "-p", "short_password=q7z",
    )  # fmt: skip
    # (each as given, and as repr() and JSON print it)
    secrets = tuple(
        form
        for value in (PASSWORD, API_KEY, DECLARED, ESCAPED)
        for form in (value, repr(value)[1:-1], json.dumps(value)[1:-1])
    )
    store = store_root(home)
    record = store / "jobs" / "secretive" / "job.json"
    # The record holds the real values (the nodes need them), readable by its owner only.
    assert PASSWORD in record.read_text()
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    for path in (store / "jobs" / "secretive").rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
            if path != record:
                text = path.read_text(errors="replace")
                assert not any(s in text for s in secrets), f"a secret in {path}"
    shown = [
        cli("status", "secretive").stdout,
        cli("status", "secretive", "-o", "json").stdout,
        cli("logs", "secretive").stdout,
        cli("jobs", "-o", "json").stdout,
        cli("submit", "train.py", "--source-dir", str(src), "-p", f"password={PASSWORD}",
            "--environment", f"MY_API_KEY={API_KEY}", "--dry-run").stdout,
    ]  # fmt: skip
    for text in shown:
        assert not any(s in text for s in secrets), text
        assert not re.search(r"(?<![A-Za-z0-9_])q7z(?![A-Za-z0-9_])", text), text
    info = json.loads(shown[1])
    assert info["hyperparameters"] == {
        "password": "<redacted>",
        "epochs": 2,
        "escaped_secret": "<redacted>",
        "short_password": "<redacted>",
    }
    assert info["environment"]["PLAIN_BUT_SECRET"] == "<redacted>"
    # ... and the script got the real values.
    argv = f"--password {PASSWORD} --epochs 2 --escaped_secret {ESCAPED} --short_password q7z"
    real = hashlib.sha256(argv.encode()).hexdigest()
    assert f"argv-sha {real}" in shown[2]
    assert "env <redacted> <redacted>" in shown[2]
    # A running multi-host MPI node's remote-start endpoint (its token lets mpirun start
    # processes there): for the job's nodes only, never listed or served by the dashboard.
    token = "f" * 64
    endpoint = store / "jobs" / "secretive" / "attempts" / "attempt-1" / "node-1.remote-start.json"
    endpoint.write_text(json.dumps({"address": "127.0.0.1", "port": 1, "token": token}))
    # ... nor by `trainctl artifacts`: not listed, not fetched alone or with its folder
    listed = cli("artifacts", "secretive", "-o", "json")
    assert listed.returncode == 0 and "cluster.json" in listed.stdout
    assert "remote-start" not in listed.stdout
    fetched = cli(
        "artifacts",
        "secretive",
        "get",
        endpoint.relative_to(endpoint.parents[2]).as_posix(),
        str(tmp_path / "got"),
    )
    assert fetched.returncode != 0 and token not in fetched.stdout + fetched.stderr
    assert not (tmp_path / "got").exists()
    folder = cli("artifacts", "secretive", "get", "attempts", str(tmp_path / "attempts"))
    assert folder.returncode == 0, folder.stderr
    got = [p.name for p in (tmp_path / "attempts").rglob("*") if p.is_file()]
    assert "cluster.json" in got and not any("remote-start" in n for n in got), got
    # The dashboard: the API, the record's file view (redacted, never raw), DNS rebinding.
    port = free_port()
    ui = subprocess.Popen([TRAINCTL, "ui", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stderr is not None and ui.stderr.readline().startswith("trainctl ui:")
        for path in ("/api/jobs", "/api/jobs/secretive", "/api/jobs/secretive/files/job.json",
                     "/api/jobs/secretive/logs?attempt=1&rank=0"):  # fmt: skip
            status, body = _get(port, path)
            assert status == 200, (path, body)
            assert not any(s.encode() in body for s in secrets), path
        assert json.loads(_get(port, "/api/jobs/secretive/files/job.json")[1])["name"]
        status, listed = _get(port, "/api/jobs/secretive/artifacts")
        assert status == 200 and b"attempts/attempt-1/cluster.json" in listed
        assert b"remote-start" not in listed
        status, body = _get(
            port, "/api/jobs/secretive/files/attempts/attempt-1/node-1.remote-start.json"
        )
        assert status == 404 and token.encode() not in body
        for host in ("evil.example", "evil.example:80", f"attacker.test:{port}"):
            status, body = _get(port, "/api/jobs", host=host)
            assert status == 421 and b"secretive" not in body, host
        assert _get(port, "/api/jobs", host=f"localhost:{port}")[0] == 200
    finally:
        ui.terminate()
        ui.wait(timeout=10)


def _get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_dashboard_options_are_checked(home):
    cases = [
        (["--port", "70000"], "--port"),
        (["--port", "0"], "--port"),
        (["--token", ""], "--token"),
        (["--token", "a"], "--token"),
        (["--host", "0.0.0.0", "--token", "short"], "--token"),
    ]
    for args, field in cases:
        proc = cli("ui", *args, timeout=30)
        assert one_line_error(proc).startswith(f"error: {field}: "), proc.stderr


# -- 6. reserved environment --------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_launch_environment_cannot_be_overridden(home, src):
    names = ["TRAINCTL_JOB=other", "RANK=3", "WORLD_SIZE=9", "LOCAL_RANK=1", "TMPDIR=/",
             "SM_MODEL_DIR=/etc", "MASTER_ADDR=evil", "TORCHELASTIC_RUN_ID=x"]  # fmt: skip

    def attempt(pair: str) -> tuple[str, subprocess.CompletedProcess]:
        return pair, cli("submit", "train.py", "--source-dir", str(src), "--environment", pair)

    with ThreadPoolExecutor(4) as pool:
        for pair, proc in pool.map(attempt, names):
            line = one_line_error(proc)
            assert line.startswith("error: environment: ") and pair.split("=")[0] in line
    from trainctl import Estimator
    from trainctl.errors import SpecError
    from trainctl.spec.limits import TRAIN_LIBRARY_ENV
    from trainctl.train import diagnosis

    # What trainctl.train reads (diagnose's derived runs) stays settable, and is only that.
    assert {
        diagnosis.DIAGNOSE_STEPS,
        diagnosis.DIAGNOSE_WARMUP,
        diagnosis.SYNTHETIC_DATA,
    } == TRAIN_LIBRARY_ENV
    for env, what in (({"X": "a\0b"}, "NUL"), ({"X": "x" * 40_000}, "at most")):
        with pytest.raises(SpecError, match=what):
            Estimator(entry_point="train.py", source_dir=str(src), environment=env).fit()
    assert not (store_root(home) / "jobs").exists()


# -- 7. every process ends with the job ---------------------------------------------------

ESCAPER = """\
import os, subprocess, sys, time
tag = sys.argv[1]
sleep = [sys.executable, "-c", "import time; time.sleep(300)", tag]
subprocess.Popen(sleep)                                       # keeps the job's stdout
subprocess.Popen(sleep, env={}, start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # untagged, own session
if os.fork() == 0:                                            # a daemon: double fork, setsid
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, sleep, {})
    os._exit(0)
print("work done", flush=True)
"""


def _sleepers(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if tag.encode() in cmd:
                found.append(int(entry))
    return found


@pytest.mark.timeout(120)
def test_processes_a_script_leaves_behind_end_with_the_job(home, tmp_path):
    d = tmp_path / "escaper"
    d.mkdir()
    (d / "train.py").write_text(ESCAPER)
    tag = f"escape-{os.getpid()}-{time.monotonic_ns()}"
    started = time.monotonic()
    proc = cli("submit", "train.py", "--source-dir", str(d), "--job-name", "escaper", "--", tag)
    took = time.monotonic() - started
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert took < 60, f"the job waited for its stray processes ({took:.0f} s)"
        deadline = time.monotonic() + 10
        while _sleepers(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _sleepers(tag) == []
        assert "ended 3 process(es) the script left running" in cli("logs", "escaper").stdout
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, 9)


# -- 8. unreadable records ----------------------------------------------------------------

CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "binary": lambda text: "\udcff\udcfe" + text,
    "not-an-object": lambda text: "[1, 2, 3]",
    "wrong-schema": lambda text: json.dumps({**json.loads(text), "state": 42}),
    "newer-version": lambda text: json.dumps(
        {**json.loads(text), "trainctl_version": "99.0", "new_field": 1}
    ),
}
COMMANDS = [
    ["status", "{job}"],
    ["status", "{job}", "-o", "json"],
    ["logs", "{job}"],
    ["artifacts", "{job}"],
    ["metrics", "{job}"],
    ["stop", "{job}"],
    ["attach", "{job}"],
]


@pytest.mark.timeout(180)
def test_an_unreadable_job_is_removed_only_when_asked_and_not_held(home, src):
    finished_job(home, src, "good")
    record = store_root(home) / "jobs" / "good" / "job.json"
    text = record.read_text()
    for kind, corrupt in CORRUPTIONS.items():
        d = record.parent.parent / kind
        d.mkdir()
        (d / "job.json").write_bytes(corrupt(text).encode("utf-8", "surrogateescape"))
    # (every command naming them, the listing and the dashboard: tests/security/
    # test_batteries.py, 35 kinds of damage, these among them)
    # rm: refused by name alone (its state is unknown), deleted with --unreadable, except
    # while a controller holds it (here: a live lease of this test's own process).
    refused = one_line_error(cli("rm", "--yes", "truncated", "good"))
    assert "`trainctl rm --unreadable truncated`" in refused, refused
    held = store_root(home) / "jobs" / "binary" / "lease.json"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    lease = {"host": socket.gethostname(), "pid": os.getpid(), "renewed_at": time.time()}
    held.write_text(json.dumps({**lease, "boot_id": boot}))
    refused = one_line_error(cli("rm", "--yes", "--unreadable", "binary", "truncated"))
    assert "binary's record cannot be read but a controller holds it" in refused, refused
    assert (store_root(home) / "jobs" / "truncated" / "job.json").exists(), "none or all"
    # A lease that is not one trainctl wrote holds nothing, and breaks no command.
    (store_root(home) / "jobs" / "good" / "lease.json").write_text(
        json.dumps({"host": socket.gethostname(), "pid": [1], "renewed_at": "soon"})
    )
    assert cli("status", "good").returncode == 0
    gone = [k for k in CORRUPTIONS if k != "binary"]
    removed = cli("rm", "--yes", "--unreadable", "good", *gone)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.split() == [w for name in ["good", *gone] for w in ("removed", name)]
    assert sorted(p.name for p in (store_root(home) / "jobs").iterdir()) == ["binary"]


# -- 9. input limits ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_odd_input_through_the_python_api_is_one_error(home, src):
    """(Every flag and job file: tests/security/test_batteries.py.)"""
    from trainctl import Estimator
    from trainctl.errors import SpecError

    deep: dict = {}
    inner = deep
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(SpecError, match="nested more than"):
        Estimator(entry_point="train.py", source_dir=str(src), hyperparameters={"x": deep}).fit()


# -- 10. safe restore ---------------------------------------------------------------------


class _Planted:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PLANTED_MARK']}",))


@pytest.mark.timeout(60)
def test_a_planted_checkpoint_cannot_run_code_on_restore(tmp_path, monkeypatch):
    import torch

    from trainctl.train import Checkpointer, TrainContext
    from trainctl.train.checkpoint import CheckpointContentError

    mark = tmp_path / "code-ran"
    monkeypatch.setenv("PLANTED_MARK", str(mark))
    ctx = TrainContext(rank=0, world_size=1, checkpoint_dir=tmp_path / "ckpt")
    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(ctx=ctx)
    step_dir = ckpt.save(1, model=model)
    ckpt.wait()
    state = torch.load(step_dir / "state.pt", weights_only=True)
    torch.save({**state, "extra": _Planted()}, step_dir / "state.pt")  # someone rewrites it
    with pytest.raises(CheckpointContentError, match="weights_only=False"):
        Checkpointer(ctx=ctx).restore(model=torch.nn.Linear(2, 2))
    assert not mark.exists(), "restoring a planted checkpoint ran its code"
