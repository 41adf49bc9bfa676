"""A job's keys in the store (JobKeys: job.json, events, lease, logs, results...) and the
times a record holds (now_iso, parse_iso, Timestamp)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from pydantic import AfterValidator

from trainctl.clock import clock


def now_iso() -> str:
    return iso_at(clock().time())


def iso_at(seconds: float) -> str:
    """A moment (seconds since the epoch) as a record keeps it."""
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _iso(value: str) -> str:
    try:
        parse_iso(value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"{value[:40]!r} is not an ISO 8601 time") from None
    return value


# A time in a record (now_iso's form): checked on reading, as durations are computed from it.
Timestamp = Annotated[str, AfterValidator(_iso)]

# The start-up stage that is all of it: the attempt's start to its first step.
TO_FIRST_STEP = "to_first_step"

REMOTE_START_SUFFIX = ".remote-start.json"


def nodes_only(key: str) -> bool:
    """Whether a job's object is for its nodes alone (it holds a token that lets mpirun
    start processes on them): neither the dashboard nor `trainctl artifacts` lists or
    serves it."""
    # (casefolded: on a case-insensitive file system `NODE-1.REMOTE-START.JSON` is the file)
    return key.casefold().endswith(REMOTE_START_SUFFIX)


class JobKeys:
    """Store keys of one job (see design.md, 'The data path')."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.prefix = f"jobs/{name}"

    @property
    def record(self) -> str:
        return f"{self.prefix}/job.json"

    @property
    def events(self) -> str:
        return f"{self.prefix}/events.jsonl"

    @property
    def lease(self) -> str:
        return f"{self.prefix}/lease.json"

    @property
    def metrics(self) -> str:
        """Prefix of the metric history: parts of JSON lines, named so they sort in time."""
        return f"{self.prefix}/metrics/"

    @property
    def stop(self) -> str:
        return f"{self.prefix}/control/stop"

    @property
    def output(self) -> str:
        return f"{self.prefix}/output"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}/checkpoints"

    @property
    def tensorboard(self) -> str:
        """The nodes' TensorBoard logs, unless tensorboard_s3_uri names another place."""
        return f"{self.prefix}/tensorboard"

    @property
    def workdir(self) -> str:
        """Each node's working directory, kept across attempts (see node.workdir)."""
        return f"{self.prefix}/workdir"

    @property
    def controller_log(self) -> str:
        """What a detached controller printed, filed here once the job ended."""
        return f"{self.prefix}/controller.log"

    def log(self, attempt: int, rank: int) -> str:
        return f"{self.prefix}/logs/attempt-{attempt}/node-{rank}.log"

    def logs_dir(self, attempt: int) -> str:
        return f"{self.prefix}/logs/attempt-{attempt}"

    def cluster(self, attempt: int) -> str:
        return f"{self.prefix}/attempts/attempt-{attempt}/cluster.json"

    def node_result(self, attempt: int, rank: int) -> str:
        return f"{self.prefix}/attempts/attempt-{attempt}/node-{rank}.result.json"

    def node_status(self, attempt: int, rank: int) -> str:
        """The node's heartbeat and progress, written by its agent (see node.output)."""
        return f"{self.prefix}/attempts/attempt-{attempt}/node-{rank}.status.json"

    def remote_start(self, attempt: int, rank: int) -> str:
        """Where the node's agent takes mpirun's remote starts, with its token (see
        node.remote_start); removed when the node ends."""
        return f"{self.prefix}/attempts/attempt-{attempt}/node-{rank}{REMOTE_START_SUFFIX}"

    def stopping(self, attempt: int) -> str:
        """Why the controller is stopping an attempt's nodes (written before it signals them,
        so a node stopped for its peer's sake says so, not that it failed)."""
        return f"{self.prefix}/attempts/attempt-{attempt}/stopping.json"


def source_key(sha256: str) -> str:
    # Content-addressed and shared by all jobs: an unchanged source is uploaded once.
    return f"sources/{sha256}/sourcedir.tar.gz"
