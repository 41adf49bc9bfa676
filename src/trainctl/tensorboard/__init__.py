"""TensorBoard over jobs' logs: `trainctl tensorboard JOB [JOB...]` and the dashboard's link.

Each job's nodes copy their TensorBoard directory to the job's TensorBoard location while it
runs (trainctl.node.tensorboard). Here those locations are mirrored into one local directory,
a run per job (a tuning job's trials each a run of their own), again every few seconds while
TensorBoard runs, and the real TensorBoard (the `tensorboard` package) is started over it:
TensorBoard reads local files, not trainctl's store, and this works the same for a file://
and an s3:// store. The mirror takes only objects whose size changed (event files grow), and
goes with the viewer. (What grew is appended to the local copy, which TensorBoard holds open.)

TensorBoard has no login: it runs behind trainctl's door (trainctl.tensorboard.door), which
serves only requests to its loopback address that carry the viewer's token, so another user
of the machine who finds the port sees nothing. The URL it prints carries the token.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path, PurePosixPath
from typing import IO

from trainctl.errors import NotFoundError, SpecError, TrainctlError
from trainctl.store import Store
from trainctl.tensorboard.door import TOKEN_ENV

DEFAULT_PORT = 6006  # TensorBoard's own
REFRESH_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 90.0


def log_sources(store: Store, names: list[str]) -> list[tuple[str, Store]]:
    """(run name, TensorBoard location) of each job named; a tuning job's name gives each of
    its trials. NotFoundError naming the first name that is neither."""
    from trainctl.record.jobstore import JobStore
    from trainctl.record.locations import tensorboard_store
    from trainctl.tuning.record import MAX_TUNING_NAME, TuningStore

    if not names:
        raise SpecError("JOB", "name at least one job (or tuning job)")
    sources: list[tuple[str, Store]] = []
    for name in dict.fromkeys(names):
        jobs = JobStore(store, name)
        if jobs.exists():
            sources.append((name, tensorboard_store(jobs.load())))
            continue
        if len(name) <= MAX_TUNING_NAME and TuningStore(store, name).exists():
            for trial in TuningStore(store, name).load().trials:
                trial_jobs = JobStore(store, trial.job)
                if trial_jobs.exists():
                    sources.append((f"{name}/{trial.job}", tensorboard_store(trial_jobs.load())))
            continue
        raise NotFoundError(f"no job or tuning job named {name!r} in {store.uri}")
    return sources


def _local_path(root: Path, key: str) -> Path | None:
    """Where object `key` goes under `root`; None for a key that would land outside it."""
    parts = PurePosixPath(key).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or key.startswith("/"):
        return None
    return root.joinpath(*parts)


def mirror(sources: list[tuple[str, Store]], root: Path) -> int:
    """Copy each source's objects under root/<run>/ whose size differs from the local copy;
    the number copied. A source that cannot be listed now (an outage) is left for the next
    pass."""
    copied = 0
    for run, source in sources:
        try:
            objects = list(source.list())
        except NotFoundError:
            continue
        for info in objects:
            dest = _local_path(root / run, info.key)
            if dest is None:
                continue
            try:
                have = dest.stat().st_size
            except FileNotFoundError:
                have = None
            if have == info.size:
                continue
            try:
                if have is not None and have < info.size:
                    # Event files only grow: the new end is appended in place. (A new file
                    # in its place is one TensorBoard never reads: it keeps the one it has
                    # open, and would miss every point written after its first read.)
                    tail = source.get_range(info.key, have)
                    with dest.open("ab") as f:
                        f.write(tail)
                else:
                    tmp = dest.with_name(dest.name + ".part")
                    source.get_file(info.key, tmp)
                    tmp.replace(dest)  # never half a file where there was none
            except NotFoundError:
                continue
            copied += 1
    return copied


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_host(host: str) -> None:
    """Loopback only: its door's token travels in plain HTTP, so it never leaves the machine
    (an SSH tunnel carries it elsewhere)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise SpecError(
            "--host",
            f"{host} is not a loopback address: TensorBoard's token would cross the network in "
            "plain HTTP; listen on "
            "127.0.0.1 and reach it through an SSH tunnel (ssh -L 6006:127.0.0.1:6006 ...)",
        )


def tensorboard_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("tensorboard") is not None


class TensorBoard:
    """The real TensorBoard over jobs' logs, mirrored here and refreshed while it runs.

        with TensorBoard(["train-1", "train-2"], port=6006) as tb:
            print(tb.url)      # http://127.0.0.1:6006/
            ...                # the jobs' logs are copied again every refresh_seconds

    `port=0` takes a free port."""

    def __init__(
        self,
        jobs: list[str],
        *,
        store: Store | None = None,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        from trainctl.store import default_store

        check_host(host)
        if not 0 <= port <= 65535:
            raise SpecError("--port", f"must be 0-65535, got {port}")
        if refresh_seconds <= 0:
            raise SpecError("refresh_seconds", f"must be above 0, got {refresh_seconds}")
        self.store = store or default_store()
        self.sources = log_sources(self.store, jobs)
        self.host, self.port, self.refresh_seconds = host, port, refresh_seconds
        self.token = secrets.token_urlsafe(24)
        self.logdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    def start(self, timeout: float = READY_TIMEOUT_SECONDS) -> str:
        """Mirror the logs, start TensorBoard and wait until it answers; its URL."""
        if not tensorboard_installed():
            raise SpecError(
                "tensorboard",
                "the tensorboard package is not installed: pip install 'trainctl[tensorboard]'",
            )
        self.logdir = Path(tempfile.mkdtemp(prefix="trainctl-tensorboard-"))
        # what it says, for a failed start (closed by stop())
        self._output = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            mirror(self.sources, self.logdir)
            if self.port == 0:
                self.port = _free_port(self.host)
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainctl.tensorboard.door",
                    "--logdir",
                    str(self.logdir),
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                    "--reload_interval",
                    str(max(1, int(self.refresh_seconds))),
                ],
                env={**os.environ, TOKEN_ENV: self.token},  # not argv: `ps` shows argv to all
                stdin=subprocess.DEVNULL,
                stdout=self._output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C is ours to pass on
            )
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._refresh, name="tensorboard-mirror")
        self._thread.daemon = True
        self._thread.start()
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                assert self._output is not None
                self._output.seek(0)
                out = self._output.read().decode(errors="replace")
                last = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
                raise TrainctlError(
                    f"TensorBoard ended at start (exit {self.proc.returncode}): {last[0]}"
                )
            try:
                with urllib.request.urlopen(self.url, timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise TrainctlError(f"TensorBoard did not answer at {self.url} in {timeout:.0f} s")

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            if self.logdir is None:
                return
            try:
                mirror(self.sources, self.logdir)
            except Exception:  # the next pass retries (a store outage)
                continue

    def refresh(self) -> int:
        """Copy what the jobs wrote since the last pass now; the number of files copied."""
        return mirror(self.sources, self.logdir) if self.logdir is not None else 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self) -> int:
        """Until TensorBoard ends; its exit code."""
        assert self.proc is not None
        return self.proc.wait()

    def stop(self) -> None:
        """End TensorBoard and drop the mirror."""
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._output is not None:
            self._output.close()
            self._output = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if self.logdir is not None:
            shutil.rmtree(self.logdir, ignore_errors=True)
            self.logdir = None

    def __enter__(self) -> TensorBoard:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
