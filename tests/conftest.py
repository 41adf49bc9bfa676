"""Shared fixtures: an isolated TRAINCTL_HOME per test and a check that nothing is left."""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.imds_server import imds_server  # noqa: F401  (the IMDS stand-in fixture)
from tests.registry import (  # noqa: F401  (image registry and isolated podman storage)
    podman_storage,
    readonly_registry,
    registry,
)
from trainctl.provisioning.base import free_port  # noqa: F401  (shared by tests)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = REPO / "examples"
TRAINCTL = str(Path(sys.executable).parent / "trainctl")


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


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """TRAINCTL_HOME in a temp dir; after the test, no process of any job may survive."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    monkeypatch.delenv("TRAINCTL_STORE", raising=False)
    yield home
    left = wait_no_leftovers(home=home)
    for pid in left:  # clean up before failing so one bad test does not poison the rest
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left behind: {left}"
    nodes = home / "nodes"
    assert not nodes.exists() or not any(nodes.iterdir()), "node directories left behind"


RELAUNCHED_SECRET = "dashboard-must-not-show-this-s3cr3t"


@pytest.fixture(scope="session")
def relaunched_digits(tmp_path_factory):
    """One finished 2-node digits job, relaunched once (node 1 killed 8 s into training),
    with a secret in its environment: (home, job). Made once per session and shared by
    the tests that only read it (the metric history from the CLI, the dashboard)."""
    from tests.test_fault_tolerance import digits

    home = tmp_path_factory.mktemp("relaunched-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINCTL_HOME", str(home))
    mp.delenv("TRAINCTL_STORE", raising=False)
    try:
        job = digits(
            step_delay=0.05,
            faults=["kill:1@8"],
            environment={"WANDB_API_KEY": RELAUNCHED_SECRET},
        ).fit(logs=False)
        info = job.describe()
        assert info["state"] == "Completed" and len(info["attempts"]) == 2, info["attempts"]
        assert not wait_no_leftovers(home=home), "the shared job left processes behind"
        yield home, job
    finally:
        mp.undo()


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


@pytest.fixture
def source(tmp_path) -> callable:
    """Copy a fixture script directory into tmp_path and return its path."""

    def make(name: str) -> Path:
        dest = tmp_path / "src" / name
        shutil.copytree(FIXTURES / name, dest)
        return dest

    return make


# (under pytest's own cache directory: nothing of the suite's is written into the repository)
SESSION_MARKER = REPO / ".pytest_cache" / "session-finished"


class OffLoopbackError(OSError):
    """A test's own process tried to reach an address outside 127.0.0.0/8 (or ::1)."""


def _loopback_only(connect):
    def guarded(sock, address, *args):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                allowed = ipaddress.ip_address(host).is_loopback
            except ValueError:  # a name: only localhost (urllib3 connects to resolved IPs)
                allowed = host == "localhost"
            if not allowed:
                raise OffLoopbackError(
                    errno.ENETUNREACH, f"test traffic goes to loopback only, not {address}"
                )
        return connect(sock, address, *args)

    return guarded


def _local_names_only(getaddrinfo):
    local = {"localhost", socket.gethostname()}

    def guarded(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in local:
            try:
                ipaddress.ip_address(name)
            except ValueError:  # a DNS name: resolving it would already leave the machine
                raise socket.gaierror(
                    socket.EAI_NONAME, f"test traffic goes to loopback only, not {name}"
                ) from None
        return getaddrinfo(host, *args, **kwargs)

    return guarded


@pytest.fixture(autouse=True, scope="session")
def loopback_only():
    """Every connection the test process makes stays on loopback: a code path that would
    reach AWS (a credential lookup at 169.254.169.254, an ECR call) fails instead of
    leaving the machine, and so does a DNS lookup of any name but this machine's.
    (Subprocesses are not covered; their tests say where they go.)"""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _loopback_only(socket.socket.connect))
        patch.setattr(socket.socket, "connect_ex", _loopback_only(socket.socket.connect_ex))
        patch.setattr(socket, "getaddrinfo", _local_names_only(socket.getaddrinfo))
        yield


def pytest_sessionstart(session) -> None:
    SESSION_MARKER.unlink(missing_ok=True)


def pytest_sessionfinish(session, exitstatus) -> None:
    # `make test` checks this exists: code under test that ends the process (os._exit in a
    # training helper, say) must not pass for a green run.
    SESSION_MARKER.parent.mkdir(exist_ok=True)
    SESSION_MARKER.write_text(f"{exitstatus}\n")


@pytest.fixture
def sshd(home, tmp_path):
    """Two real sshd servers, on 127.0.0.2 and 127.0.0.3 (`sshd.start("127.0.0.4")` for
    more), each with its own host key and HOME under tmp_path (tests/sshd.py). At teardown
    the servers stop and anything started through them that is still running is killed -
    and fails the test."""
    from tests.sshd import SshdFarm, require_sshd

    require_sshd()
    farm = SshdFarm(tmp_path / "sshd")
    try:
        farm.start("127.0.0.2")
        farm.start("127.0.0.3")
        yield farm
    finally:
        left = farm.stop_all()
    assert not left, f"processes started over ssh left running: {left}"


def digits_estimator(hyperparameters: dict, /, **fields):
    """examples/digits as a 2-node torchrun job, with the given fields on top (those
    include `hyperparameters` to replace the default ones)."""
    from trainctl import Estimator

    base = {
        "entry_point": "train.py",
        "source_dir": str(EXAMPLES / "digits"),
        "instance_count": 2,
        "hyperparameters": hyperparameters,
        "distribution": {"torch_distributed": {"enabled": True}},
    }
    return Estimator(**{**base, **fields})
