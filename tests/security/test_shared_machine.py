"""Trust on a machine many users share (issue 58), tried as a hostile user or a careless
script would: links and special files planted where trainctl reads, lists, serves and
deletes; secrets on command lines every user can read; values that would add lines to a
batch script. Each case failed before the fix it tests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import TRAINCTL, free_port
from tests.security.test_trust_boundaries import cli, one_line_error, snapshot, store_root

pytestmark = pytest.mark.e2e

PASSWORD = "hunter2-shared-machine"
DECLARED = "opaque-declared-value-77"

# A script that looks at every process of the machine while it runs: no command line may
# hold either secret, and its own arguments must (read from the owner-only file).
PROBE = """\
import os, sys
secrets_ = [os.environ["PROBE_A"], os.environ["PROBE_B"]]
seen = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().decode(errors="replace")
        except OSError:
            continue
        seen += [line.split("\\0")[:3] for s in secrets_ if s in line]
print("cmdlines-with-a-secret", len(seen), seen, flush=True)
print("argv-holds-both", all(s in sys.argv for s in secrets_), flush=True)
print("argv0", os.path.basename(sys.argv[0]), __name__, flush=True)
"""


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "train.py").write_text(
        "import os, pathlib, sys\n"
        "print('args', sys.argv[1:], flush=True)\n"
        "pathlib.Path(os.environ['SM_MODEL_DIR'], 'model.txt').write_text('weights')\n"
        "pathlib.Path(os.environ['SM_OUTPUT_DATA_DIR'], 'metrics.json').write_text('{}')\n"
    )
    return d


def finished(src: Path, name: str, *extra: str) -> None:
    proc = cli("submit", "train.py", "--source-dir", str(src), "--job-name", name, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _get(port: int, path: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.timeout(180)
def test_links_planted_in_a_jobs_output_and_logs_are_never_followed(home, src, tmp_path):
    finished(src, "victim", "-p", f"password={PASSWORD}")
    shared = tmp_path / "scratch"  # a shared output location another user can write in
    finished(src, "planted", "--output-path", shared.as_uri())
    record = store_root(home) / "jobs" / "victim" / "job.json"
    assert PASSWORD in record.read_text()
    outputs = [p for p in shared.rglob("model.tar.gz")]
    assert len(outputs) == 1, list(shared.rglob("*"))
    (outputs[0].parent / "leak.json").symlink_to(record)
    (outputs[0].parent / "passwd").symlink_to("/etc/passwd")
    logs = store_root(home) / "jobs" / "planted" / "logs"
    (logs / "leak.log").symlink_to(record)
    (logs / "via-dir").symlink_to(record.parent, target_is_directory=True)

    got = tmp_path / "got"
    for path in ("output/leak.json", "output/passwd", "logs/leak.log", "logs/via-dir/job.json"):
        proc = cli("artifacts", "planted", "get", path, str(got / path.replace("/", "_")))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (path, proc.stderr)
    assert not got.exists() or not any(got.rglob("*")), list(got.rglob("*"))
    listing = cli("artifacts", "planted", "-o", "json")
    assert listing.returncode == 0, listing.stderr
    assert "leak" not in listing.stdout and "passwd" not in listing.stdout, listing.stdout
    ok = cli("artifacts", "planted", "get", "output/model.tar.gz", str(got / "model.tar.gz"))
    assert ok.returncode == 0 and (got / "model.tar.gz").stat().st_size > 0, ok.stderr

    port = free_port()
    ui = subprocess.Popen([TRAINCTL, "ui", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stderr is not None and ui.stderr.readline().startswith("trainctl ui:")
        for path in ("output/leak.json", "output/passwd", "logs/leak.log", "logs/via-dir/job.json"):
            status, body = _get(port, f"/api/jobs/planted/files/{path}")
            assert status == 404 and PASSWORD.encode() not in body and b"root:" not in body, (
                path,
                status,
                body[:200],
            )
        status, body = _get(port, "/api/jobs/planted/artifacts")
        assert status == 200 and b"leak" not in body, body[:300]
    finally:
        ui.terminate()
        ui.wait(timeout=10)


@pytest.mark.timeout(120)
def test_special_files_in_the_store_hang_no_command(home, src):
    finished(src, "fine")
    jobs = store_root(home) / "jobs"
    (jobs / "fifo").mkdir()
    os.mkfifo(jobs / "fifo" / "job.json")
    (jobs / "fifo" / "events.jsonl").write_text("{}\n")
    (jobs / "zero").mkdir()
    (jobs / "zero" / "job.json").symlink_to("/dev/zero")
    (jobs / "zero" / "events.jsonl").write_text("{}\n")
    claims = store_root(home) / ".trainctl" / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    os.mkfifo(claims / ("0" * 64 + ".json"))

    listed = cli("jobs", "-o", "json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    states = {j["name"]: j["state"] for j in json.loads(listed.stdout)}
    assert states == {"fine": "Completed", "fifo": "Unreadable", "zero": "Unreadable"}, states
    assert cli("jobs", timeout=30).returncode == 0
    assert cli("gc", timeout=30).returncode == 0
    # Submitting with a checkpoint location takes a claim beside the FIFO.
    ck = store_root(home).parent / "ck"
    finished(src, "claims", "--checkpoint-s3-uri", ck.as_uri())
    for name in ("fifo", "zero"):
        gone = cli("rm", "--unreadable", "-y", name, timeout=30)
        assert gone.returncode == 0, gone.stderr
        assert not (jobs / name).exists()
    assert Path("/dev/zero").exists()


@pytest.mark.timeout(120)
def test_rm_of_an_alias_never_deletes_the_job_it_points_to(home, src):
    finished(src, "s1")
    jobs = store_root(home) / "jobs"
    before = snapshot(jobs / "s1")
    (jobs / "alias").symlink_to(jobs / "s1", target_is_directory=True)
    for argv in (["rm", "-y", "alias"], ["rm", "--unreadable", "-y", "alias"]):
        proc = cli(*argv, timeout=30)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert snapshot(jobs / "s1") == before, argv
    listed = json.loads(cli("jobs", "-o", "json").stdout)
    assert [j["name"] for j in listed] == ["s1"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("distribution", ["none", "torch_distributed"])
def test_secret_hyperparameters_are_on_no_command_line(home, tmp_path, distribution):
    """While the job runs, its script reads every process's command line on the machine:
    neither secret is there (not the agent's, launcher's, torchrun's or a worker's), yet
    its own sys.argv holds both, as `python train.py --password ...` would give them."""
    src = tmp_path / "probe"
    src.mkdir()
    (src / "train.py").write_text(PROBE)
    job = tmp_path / "job.yaml"  # (a secret typed on submit's own command line is in ps)
    job.write_text(
        json.dumps(
            {
                "hyperparameters": {"password": PASSWORD, "opaque": DECLARED},
                "secret_hyperparameters": ["opaque"],
                "environment": {"PROBE_A": PASSWORD, "PROBE_B": DECLARED},
                "secret_env": ["PROBE_B"],
            }
        )
    )
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--job-name", "probe", "-f", str(job),
        "--instance-count", "2", "--distribution", distribution,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = cli("logs", "probe")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.count("cmdlines-with-a-secret 0") >= 2, logs.stdout
    assert logs.stdout.count("argv-holds-both True") >= 2, logs.stdout
    assert logs.stdout.count("argv0 train.py __main__") >= 2, logs.stdout


@pytest.mark.timeout(60)
def test_a_slurm_node_dir_adds_no_line_to_the_batch_script(home, src):
    for value in ("/scratch/x\ntouch /tmp/pwned", "relative/dir", " ", "/a b", "/x/../etc"):
        proc = cli(
            "submit", "train.py", "--source-dir", str(src), "--instance-type", "slurm",
            "--slurm-node-dir", value, "--dry-run",
        )  # fmt: skip
        assert "slurm.node_dir: " in one_line_error(proc), (value, proc.stderr)
    assert not Path("/tmp/pwned").exists()


@pytest.mark.timeout(30)
def test_the_dashboards_token_comes_from_a_private_file(tmp_path):
    from trainctl.errors import SpecError
    from trainctl.ui import read_token_file

    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-four-chars\n")
    token.chmod(0o644)
    with pytest.raises(SpecError, match="readable by other users"):
        read_token_file(token)
    token.chmod(0o600)
    assert read_token_file(token) == "a-token-of-twenty-four-chars"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        read_token_file(fifo)


@pytest.mark.timeout(180)
def test_a_checkpoint_location_swapped_for_a_link_after_submit_is_refused(home, src, tmp_path):
    """Submit resolves and claims the location; the node finds it leads elsewhere now (a
    link to a running job's checkpoints, or the user's own `latest` moved) and writes,
    restores and prunes nothing there."""
    from trainctl.controller.submit import create_job, start_detached
    from trainctl.controller.supervise import supervise
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    theirs = tmp_path / "runs" / "run-7"
    theirs.mkdir(parents=True)
    (theirs / "epoch-3.pt").write_bytes(b"their weights")
    before = snapshot(theirs)
    latest = tmp_path / "runs" / "latest"
    latest.mkdir()  # empty at submit: the job's
    store = open_store(store_root(home).as_uri())
    spec = build_spec(
        entry_point="train.py", source_dir=str(src), job_name="swapped",
        checkpoint_s3_uri=latest.as_uri(), max_restarts=2,
    )  # fmt: skip
    record = create_job(spec, store)
    latest.rmdir()
    latest.symlink_to(theirs, target_is_directory=True)
    start_detached(store, record)
    final = supervise(store, "swapped", timeout=120)
    assert final.state.value == "Failed", final.state
    assert "not the place claimed" in (final.failure_reason or ""), final.failure_reason
    assert len(final.attempts) == 1, "a refusal is not retried"
    assert snapshot(theirs) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("swap", ["link", "folder"])
def test_an_output_path_swapped_while_the_job_runs_gets_none_of_its_outputs(home, tmp_path, swap):
    """A writer of the shared folder moves the job's --output-path away while it trains and
    puts a link to another job's outputs (or a folder of their own) in its place: the node
    opened the location when it checked it, and uploads into that folder or nowhere."""
    shared, theirs = tmp_path / "scratch" / "out", tmp_path / "theirs"
    shared.mkdir(parents=True)
    theirs.mkdir()
    code = tmp_path / "swapper"
    code.mkdir()
    # (The job's own script plays the other writer: it runs while the job trains.)
    (code / "train.py").write_text(
        "import os, pathlib\n"
        f"shared, theirs = pathlib.Path({str(shared)!r}), pathlib.Path({str(theirs)!r})\n"
        "shared.rename(shared.with_name('moved'))\n"
        f"shared.symlink_to(theirs) if {swap!r} == 'link' else shared.mkdir()\n"
        "pathlib.Path(os.environ['SM_MODEL_DIR'], 'model.pt').write_bytes(b'weights')\n"
    )
    proc = cli(
        "submit", "train.py", "--source-dir", str(code), "--job-name", f"swap-{swap}",
        "--output-path", shared.as_uri(), "-o", "json",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = json.loads(cli("status", f"swap-{swap}", "-o", "json").stdout)["failure_reason"]
    assert reason.startswith("algo-1: uploading outputs failed"), reason
    assert "trainctl opens no link" in reason or "no longer the folder it was" in reason, reason
    assert list(theirs.iterdir()) == []  # not even the failure note: no claim leads there
    if swap == "folder":  # the path the user named, now a folder of the other writer's
        written = sorted(p.relative_to(shared).as_posix() for p in shared.rglob("*.*"))
        assert "swap-folder/output/model.tar.gz" not in written, written


@pytest.mark.timeout(30)
def test_a_pinned_store_refuses_a_root_swapped_between_two_writes(tmp_path):
    from trainctl.errors import StoreError
    from trainctl.store import LocalStore

    root, other = tmp_path / "ck", tmp_path / "other"
    other.mkdir()
    (other / "keep.pt").write_bytes(b"theirs")
    pinned = LocalStore(root, pinned=True)
    pinned.put_bytes("a.pt", b"mine")
    root.rename(tmp_path / "moved")
    root.symlink_to(other, target_is_directory=True)
    with pytest.raises(StoreError):
        pinned.put_bytes("b.pt", b"mine")
    pinned.delete("keep.pt")
    assert list(pinned.list()) == []
    assert sorted(p.name for p in other.iterdir()) == ["keep.pt"]
    root.unlink()
    root.mkdir()  # a real folder, but not the one first used
    with pytest.raises(StoreError):
        pinned.put_bytes("c.pt", b"mine")


REWRITER = (
    "import os, pathlib, sys\n"
    "failed = []\n"
    "for p in pathlib.Path(os.environ['SM_CHANNEL_M']).rglob('*'):\n"
    "    if p.is_file():\n"
    "        try:\n"
    "            p.write_bytes(b'rewritten')\n"
    "        except OSError as exc:\n"
    "            failed.append(exc.strerror)\n"
    "print('REFUSED', sorted(set(failed)), flush=True)\n"
)


@pytest.mark.timeout(180)
def test_fastfile_over_another_jobs_output_cannot_rewrite_it(home, src, tmp_path):
    """Another job's output read FastFile: inside the store it is copied; on a shared
    --output-path (outside the store) it is linked, and read-only in the reader's view, as
    SageMaker's FastFile mount is. Either way the producer's files stay as they were."""
    shared = tmp_path / "scratch"
    finished(src, "producer")
    finished(src, "elsewhere", "--output-path", shared.as_uri())
    in_store = store_root(home) / "jobs" / "producer" / "output"
    outside = shared / "elsewhere" / "output"
    writer = tmp_path / "writer"
    writer.mkdir()
    (writer / "train.py").write_text(REWRITER)
    for name, out in (("reader", in_store), ("reader-2", outside)):
        before = snapshot(out)
        assert before, f"the producer left no output in {out}"
        proc = cli(
            "submit", "train.py", "--source-dir", str(writer), "--job-name", name,
            "--inputs", f"m={out.as_uri()}", "--input-mode", "m=FastFile",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert snapshot(out) == before, name
        log = cli("logs", name).stdout
        if out == in_store:
            assert "copied, not linked" in log
        else:
            assert "FastFile: read in place, read-only" in log
            assert "REFUSED ['Read-only file system']" in log
    # Its owner still writes it: the read-only view was the reader's alone.
    (outside / "model.tar.gz").write_bytes(b"the owner's")


@pytest.mark.timeout(120)
def test_control_sequences_of_a_job_never_reach_the_terminal(home, tmp_path):
    """A script's log, its failure and a hyperparameter hold sequences that retitle the
    window, clear the screen and set the clipboard: `logs`, `status` and `events` show
    them as text (and keep a script's colours apart from that)."""
    src = tmp_path / "esc"
    src.mkdir()
    (src / "train.py").write_text(
        "import sys\n"
        "print('title \\x1b]0;pwned\\x07 clear \\x1b[2J \\x9b2J', flush=True)\n"
        "print('red \\x1b[31mred\\x1b[0m', flush=True)\n"
        "sys.exit('failed \\x1b]52;c;ZXZpbA==\\x07')\n"
    )
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--job-name", "esc",
        "-p", "note=\x1b[2Jhidden",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    env = {**os.environ, "FORCE_COLOR": "1"}  # colours on a pipe: SGR may appear, no other
    for argv in (["logs", "esc"], ["status", "esc"], ["events", "esc"]):
        out = cli(*argv, env=env)
        raw = out.stdout + out.stderr
        for bad in ("\x1b]", "\x1b[2J", "\x07", "\x9b"):
            assert bad not in raw, (argv, bad, raw[-600:])
    assert "\\x1b]0;pwned" in cli("logs", "esc").stdout
    assert "\\x1b]52;c;" in cli("status", "esc").stdout


@pytest.mark.timeout(120)
def test_a_refused_submit_makes_nothing_in_the_other_jobs_location(home, src, tmp_path):
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    theirs = tmp_path / "loc" / "ck"
    theirs.mkdir(parents=True)
    spec = build_spec(
        entry_point="train.py", source_dir=str(src), job_name="holder",
        checkpoint_s3_uri=theirs.as_uri(),
    )  # fmt: skip
    create_job(spec, open_store(store_root(home).as_uri()))  # Pending: its claim is live
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "loc" in p.parts)
    for flag, value in (
        ("--tensorboard-s3-uri", theirs / "tb"),
        ("--output-path", theirs / "out"),
        ("--code-location", theirs / "code"),
        ("--checkpoint-s3-uri", theirs / "sub"),
    ):
        proc = cli("submit", "train.py", "--source-dir", str(src), flag, Path(value).as_uri())
        assert "overlaps" in one_line_error(proc), proc.stderr
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "loc" in p.parts)
    assert after == before


NOSY = """\
import json, os, pathlib, sys
victim = pathlib.Path(sys.argv[sys.argv.index("--victim") + 1])
me = pathlib.Path(os.environ["SM_MODEL_DIR"]).parents[2]  # the node's root
other = me.parent / ("node-1" if me.name == "node-0" else "node-0")
tries = {
    "read-record": lambda: victim.read_text(),
    "write-record": lambda: victim.write_text("rewritten by intruder"),
    "list-home": lambda: [p for p in pathlib.Path(os.environ["TRAINCTL_HOME"]).rglob("*")
                          if p.is_file() and not p.is_relative_to(me)],
    "other-node": lambda: os.listdir(other),
}
for name, attempt in tries.items():
    try:
        got = attempt()
        print("reached", name, bool(got), flush=True)
    except OSError as exc:
        print("refused", name, type(exc).__name__, flush=True)
print("layout", os.path.exists("/opt/ml/input/config/hyperparameters.json"),
      os.path.isdir("/opt/ml/checkpoints"), os.path.isdir("/dev/shm"), flush=True)
pathlib.Path("/opt/ml/model/m.txt").write_text("weights")
"""


@pytest.mark.timeout(180)
def test_a_local_jobs_script_sees_only_its_own_node(home, src, tmp_path):
    finished(src, "victim", "-p", f"password={PASSWORD}")
    record = store_root(home) / "jobs" / "victim" / "job.json"
    before = record.read_bytes()
    nosy = tmp_path / "nosy"
    nosy.mkdir()
    (nosy / "train.py").write_text(NOSY)
    proc = cli(
        "submit", "train.py", "--source-dir", str(nosy), "--job-name", "nosy",
        "--instance-count", "2", "-p", f"victim={record}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = cli("logs", "nosy").stdout
    assert "reached" not in log.replace("reached list-home False", ""), log
    for name in ("read-record", "write-record", "other-node"):
        assert log.count(f"refused {name}") == 2, (name, log)
    assert log.count("layout True True True") == 2, log
    assert record.read_bytes() == before
    assert (store_root(home) / "jobs" / "nosy" / "output" / "model.tar.gz").is_file()


WAITER = """\
import os, pathlib, time
print("ready", flush=True)
go = pathlib.Path(os.environ["GO_FILE"])
deadline = time.time() + 90
while not go.exists() and time.time() < deadline:
    time.sleep(0.1)
"""
ENV_SECRET = "env-secret-value-4242"


@pytest.mark.timeout(240)
def test_another_user_of_the_machine_sees_no_secret_of_a_running_job(monkeypatch):
    """The job's owner keeps trainctl's home in a folder other users may traverse (0755,
    as many homes are); while a 2-node torchrun job with a secret hyperparameter, a
    declared one and a secret variable runs, a second account reads every command line,
    every environment and every file it can under /tmp, /var/tmp, /dev/shm, /run and the
    homes: no secret anywhere."""
    from tests.helpers import wait_no_leftovers
    from tests.rigs.other_user import other_user, scan_as

    with other_user() as user:
        shared = Path(tempfile.mkdtemp(prefix="trainctl-shared-"))
        try:
            shared.chmod(0o755)
            home = shared / "home"
            monkeypatch.setenv("TRAINCTL_HOME", str(home))
            monkeypatch.delenv("TRAINCTL_STORE", raising=False)
            src = shared / "src"
            src.mkdir()
            (src / "train.py").write_text(WAITER)
            go = shared / "go"
            job = shared / "job.yaml"  # the user's own file of secrets: theirs alone
            job.touch(mode=0o600)
            job.write_text(
                json.dumps(
                    {
                        "hyperparameters": {"password": PASSWORD, "opaque": DECLARED},
                        "secret_hyperparameters": ["opaque"],
                        "environment": {"GO_FILE": str(go), "MY_API_KEY": ENV_SECRET},
                    }
                )
            )
            proc = cli(
                "submit", "train.py", "--source-dir", str(src), "--job-name", "secretive",
                "-f", str(job), "--instance-count", "2", "--distribution", "torch_distributed",
                "-d",
            )  # fmt: skip
            assert proc.returncode == 0, proc.stdout + proc.stderr
            deadline = time.monotonic() + 90
            while cli("logs", "secretive").stdout.count("ready") < 2:
                assert time.monotonic() < deadline, cli("logs", "secretive").stdout
                time.sleep(0.5)
            seen = scan_as(user, [PASSWORD, DECLARED, ENV_SECRET])
            go.touch()
            while json.loads(cli("status", "secretive", "-o", "json").stdout)["state"] not in (
                "Completed", "Failed", "Stopped",
            ):  # fmt: skip
                assert time.monotonic() < deadline + 60
                time.sleep(0.5)
            assert seen["found"] == [], seen
            assert seen["files_read"] > 0, seen
            assert not wait_no_leftovers(home=home)
        finally:
            shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_local_checkpoint_path_through_a_link_to_a_system_folder_is_refused(home, src, tmp_path):
    link = tmp_path / "ck"
    link.symlink_to("/usr/share", target_is_directory=True)
    before = sorted(os.listdir("/usr/share"))
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--job-name", "linked",
        "--checkpoint-local-path", str(link),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    info = json.loads(cli("status", "linked", "-o", "json").stdout)
    assert info["state"] == "Failed" and "a link to /usr/share" in info["failure_reason"], info
    assert len(info["attempts"]) == 1
    assert sorted(os.listdir("/usr/share")) == before
