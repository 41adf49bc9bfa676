"""Shared fixtures: an isolated TRAINCTL_HOME per test and a check that nothing is left; the
session's hooks. Helpers that are not fixtures live in tests/helpers.py."""

from __future__ import annotations

import errno
import gc
import ipaddress
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, RELAUNCHED_SECRET, REPO, wait_no_leftovers
from tests.rigs.imds_server import imds_server  # noqa: F401  (the IMDS stand-in fixture)
from tests.rigs.registry import (  # noqa: F401  (image registry and isolated podman storage)
    module_registry,
    podman_storage,
    private_registry,
    readonly_registry,
    registry,
)

# moto's EC2 starts every region with its ~1,300 current public AMIs: each reset rebuilds them
# (0.15 CPU-s a test under mock_aws) and each `describe_images(Owners=["amazon"])` answers
# 1.2 MB (2 CPU-s, server and client, per stand-in cloud). Its 44 long-standing AMIs are what
# the tests use; set before anything imports moto, which reads it once.
os.environ.setdefault("MOTO_AMIS_PATH", str(FIXTURES / "moto-amis.json"))

# The nodes' store schedule at a test's pace, not a user's (docs/benchmarks.md, "Scale"):
# the relayed notices (an injected fault, a relaunch by choice) reach a node within a second,
# and its log is in the store within a second, where the defaults (10 s each, for a budget
# of under 1,000 store requests a node-hour) would add seconds to many tests. The defaults
# are measured by bench/scale.py and its test (tests/e2e/test_scale_harness.py).
os.environ.setdefault("TRAINCTL_CONTROL_POLL_SECONDS", "1")
os.environ.setdefault("TRAINCTL_LOG_SYNC_SECONDS", "1")

# A test process holds torch, moto, boto3 and the in-process moto servers: a heap of millions
# of objects, which the default thresholds have the collector walk whole thousands of times a
# run (measured: 20-45% of a worker's CPU). Young collections ten times rarer and full ones
# after 100 middle ones, not 10: the collector's share falls to ~10%, on two cores shared with
# the jobs under test. (The test processes only; the jobs' own processes are left alone.)
gc.set_threshold(10_000, 20, 100)


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


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TRAINCTL_HOME in tmp_path (its store is where a job would go); cwd is tmp_path."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    monkeypatch.delenv("TRAINCTL_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A source dir with train.py (and a script outside it, next to it)."""
    d = tmp_path / "src"
    d.mkdir()
    (d / "train.py").write_text("print('hi')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    return d


@pytest.fixture(scope="session")
def relaunched_digits(tmp_path_factory, worker_id):
    """One finished 2-node digits job, relaunched once (node 1 killed once the script
    reported step 25: a condition, so attempt 1 has a loss curve on any machine), with a
    secret in its environment: (home, job). Made once per test run and shared by the tests
    that only read it (the metric history from the CLI, the dashboard): under xdist the
    first worker to need it makes it while any other waits on a lock, then reads it (a
    minute of two cores saved per worker that would have made its own)."""
    import fcntl
    import json

    from tests.train.test_fault_tolerance import digits
    from trainctl.estimator import TrainingJob

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base  # the run's root, under xdist
    made = shared / "relaunched-digits.json"
    mp = pytest.MonkeyPatch()
    mp.delenv("TRAINCTL_STORE", raising=False)
    try:
        with open(shared / "relaunched-digits.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
            if made.exists():  # another worker made it
                found = json.loads(made.read_text())
                home = Path(found["home"])
                mp.setenv("TRAINCTL_HOME", str(home))
                job = TrainingJob(found["job"])
            else:  # (a worker whose try failed leaves no record: the next makes its own)
                home = tmp_path_factory.mktemp("relaunched-home")
                mp.setenv("TRAINCTL_HOME", str(home))
                job = digits(
                    step_delay=0.05,
                    faults=["kill:1@step25"],
                    environment={"WANDB_API_KEY": RELAUNCHED_SECRET},
                ).fit(logs=False)
                info = job.describe()
                assert info["state"] == "Completed" and len(info["attempts"]) == 2, info
                assert not wait_no_leftovers(home=home), "the shared job left processes behind"
                made.write_text(json.dumps({"home": str(home), "job": job.name}))
        yield home, job
    finally:
        mp.undo()


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
    from tests.rigs.sshd import SshdFarm, require_sshd

    require_sshd()
    farm = SshdFarm(tmp_path / "sshd")
    try:
        farm.start("127.0.0.2")
        farm.start("127.0.0.3")
        yield farm
    finally:
        left = farm.stop_all()
    assert not left, f"processes started over ssh left running: {left}"


# A session fixture (a node image, a reference run) is made once for the tests that share it,
# within its own bound, and is not charged to whichever test asks for it first: that test's
# timeout is sized for its own work, and a slow machine made the podman image (105 s) take
# most of its test's 150 s.
SHARED_FIXTURE_TIMEOUT = 600.0


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """While a session-scoped fixture is set up, pytest-timeout's alarm (the signal method's
    ITIMER_REAL) gives it SHARED_FIXTURE_TIMEOUT; the test then has what it had left."""
    left = signal.getitimer(signal.ITIMER_REAL)[0] if fixturedef.scope == "session" else 0.0
    if left > 0:
        signal.setitimer(signal.ITIMER_REAL, SHARED_FIXTURE_TIMEOUT)
    try:
        yield
    finally:
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)


def pytest_terminal_summary(terminalreporter) -> None:
    """One line naming the real parts this machine lacks, with how many tests skipped for
    each (tests.helpers.require_part); nothing when none is missing."""
    import re
    from collections import Counter

    from tests.helpers import MISSING

    parts: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if found := re.search(rf"{MISSING} (\S+):", str(reason)):
            parts[found.group(1)] += 1
    if parts:
        counts = ", ".join(f"{part} ({n} tests)" for part, n in sorted(parts.items()))
        terminalreporter.write_line(
            f"skipped for a missing part: {counts}; `make test-deps` installs them",
            yellow=True,
        )


# Each real part a test needs is a marker (`pytest -m "not podman"` leaves those out), set
# from the rig fixtures the test uses; tests that reach a part without a fixture say so
# with the marker itself (mpirun, chromium, kernel).
PART_FIXTURES = {
    "sshd": ("sshd", "cloud"),
    "podman": (
        "registry",
        "private_registry",
        "readonly_registry",
        "podman_storage",
        "node_image",
        "in_podman",
    ),
    "docker": ("dockerd",),
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if "tests/unit/" in item.nodeid:
            item.add_marker("unit")
        used = set(getattr(item, "fixturenames", ()))
        for part, fixtures in PART_FIXTURES.items():
            if used.intersection(fixtures):
                item.add_marker(part)
