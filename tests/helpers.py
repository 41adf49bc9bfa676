"""Helpers shared by the tests (fixtures are in conftest.py, stand-ins for real parts in
tests/rigs/): paths, reading a terminal or a log, the processes a test left, pointing boto3 at
moto, the digits job every training test starts from, and skipping for a missing part."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from trainctl.provisioning.ports import free_port  # noqa: F401  (shared by tests)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = REPO / "examples"
TRAINCTL = str(Path(sys.executable).parent / "trainctl")
TORCHRUN = {"torch_distributed": {"enabled": True}}
# A skip for a part this machine lacks starts so; the run's last line counts them by part.
MISSING = "missing part"


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_part(part: str, reason: str | None) -> None:
    """Skip the test here when a real part (sshd, podman, chromium...) is missing, naming
    it; under CI a missing part is a failure (`.ci/run` and `make test-deps` install them)."""
    if reason is None:
        return
    if under_ci():
        pytest.fail(f"{part} tests cannot run under CI: {reason}")
    pytest.skip(f"{MISSING} {part}: {reason}")


def require_mpirun() -> None:
    """Skip without Open MPI's mpirun (off CI; a failure under CI)."""
    import shutil

    if shutil.which("mpirun") is None:
        require_part("mpirun", "mpirun not found (apt-get install openmpi-bin)")


def wait_for(condition: Callable[[], object], timeout: float, job, what: str) -> None:
    """Until `condition()` holds, failing at once if `job` ends first (and after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert job.describe()["state"] not in ("Completed", "Failed", "Stopped"), job.describe()
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened: {job.describe()}")


def wait_for_log(job, text: str, timeout: float = 60.0) -> None:
    """Until `text` is in one of the job's node logs (failing early if the job ends)."""
    from trainctl.state import JobState

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in job.store.list(f"jobs/{job.name}/logs"):
            if text in job.store.get_text(info.key):
                return
        assert job.state not in (JobState.FAILED, JobState.COMPLETED), job.describe()
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in the logs")


def uploaded_checkpoint_step(job_name: str) -> int | None:
    """The newest checkpoint step every node has uploaded: the union of the nodes' manifests
    in the job's checkpoint URI holds it whole (its meta.json and every file that lists).
    A node lost without warning takes the checkpoints it had not uploaded with it; a
    relaunch resumes from this step or a newer one, never an older one."""
    import json
    import re

    from trainctl.errors import NotFoundError
    from trainctl.node.checkpoints import stored_files
    from trainctl.record.jobstore import JobStore
    from trainctl.record.locations import checkpoint_store
    from trainctl.store import default_store
    from trainctl.train.checkpoint import META_FILE, step_dir_name

    try:
        store = checkpoint_store(JobStore(default_store(), job_name).load())
    except NotFoundError:
        return None
    listed = stored_files(store)
    metas = {
        int(found[1]): key
        for key in listed
        if (found := re.fullmatch(rf"step-(\d{{9,}})/{re.escape(META_FILE)}", key)) is not None
    }
    for step in sorted(metas, reverse=True):  # the newest whole one
        try:
            meta = json.loads(store.get_text(metas[step]))
        except (NotFoundError, ValueError):
            continue
        if all(f"{step_dir_name(step)}/{name}" in listed for name in meta.get("files", [])):
            return step
    return None


def wait_for_uploaded_checkpoint(
    job_name: str, step: int, timeout: float, alive: Callable[[], bool] = lambda: True
) -> int | None:
    """The newest step every node has uploaded once it is `step` or later (None: not within
    `timeout`, or the job's runner is no longer `alive`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        uploaded = uploaded_checkpoint_step(job_name)
        if uploaded is not None and uploaded >= step:
            return uploaded
        time.sleep(0.3)
    return None


def read_terminal(master: int, proc, timeout: float = 60) -> bytes:
    """What a pty (its `master` side) received until `proc` closed it or ended."""
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    return seen


def log_lines(text: str) -> list[str]:
    """A stored node log's lines without the time each starts with (protocol.split_stamp)."""
    from trainctl.protocol import split_stamp

    return [split_stamp(line)[1] for line in text.splitlines()]


def tagged_processes(home: Path | None = None) -> list[int]:
    """Processes of trainctl jobs or detached controllers of this test's TRAINCTL_HOME
    (other trainctl users on the machine, a benchmark say, are not ours to judge)."""
    from trainctl.procs import CONTROLLER_TAG, JOB_TAG, _environ, _is_zombie, _pids

    home = home or Path(os.environ["TRAINCTL_HOME"])
    return [
        pid
        for pid in _pids()
        if (JOB_TAG in (env := _environ(pid)) or CONTROLLER_TAG in env)
        and env.get("TRAINCTL_HOME") == str(home)
        and not _is_zombie(pid)
    ]


def wait_no_leftovers(timeout: float = 20.0, home: Path | None = None) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = tagged_processes(home)
        if not left:
            return []
        time.sleep(0.2)
    return tagged_processes(home)


RELAUNCHED_SECRET = "dashboard-must-not-show-this-s3cr3t"


def point_aws_at(monkeypatch, endpoint: str, *, key: str = "testing", secret: str = "testing"):
    """The environment that points boto3 (ours and the tests') at a moto server, with
    fake credentials and nothing from the user's own AWS configuration."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)


def digits_estimator(hyperparameters: dict, /, **fields):
    """examples/digits as a 2-node job, with the given fields on top (those include
    `hyperparameters` to replace the default ones, and `distribution=TORCHRUN`).

    One process per node under the plain launcher (SageMaker's no-distribution: the
    script's own `init_process_group` from RANK/WORLD_SIZE/MASTER_*): the same controller,
    agents, checkpoints and faults as under torchrun, without torchrun's start (it imports
    torch: ~3 CPU-s a node and attempt, the suite's largest single cost on CI's two cores).
    A test whose subject is what torchrun does asks for it."""
    from trainctl import Estimator

    base = {
        "entry_point": "train.py",
        "source_dir": str(EXAMPLES / "digits"),
        "instance_count": 2,
        "hyperparameters": hyperparameters,
    }
    return Estimator(**{**base, **fields})


def on_a_terminal(
    env: dict[str, str], *args: str, columns: int = 80, timeout: float = 60
) -> tuple[int, str]:
    """`trainctl ARGS` with stdout and stderr on a pty `columns` wide: (exit code, what the
    terminal received, escape sequences included)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [TRAINCTL, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    try:
        seen = read_terminal(master, proc, timeout)
        return proc.wait(timeout=10), seen.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def zip_bytes(text: str) -> bytes:
    """A whole zip: the container torch.save writes (np.savez and Keras too). Dated once,
    so the same text gives the same bytes (a member dated now differs across a 2-second
    tick: CI compared two "epoch 3" zips made a moment apart)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(zipfile.ZipInfo("archive/data.pkl", (2026, 1, 1, 0, 0, 0)), text)
    return buffer.getvalue()
