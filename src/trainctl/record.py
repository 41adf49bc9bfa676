"""A job's record in the store: job.json (atomic replace), events.jsonl, lease, stop marker,
and where its outputs and checkpoints go. Read by clients, controllers and node agents alike.

The controller that holds the lease is the only writer of job.json and events.jsonl; other
processes (status, stop, logs) read them, and ask for a stop by writing a marker.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trainctl.clock import clock
from trainctl.errors import JobNotFoundError, NotFoundError
from trainctl.spec.job import JobSpec, written_uris
from trainctl.state import JobState, can_transition
from trainctl.store import Store, open_store


def now_iso() -> str:
    moment = datetime.fromtimestamp(clock().time(), timezone.utc)
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


class AttemptNode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int
    host: str
    address: str
    # Why the controller counted it lost, as soon as it did (a controller that takes the
    # attempt over then does not wait for the node to fall silent).
    lost: str | None = None


class StateCopy(BaseModel):
    """Which copy of a saved-state file (snapshot.pt, last.ckpt...) a node put back: the node
    that wrote it, in which attempt, when (ms since the epoch) and its size."""

    model_config = ConfigDict(extra="forbid")

    node: int
    attempt: int | None = None
    written_ms: int = 0
    size: int = 0

    def text(self) -> str:
        attempt = f"attempt {self.attempt}, " if self.attempt else ""
        when = datetime.fromtimestamp(self.written_ms / 1000, timezone.utc).strftime("%H:%M:%S")
        return f"{attempt}algo-{self.node + 1}'s copy of {when}, {_size(self.size)}"


# Saved-state files a node's restore is recorded with (the newest; all are compared).
STATE_FILES_RECORDED = 8


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


WARNINGS_KEPT = 20  # a record's warnings beyond these are in its events only


def add_warning(record: JobRecord, text: str) -> None:
    """One of the controller's warnings into the record (once; the first WARNINGS_KEPT)."""
    if text not in record.warnings and len(record.warnings) < WARNINGS_KEPT:
        record.warnings.append(text)


class NodeRestored(BaseModel):
    """What one node put back before its script started (the agent's `restored` message)."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    files: int = 0  # working-directory files (with SM_MODEL_DIR's and SM_OUTPUT_DATA_DIR's)
    bytes: int = 0
    from_attempt: int | None = None
    largest: list[str] = Field(default_factory=list)
    checkpoint_files: int = 0
    checkpoint_bytes: int = 0
    left_out: int = 0  # files not restored: over workdir_max_mb
    state: dict[str, StateCopy] = Field(default_factory=dict)  # the newest saved-state files
    # Paths being written when the earlier attempt ended: restored as before, or not at all
    unsettled: list[str] = Field(default_factory=list)
    # The newest saved state restored, as a script resumes from it: 'out/checkpoint-800/',
    # 'snapshot.pt' (not the largest file: a tfevents file, an optimizer.pt inside one)
    newest: str | None = None

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> NodeRestored:
        def count(key: str) -> int:
            value = msg.get(key)
            return value if isinstance(value, int) and value >= 0 else 0

        state: dict[str, StateCopy] = {}
        if isinstance(msg.get("state"), dict):
            for path, copy in msg["state"].items():
                try:
                    state[str(path)] = StateCopy.model_validate(copy)
                except ValueError:
                    continue  # an odd entry from a node: left out, not a failure
        attempt = msg.get("from_attempt")
        return cls(
            rank=count("rank"),
            files=count("files"),
            bytes=count("bytes"),
            from_attempt=attempt if isinstance(attempt, int) else None,
            largest=[n for n in msg.get("largest") or [] if isinstance(n, str)][:3],
            checkpoint_files=count("checkpoint_files"),
            checkpoint_bytes=count("checkpoint_bytes"),
            left_out=count("left_out"),
            state=state,
            unsettled=[p for p in _listed(msg.get("unsettled")) if isinstance(p, str)][:20],
            newest=newest[:300] if isinstance(newest := msg.get("newest"), str) else None,
        )

    def nothing(self) -> bool:
        return not self.files and not self.checkpoint_files

    def text(self) -> str:
        """'snapshot.pt +2, 1.2 MB from attempt 1; 3 checkpoint file(s), 4.0 MB' or
        'nothing'."""
        parts = []
        if self.files:
            more = f" +{self.files - len(self.largest)}" if self.files > len(self.largest) else ""
            source = f" from attempt {self.from_attempt}" if self.from_attempt else ""
            parts.append(f"{', '.join(self.largest)}{more}, {_size(self.bytes)}{source}")
        if self.checkpoint_files:
            parts.append(
                f"{self.checkpoint_files} checkpoint file(s), {_size(self.checkpoint_bytes)}"
            )
        if self.left_out:
            parts.append(f"{self.left_out} file(s) left out (workdir_max_mb)")
        return "; ".join(parts) or "nothing"


class Restored(BaseModel):
    """What an attempt's nodes put back before the script started (node.workdir and the
    checkpoint restore): each node's report, and their sums."""

    model_config = ConfigDict(extra="forbid")

    files: int = 0  # the most working-directory files a node restored
    bytes: int = 0
    from_attempt: int | None = None  # the attempt that left them (the newest, over nodes)
    largest: list[str] = Field(default_factory=list)  # up to 3 paths, largest first
    # Every node restores the union of all nodes' checkpoints: the most any node got.
    checkpoint_files: int = 0
    checkpoint_bytes: int = 0
    nodes: int = 0  # how many nodes reported
    by_node: list[NodeRestored] = Field(default_factory=list)
    # The nodes started from different state (controller.restores.split_resume): in words.
    split: str | None = None
    newest: str | None = None  # the newest saved state restored (the lowest rank's report)

    def add(self, node: NodeRestored) -> None:
        """One node's report (the agent's `restored` message)."""
        self.nodes += 1
        self.by_node = sorted([*self.by_node, node], key=lambda n: n.rank)
        self.newest = next((n.newest for n in self.by_node if n.newest), None)
        if node.files:
            self.files = max(self.files, node.files)
            self.bytes = max(self.bytes, node.bytes)
            self.largest = list(dict.fromkeys([*self.largest, *node.largest]))[:3]
            if node.from_attempt is not None:
                self.from_attempt = max(node.from_attempt, self.from_attempt or 0)
        self.checkpoint_files = max(self.checkpoint_files, node.checkpoint_files)
        self.checkpoint_bytes = max(self.checkpoint_bytes, node.checkpoint_bytes)

    def _where(self, having: list[int]) -> str:
        """' on every node' / ' on algo-1 only (nothing on algo-2)' (nodes that reported)."""
        if not self.by_node or len(self.by_node) < 2:
            return ""
        if len(having) == len(self.by_node):
            return " on every node"
        without = [n.rank for n in self.by_node if n.rank not in having]
        return f" on {_hosts(having)} only (nothing on {_hosts(without)})"

    def files_text(self) -> str:
        """'snapshot.pt, 2.1 MB on every node, from attempt 1'; with more files than names:
        'snapshot.pt (5 files), ...'; where some nodes restored nothing, it names them:
        'snapshot.pt, 2.1 MB on algo-1 only (nothing on algo-2), from attempt 1'."""
        shown = [self.newest] if self.newest else self.largest
        names = ", ".join(shown)
        if self.files > len(shown):
            names += f" ({self.files} files)"
        where = self._where([n.rank for n in self.by_node if n.files])
        source = f", from attempt {self.from_attempt}" if self.from_attempt else ""
        return f"{names}, {_size(self.bytes)}{where}{source}"

    def checkpoints_text(self) -> str:
        where = self._where([n.rank for n in self.by_node if n.checkpoint_files])
        size = _size(self.checkpoint_bytes)
        return f"{self.checkpoint_files} checkpoint file(s), {size}{where}"

    def files_short(self) -> str:
        """'snapshot.pt +1': the newest saved state (else the largest file) and how many
        more files."""
        more = f" +{self.files - 1}" if self.files > 1 else ""
        first = self.newest or (self.largest[0] if self.largest else "files")
        return f"{first}{more}"


def _hosts(ranks: list[int]) -> str:
    return ", ".join(f"algo-{r + 1}" for r in sorted(ranks))


def _size(n: int) -> str:
    from rich.filesize import decimal

    return decimal(n)


class Attempt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    number: int
    started_at: Timestamp
    ended_at: Timestamp | None = None
    nodes: list[AttemptNode] = Field(default_factory=list)
    outcome: str | None = None  # completed | failed | stopped | interrupted
    cause: str | None = None
    exit_code: int | None = None
    faults: list[str] = Field(default_factory=list)  # injected during this attempt
    resumed_from_step: int | None = None  # checkpoint step this attempt started from
    last_step: int | None = None  # last training step reported in this attempt
    last_checkpoint_step: int | None = None
    steps_lost: int | None = None  # work of this attempt redone by the next one
    # An elastic job's size change at this attempt's start: "shrunk to 2 of 3 node(s): ..."
    # or "grown to 3 of 3 node(s): ..." (None: the same size as the attempt before).
    resized: str | None = None
    training_seconds: float | None = None
    # The longest stretch without progress (a step, a new log line) while its nodes' code
    # ran: what a relaunch's hang bound is made of (controller.hangs).
    longest_quiet_seconds: float | None = None
    # Where the attempt's start-up went, seconds per stage (slowest node for node stages):
    # capacity, ssh, agent, image, code, venv, launch (launcher start -> first step), total.
    startup: dict[str, float] | None = None
    # What its nodes restored before the script started (None: not reported).
    restored: Restored | None = None
    # The warm pool it started on (None: capacity launched for it).
    warm_pool: str | None = None
    # The provider's id of its capacity (Slurm's job id), where it has one.
    capacity_id: str | None = None

    def node_hours(self) -> float:
        """Its nodes' hours, once it ended (0 while it runs): what an interruption rate is
        counted over."""
        if not self.ended_at:
            return 0.0
        seconds = max(0.0, parse_iso(self.ended_at) - parse_iso(self.started_at))
        return seconds / 3600 * max(1, len(self.nodes))

    def steps_per_second(self, now: float | None = None) -> float | None:
        """Its training pace: steps from where it resumed to its last, over the time since
        its first step (to its end, or `now`); None before two steps."""
        if self.last_step is None or not self.startup or "total" not in self.startup:
            return None
        # (started_at is once it had its nodes; the start-up's total counts the capacity too)
        begun = parse_iso(self.started_at) + self.startup["total"] - self.startup.get("capacity", 0)
        end = parse_iso(self.ended_at) if self.ended_at else (now or clock().time())
        done = self.last_step - (self.resumed_from_step or 0)
        if done <= 0 or end - begun <= 0:
            return None
        return done / (end - begun)

    def started_from(self, *, short: bool = False) -> str:
        """Where the attempt started, in words: the step it resumed from (the script said,
        through report_step or Checkpointer), the files it restored, or from scratch.
        `short`: a table cell ('step 120', 'snapshot.pt +1', 'scratch'). Nodes that
        restored different state (a split resume) say so: 'split' in short."""
        text = self._started_from(short=short)
        if self.restored is None or not self.restored.split or text == "-":
            return text
        return "split" if short else f"{text}; not the same state on every node (split resume)"

    def _started_from(self, *, short: bool) -> str:
        restored = self.restored
        files = None
        if restored and restored.files:
            files = restored.files_short() if short else restored.files_text()
        if self.resumed_from_step:
            if short or not files:
                return f"step {self.resumed_from_step}"
            return f"step {self.resumed_from_step} (restored {files})"
        if files:
            return files if short else f"restored {files}"
        if restored and restored.checkpoint_files:
            if short:
                return f"{restored.checkpoint_files} ckpt files"
            return f"restored {restored.checkpoints_text()}"
        if restored is None and self.resumed_from_step is None and self.number > 1:
            return "-"  # nothing reported (a controller that took over the attempt)
        if short:
            return "scratch"
        return "from scratch" if self.number == 1 else "from scratch: nothing to restore"

    def restored_by_node(self) -> dict[str, str]:
        """What each node put back, in words ('algo-2': 'nothing'); {} if not reported."""
        if self.restored is None:
            return {}
        return {f"algo-{n.rank + 1}": n.text() for n in self.restored.by_node}

    def restored_nothing(self) -> bool:
        """Whether the attempt's nodes said they had nothing to put back."""
        r = self.restored
        return r is not None and not r.files and not r.checkpoint_files


class InstanceCost(BaseModel):
    """Billable time of one instance of one attempt (providers that bill: EC2)."""

    model_config = ConfigDict(extra="forbid")

    attempt: int
    rank: int
    instance_id: str
    instance_type: str
    market: str  # spot | on-demand | owned
    zone: str | None = None
    seconds: float
    usd_per_hour: float | None = None  # None: no price known, no cost claimed
    on_demand_usd_per_hour: float | None = None
    # Idle time after the job, kept warm for a next one (keep_alive_period_in_seconds).
    warm: bool = False

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_hour is None else self.seconds / 3600 * self.usd_per_hour

    @property
    def on_demand_usd(self) -> float | None:
        rate = self.on_demand_usd_per_hour
        return None if rate is None else self.seconds / 3600 * rate


# S3 Standard's list prices (us-east-1, https://aws.amazon.com/s3/pricing/, 2026): PUT, COPY,
# POST and LIST $0.005 per 1,000 requests; GET, HEAD and the rest $0.0004 per 1,000.
S3_WRITE_USD, S3_READ_USD = 0.005 / 1000, 0.0004 / 1000


def supervision_usd_per_node_hour(nodes: int) -> float:
    """What one node's own store requests cost an hour at S3's list prices, on the schedule
    of the settings in effect (Settings.control_seconds and friends): its lease reads, its
    log copies (each interval: a log that grows) and its status writes. Not its checkpoint
    and working-directory uploads (what it saves) or the controller's requests (per job)."""
    from trainctl.spec.settings import get_settings

    settings = get_settings()
    reads = 3600 / settings.control_seconds(nodes)
    writes = 3600 / settings.log_ship_seconds(nodes) + 3600 / settings.status_seconds(nodes)
    return reads * S3_READ_USD + writes * S3_WRITE_USD


def cost_summary(
    instances: list[InstanceCost], *, store_uri: str = "", nodes: int = 1
) -> dict[str, Any] | None:
    """The job's cost and its spot savings against on-demand; None if nothing billed. With
    an s3:// store, `store_usd`: its nodes' supervision requests at S3's list prices (an
    estimate from the schedule: supervision_usd_per_node_hour), beside the instances'."""
    if not instances:
        return None
    priced = [i for i in instances if i.usd is not None]
    usd = sum(i.usd or 0.0 for i in priced)
    on_demand = sum(i.on_demand_usd or 0.0 for i in priced if i.on_demand_usd is not None)
    seconds = sum(i.seconds for i in instances)
    store_usd = None
    if store_uri.startswith("s3://"):
        store_usd = round(seconds / 3600 * supervision_usd_per_node_hour(nodes), 6)
    return {
        "usd": round(usd, 4) if priced else None,
        "on_demand_usd": round(on_demand, 4) if priced else None,
        "spot_savings_usd": round(on_demand - usd, 4) if priced else None,
        "instance_seconds": round(seconds, 1),
        "warm_seconds": round(sum(i.seconds for i in instances if i.warm), 1),
        "unpriced_instances": len(instances) - len(priced),
        "store_usd": store_usd,
    }


def cost_text(cost: dict[str, Any] | None) -> str:
    """A job's cost (cost_summary) in words, for `status` and a notebook's view."""
    if cost is None:
        return "none billed (this machine's or your hosts' capacity)"
    hours = cost["instance_seconds"] / 3600
    if cost["usd"] is None:
        return f"{hours:.2f} instance-hours (no price known)"
    text = f"${cost['usd']:.2f} for {hours:.2f} instance-hours"
    if cost.get("warm_seconds"):
        text += f" ({cost['warm_seconds'] / 3600:.2f} of them kept warm after the job)"
    if cost["spot_savings_usd"]:
        text += f"; spot saved ${cost['spot_savings_usd']:.2f} of ${cost['on_demand_usd']:.2f}"
    if cost["unpriced_instances"]:
        text += f" ({cost['unpriced_instances']} instance(s) without a price not counted)"
    if cost.get("store_usd") is not None:
        share = f", {100 * cost['store_usd'] / cost['usd']:.2g} % of that" if cost["usd"] else ""
        text += f"; the nodes' store requests about ${cost['store_usd']:.4f} more{share}"
    return text


class JobRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    state: JobState = JobState.PENDING
    spec: JobSpec
    store_uri: str
    source_uri: str
    source_sha256: str
    owner: str
    trainctl_version: str
    created_at: Timestamp
    updated_at: Timestamp
    started_at: Timestamp | None = None
    training_started_at: Timestamp | None = None
    ended_at: Timestamp | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    failure_reason: str | None = None
    failure_detail: str | None = None
    # Why the job waits for capacity now (Slurm: its allocation pending, with Slurm's
    # reason); None while it is not waiting.
    waiting: str | None = None
    exit_code: int | None = None
    stop_reason: str | None = None
    model_data: str | None = None
    output_data: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    # The training steps in all: the script's report_step(total=N), else the spec's.
    total_steps_reported: int | None = None
    # What the controller warned of (each also an event): the nodes trained apart, a split
    # resume, a fault the job ended before... `status` shows them.
    warnings: list[str] = Field(default_factory=list)
    instances: list[InstanceCost] = Field(default_factory=list)
    # The job this one is a measurement run of (`trainctl diagnose`): lists hide it.
    measurement_of: str | None = None
    # The tuning job this one is a trial of (tuning/<name>/ in the same store).
    tuning_job: str | None = None

    @property
    def duration_s(self) -> float | None:
        if not self.started_at:
            return None
        end = parse_iso(self.ended_at) if self.ended_at else clock().time()
        return round(end - parse_iso(self.started_at), 3)

    @property
    def total_steps(self) -> int | None:
        """The job's work in steps, where the script or the spec says it."""
        return self.total_steps_reported or self.spec.total_steps

    def progress(self, now: float | None = None) -> dict[str, Any] | None:
        """How far the job is and how long it has left, where its total work is known:
        {"step", "total", "fraction", "steps_per_second", "seconds_left"}; the rate is the
        latest attempt's since its first step (None until it has one)."""
        total = self.total_steps
        if total is None:
            return None
        steps = [a.last_step for a in self.attempts if a.last_step is not None]
        step = max(steps) if steps else 0
        rate = self.attempts[-1].steps_per_second(now) if self.attempts else None
        left = None
        if rate and not self.state.is_terminal():
            left = round(max(0, total - step) / rate, 1)
        return {
            "step": step,
            "total": total,
            "fraction": round(min(1.0, step / total), 4),
            "steps_per_second": None if rate is None else round(rate, 4),
            "seconds_left": left,
        }

    def describe(self) -> dict[str, Any]:
        """The user-facing summary (`status -o json`, `job.describe()`, the dashboard), with
        the job's secret values hidden (trainctl.redact)."""
        from trainctl.redact import Redactor

        spec = self.spec
        redactor = Redactor.for_spec(spec)
        return redactor.tree(
            {
                "name": self.name,
                "state": self.state.value,
                "created_at": self.created_at,
                "started_at": self.started_at,
                "training_started_at": self.training_started_at,
                "ended_at": self.ended_at,
                "duration_s": self.duration_s,
                "instance_type": spec.instance_type,
                "instance_count": spec.instance_count,
                "launcher": spec.launcher,
                "entry_point": spec.entry_point,
                "source_dir": spec.source_dir,
                "tuning_job": self.tuning_job,  # the tuning job this is a trial of
                "hyperparameters": redactor.hyperparameters(spec.hyperparameters),
                "environment": redactor.env(spec.environment),
                "attempts": [
                    {
                        **a.model_dump(),
                        "started_from": a.started_from(),
                        "restored_by_node": a.restored_by_node(),
                    }
                    for a in self.attempts
                ],
                "waiting": self.waiting,
                "progress": self.progress(),
                "failure_reason": self.failure_reason,
                "failure_detail": self.failure_detail,
                "warnings": list(self.warnings),
                "exit_code": self.exit_code,
                "stop_reason": self.stop_reason,
                "model_data": self.model_data,
                "output_data": self.output_data,
                "metrics": self.metrics,
                "instances": [i.model_dump() for i in self.instances],
                "cost": cost_summary(
                    self.instances, store_uri=self.store_uri, nodes=self.spec.instance_count
                ),
                "store": f"{self.store_uri}/jobs/{self.name}",
                "measurement_of": self.measurement_of,
            }
        )

    def redacted_dump(self) -> dict[str, Any]:
        """The whole record as JSON data with the job's secret values hidden: what may be
        shown of job.json (the dashboard's file view)."""
        from trainctl.redact import Redactor

        redactor = Redactor.for_spec(self.spec)
        data = self.model_dump(mode="json")
        data["spec"]["environment"] = redactor.env(self.spec.environment)
        data["spec"]["hyperparameters"] = redactor.hyperparameters(self.spec.hyperparameters)
        return dict(redactor.tree(data))


def progress_text(progress: dict[str, Any]) -> str:
    """A job's progress (JobRecord.progress) in words: `54/138 steps (39%), ~1m20s left`."""
    text = f"{progress['step']:,}/{progress['total']:,} steps ({progress['fraction']:.0%})"
    left = progress.get("seconds_left")
    if left is not None:
        minutes, seconds = divmod(round(left), 60)
        hours, minutes = divmod(minutes, 60)
        text += f", ~{hours}h{minutes:02d}m left" if hours else f", ~{minutes}m{seconds:02d}s left"
    return text


def owner_id() -> str:
    try:
        user = os.getlogin()
    except OSError:
        user = os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class JobStore:
    """Reads and writes one job's record; the controller is the single writer."""

    def __init__(self, store: Store, name: str) -> None:
        from trainctl.errors import SpecError
        from trainctl.spec.job import JOB_NAME_RE

        # Every command that names a job comes here: a path-like name ('d6/', '../x') is
        # bad input, never a store key of something else.
        if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name):
            raise SpecError(
                "job",
                f"{name!r} is not a job name: 1-63 letters, digits and hyphens, starting and "
                "ending with a letter or digit",
            )
        self.store = store
        self.name = name
        self.keys = JobKeys(name)

    def exists(self) -> bool:
        return self.store.exists(self.keys.record)

    def load(self) -> JobRecord:
        try:
            raw = self.store.get_bytes(self.keys.record)
        except NotFoundError:
            raw = self._record_after_remains()
        return parse_record(self.name, raw, self.store.url(self.keys.record))

    def _record_after_remains(self) -> bytes:
        """The record, read again when the job's directory holds files: a job being created
        writes its record first, so a reader that missed it may see its next files; only a
        record still missing then is unreadable."""
        if self._has_remains():
            try:
                return self.store.get_bytes(self.keys.record)
            except NotFoundError:
                from trainctl.errors import UnreadableRecordError

                raise UnreadableRecordError(
                    f"job {self.name!r}: its record {self.store.url(self.keys.record)} is "
                    "missing or not a file, but the job's directory holds files"
                ) from None
        raise JobNotFoundError(f"job {self.name!r} not found in {self.store.uri}") from None

    def _has_remains(self) -> bool:
        """Whether the job's directory holds anything though its record is gone (a record
        deleted or replaced by a directory): such a job is listed, and removed, as
        Unreadable rather than left in the store unseen. (A new job's record is its first
        object, and a removal deletes the record last.)"""
        prefix = self.keys.prefix
        if self.store.list_dirs(prefix):
            return True
        return next(iter(self.store.list(prefix)), None) is not None

    def save(self, record: JobRecord, *, prompt: bool = False) -> None:
        """Write the record; `prompt`: a periodic save that the next one repeats (see
        Store.prompt), which must not hold its caller in a long backoff."""
        record.updated_at = now_iso()
        store = self.store.prompt() if prompt else self.store
        store.put_text(self.keys.record, record.model_dump_json(indent=2))

    def create(self, record: JobRecord) -> bool:
        """Write a new job's record only if no job of that name exists (S3 If-None-Match: *,
        a lock locally): of two submits racing for one name exactly one wins. False: lost."""
        record.updated_at = now_iso()
        data = record.model_dump_json(indent=2).encode()
        return self.store.put_if(self.keys.record, data, version=None) is not None

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"time": now_iso(), "type": kind, **fields}, default=str)
        self.store.append_bytes(self.keys.events, (line + "\n").encode())

    def save_metric_points(self, points: list[dict[str, Any]], *, prompt: bool = False) -> None:
        """Add points ({"time", "name", "value", "rank"}) to the metric history: one new
        part object per call (no read-modify-write, whatever the store)."""
        if not points:
            return
        import os

        part = f"{self.keys.metrics}{int(clock().time() * 1000):015d}-{os.getpid()}.jsonl"
        store = self.store.prompt() if prompt else self.store
        store.put_text(part, "".join(json.dumps(p) + "\n" for p in points))

    def metric_history(self, record: JobRecord | None = None) -> list[dict[str, Any]]:
        """Every metric value in time order: {"time" (epoch seconds), "name", "value",
        "step", "attempt", "rank", "redone"} (see trainctl.metrics)."""
        from trainctl.metrics import mark_redone

        points = []
        for info in self.store.list(self.keys.metrics):
            try:
                raw = self.store.get_bytes(info.key)
            except NotFoundError:  # gone between list and get (a job deleted meanwhile)
                continue
            points.extend(p for p in json_lines(raw) if _metric_point(p))
        points.sort(key=lambda p: p["time"])
        record = record or self.load()
        mark_redone(points, {a.number: a.resumed_from_step for a in record.attempts})
        return points

    def events(self) -> list[dict[str, Any]]:
        try:
            raw = self.store.get_bytes(self.keys.events)
        except NotFoundError:
            return []
        return json_lines(raw)

    def transition(self, record: JobRecord, state: JobState, **detail: Any) -> None:
        """Move to `state`, recording the event; ignored if the record is already terminal."""
        if record.state == state:
            return
        if not can_transition(record.state, state):
            raise RuntimeError(f"invalid transition {record.state} -> {state}")
        previous = record.state
        record.state = state
        if state is JobState.PROVISIONING and record.started_at is None:
            record.started_at = now_iso()
        if state is JobState.TRAINING and record.training_started_at is None:
            record.training_started_at = now_iso()
        if state.is_terminal():
            record.ended_at = now_iso()
            # Before the record says it ended: a submit that finds the claim gone then
            # still finds this job running, never neither (see trainctl.claims). Best
            # effort: a claim left behind is stale once the record is terminal.
            from trainctl.errors import TrainctlError

            try:
                self.release_locations(record.spec)
            except TrainctlError:
                pass
        self.save(record)
        self.event("state", state=state.value, previous=previous.value, **detail)

    # -- the locations outside its directory that the job writes to ------------------------
    def claim_locations(self, spec: JobSpec) -> str:
        """Claim, create-if-absent, the locations `spec` writes to outside the job's
        directory: SpecError (the field, the job holding it) if a live job writes there or
        above or below it (see trainctl.claims). Returns the submit's claim token."""
        from trainctl.claims import take_claims

        return take_claims(
            self.store, self.name, written_locations(spec, self.name), self.claim_holder(self.store)
        )

    def release_locations(self, spec: JobSpec, *, token: str | None = None) -> None:
        """Give back the job's claims (`token`: only one submit's, before its record)."""
        from trainctl.claims import release_claims

        uris = [uri for _, uri in written_locations(spec, self.name)]
        release_claims(self.store, self.name, uris, token=token)

    @staticmethod
    def claim_holder(store: Store) -> Callable[[str], tuple[bool, str] | None]:
        """For trainctl.claims: (ended, state) of the job of `store` holding a claim;
        None: it has no record."""
        from trainctl.errors import SpecError, UnreadableRecordError

        def holder(name: str) -> tuple[bool, str] | None:
            try:
                record = JobStore(store, name).load()
            except JobNotFoundError:
                return None
            except SpecError:  # not a job name: a claim no job can hold
                return True, "not a job"
            except UnreadableRecordError:  # kept: `trainctl rm --unreadable` frees it
                return False, "Unreadable"
            return record.state.is_terminal(), record.state.value

        return holder

    # -- stop requests -------------------------------------------------------------------
    def request_stop(self, reason: str, *, keep_warm: bool = False) -> None:
        """Ask the job's controller to stop it; `keep_warm`: its capacity goes to a warm pool
        (with the job's keep_alive_period_in_seconds) rather than being terminated, as a
        tuning job's pruned trial hands its nodes to the next trial."""
        marker = {"time": now_iso(), "reason": reason, **({"keep_warm": True} if keep_warm else {})}
        self.store.put_text(self.keys.stop, json.dumps(marker))

    def stop_keeps_warm(self) -> bool:
        """Whether the stop asked for keeps the job's capacity warm (see request_stop)."""
        try:
            found = json.loads(self.store.get_bytes(self.keys.stop))
        except (NotFoundError, ValueError):
            return False
        return isinstance(found, dict) and found.get("keep_warm") is True

    def stop_requested(self) -> str | None:
        try:
            found = json.loads(self.store.get_bytes(self.keys.stop))
        except NotFoundError:
            return None
        except ValueError:  # a marker that is not JSON still asks for a stop
            return "stopped"
        return str(found.get("reason", "stopped")) if isinstance(found, dict) else "stopped"

    # -- lease ---------------------------------------------------------------------------
    def read_lease(self) -> dict[str, Any] | None:
        try:
            found = json.loads(self.store.get_bytes(self.keys.lease))
        except NotFoundError:
            return None
        except ValueError:  # unreadable: no one holds it (a new holder rewrites it)
            return {}
        return found if isinstance(found, dict) else {}


# The lease's field through which the controller relays interruption notices to the nodes
# (which read the lease anyway, for its liveness): {"attempt": k, "ranks": {rank: source}},
# "*" for every node of the attempt. One object read per node every control_poll_seconds,
# where a key per node polled by every node was most of a job's store requests.
NOTICES = "notices"
EVERY_NODE = "*"


def lease_notice(lease: dict[str, Any] | None, attempt: int, rank: int) -> str | None:
    """The interruption notice the controller's lease relays to node `rank` of `attempt`
    (what it is for), or None."""
    notices = lease.get(NOTICES) if isinstance(lease, dict) else None
    if not isinstance(notices, dict) or notices.get("attempt") != attempt:
        return None
    ranks = notices.get("ranks")
    if not isinstance(ranks, dict):
        return None
    source = ranks.get(str(rank), ranks.get(EVERY_NODE))
    return None if source is None else str(source)[:500] or "interruption notice"


def _metric_point(point: dict[str, Any]) -> bool:
    """Whether a stored metric point has the shape every reader relies on (a corrupt or
    hand-edited part is left out, not a traceback in `status` and `metrics`)."""

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    step, rank, attempt = point.get("step"), point.get("rank"), point.get("attempt")
    return (
        number(point.get("time"))
        and isinstance(point.get("name"), str)
        and number(point.get("value"))
        and (step is None or (isinstance(step, int) and not isinstance(step, bool)))
        and (rank is None or (isinstance(rank, int) and not isinstance(rank, bool)))
        and (attempt is None or (isinstance(attempt, int) and not isinstance(attempt, bool)))
    )


def json_lines(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl object; a line that is not one (a torn append, garbage)
    is left out rather than failing the whole history."""
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def parse_record(name: str, raw: bytes | str, where: str) -> JobRecord:
    """A job record from its stored text; UnreadableRecordError, one line naming the job
    and the problem, for anything else (truncated, binary, another schema or version)."""
    from pydantic import ValidationError

    from trainctl.errors import UnreadableRecordError
    from trainctl.spec.job import RECORDED
    from trainctl.version import __version__

    def unreadable(problem: str) -> UnreadableRecordError:
        return UnreadableRecordError(f"job {name!r}: its record {where} {problem}")

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        what = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else "is not JSON"
        raise unreadable(f"{what} (truncated or overwritten?)") from None
    if not isinstance(data, dict):
        raise unreadable("is not a job record (not a JSON object)")
    try:
        record = JobRecord.model_validate(data, context={RECORDED: True})
    except ValidationError as exc:
        version = data.get("trainctl_version")
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "record"
        problem = f"does not match this trainctl's schema ({loc}: {first['msg']})"
        if isinstance(version, str) and version != __version__:
            problem += f"; it was written by trainctl {version[:40]}, this is {__version__}"
        raise unreadable(problem) from None
    except RecursionError:
        raise unreadable("is nested too deeply") from None
    if record.name != name:  # every command reaches the job's keys by the record's name
        raise unreadable(f"names another job ({record.name[:80]!r})")
    return record


class UnreadableJob(BaseModel):
    """A job whose record cannot be read: listed (state Unreadable), never skipped."""

    model_config = ConfigDict(extra="forbid")
    name: str
    problem: str

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "state": "Unreadable", "problem": self.problem}


def scan_jobs(
    store: Store, *, measurements: bool = True
) -> tuple[list[JobRecord], list[UnreadableJob]]:
    """Every job in the store, newest first, and those whose record cannot be read;
    `measurements=False` leaves out `trainctl diagnose`'s measurement runs."""
    from trainctl.errors import SpecError, UnreadableRecordError

    records, unreadable = [], []
    for name in store.list_dirs("jobs"):
        try:
            records.append(JobStore(store, name).load())
        except JobNotFoundError:
            continue  # no record (yet): nothing to list
        except (UnreadableRecordError, SpecError) as exc:
            unreadable.append(UnreadableJob(name=name, problem=str(exc)))
    if not measurements:
        records = [r for r in records if r.measurement_of is None]
    return sorted(records, key=lambda r: r.created_at, reverse=True), unreadable


def state_names(given: list[str] | None, allowed: list[str], what: str) -> set[str]:
    """The states a `--state` option names, matched in any case against `allowed`; a name
    that is not one of them is a SpecError saying it is not `what` and listing them."""
    from trainctl.errors import SpecError

    by_name = {name.lower(): name for name in allowed}
    wanted = set()
    for state in given or []:
        match = by_name.get(state.strip().lower())
        if match is None:
            shown = ", ".join(sorted(allowed))
            raise SpecError("--state", f"{state!r} is not {what}; allowed: {shown}")
        wanted.add(match)
    return wanted


def find_jobs(
    store: Store,
    *,
    every: bool = False,
    states: list[str] | None = None,
    pattern: str | None = None,
    limit: int | None = None,
) -> tuple[list[JobRecord], list[UnreadableJob]]:
    """The jobs `trainctl jobs` lists, newest first, and those whose record cannot be read.

    Without `every`, diagnose's measurement runs and tuning jobs' trials are left out
    (`trainctl tuning NAME` lists a tuning job's trials). `states`: only jobs in these
    (any case; `Unreadable` for records that cannot be read); `pattern`: a shell glob on
    the name (`train-*`); `limit`: the newest N readable jobs. Bad values: SpecError naming
    the option (--state, --limit)."""
    from fnmatch import fnmatchcase

    from trainctl.errors import SpecError

    if limit is not None and limit < 1:
        raise SpecError("--limit", f"must be 1 or more, got {limit}")
    known = [state.value for state in JobState] + ["Unreadable"]
    wanted = state_names(states, known, "a job state")
    records, unreadable = scan_jobs(store, measurements=every)
    if not every:
        records = [r for r in records if r.tuning_job is None]
    if pattern:
        records = [r for r in records if fnmatchcase(r.name, pattern)]
        unreadable = [u for u in unreadable if fnmatchcase(u.name, pattern)]
    if wanted:
        records = [r for r in records if r.state.value in wanted]
        unreadable = unreadable if "Unreadable" in wanted else []
    return records[:limit], unreadable


def list_jobs(store: Store) -> list[JobRecord]:
    """Every readable job in the store, newest first (see scan_jobs for the others)."""
    return scan_jobs(store)[0]


# Where a job's outputs go: `output_path/<job>/output/` if given, else the job's store dir.


def output_store(record: JobRecord, *, pinned: bool = False) -> Store:
    """Where the job's model and output data go (on S3: encrypted with output_kms_key, and
    tagged with the job's tags; `pinned`: a node's, see LocalStore)."""
    if record.spec.output_path:
        store = per_job_store("output_path", record.spec.output_path, record.name, pinned=pinned)
    else:
        store = open_store(record.store_uri, pinned=pinned).child(JobKeys(record.name).output)
    spec = record.spec
    if spec.output_kms_key or spec.tags:
        return store.writing_with(kms_key=spec.output_kms_key, tags=spec.tags)
    return store


# Locations that hold a folder per job under the URI given (SageMaker's layout), not the URI
PER_JOB = {"output_path": "output", "code_location": "source"}


def per_job_store(field: str, uri: str, name: str, *, pinned: bool = False) -> Store:
    """Job `name`'s own folder under a PER_JOB location: <uri>/<name>/output, .../source."""
    return open_store(uri, field=field, pinned=pinned).child(f"{name}/{PER_JOB[field]}")


def source_target(spec: JobSpec, name: str, store: Store, sha256: str) -> tuple[Store, str]:
    """Where job `name`'s packaged source goes: SageMaker's code_location/<job>/source/
    sourcedir.tar.gz when given, else the store's content-addressed sources/<sha256>/
    (shared by every job with that source)."""
    if spec.code_location:
        return per_job_store("code_location", spec.code_location, name), "sourcedir.tar.gz"
    return store, source_key(sha256)


def written_locations(spec: JobSpec, name: str) -> list[tuple[str, str]]:
    """(field, URI) of each location outside its directory in the store that job `name`
    writes to: its checkpoint and TensorBoard URIs, and its own folders under output_path
    and code_location, if given."""
    return [
        (field, per_job_store(field, uri, name).uri if field in PER_JOB else uri)
        for field, uri in written_uris(spec)
    ]


def tensorboard_store(record: JobRecord) -> Store:
    """Where the job's nodes copy their TensorBoard logs: tensorboard_s3_uri, else
    jobs/<job>/tensorboard/."""
    if record.spec.tensorboard_s3_uri:
        return open_store(record.spec.tensorboard_s3_uri, field="tensorboard_s3_uri")
    return open_store(record.store_uri).child(JobKeys(record.name).tensorboard)


def checkpoint_store(record: JobRecord, *, pinned: bool = False) -> Store:
    """The job's checkpoint URI: checkpoint_s3_uri, else jobs/<job>/checkpoints/
    (`pinned`: a node's, which writes there; see LocalStore)."""
    if record.spec.checkpoint_s3_uri:
        uri = record.spec.checkpoint_s3_uri
        return open_store(uri, field="checkpoint_s3_uri", pinned=pinned)
    return open_store(record.store_uri, pinned=pinned).child(JobKeys(record.name).checkpoints)
