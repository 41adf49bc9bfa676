"""A job's record as data: JobRecord, its attempts and their nodes, what each attempt
restored, and the text views of them (`status`, `describe()`)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainctl.clock import clock
from trainctl.record.costs import (
    InstanceCost,
    cost_summary,
)
from trainctl.record.keys import (
    TO_FIRST_STEP,
    Timestamp,
    parse_iso,
)
from trainctl.spec.job import JobSpec
from trainctl.state import JobState


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
    seconds: float = 0.0  # how long the node took to put it back (checkpoints, files)

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
            seconds=_seconds(msg.get("seconds")),
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
    seconds: float = 0.0  # the slowest node's restore (training waits for every node)

    def add(self, node: NodeRestored) -> None:
        """One node's report (the agent's `restored` message)."""
        self.nodes += 1
        self.by_node = sorted([*self.by_node, node], key=lambda n: n.rank)
        self.newest = next((n.newest for n in self.by_node if n.newest), None)
        self.seconds = max(self.seconds, node.seconds)
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


def _seconds(value: Any) -> float:
    """A node's count of seconds, or 0 for anything else it sent."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return 0.0


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
    # capacity, ssh, agent, image, code, venv, launch (launcher start -> first step), and
    # to_first_step (all of it).
    startup: dict[str, float] | None = None
    # What its nodes restored before the script started (None: not reported).
    restored: Restored | None = None
    # The warm pool it started on (None: capacity launched for it).
    warm_pool: str | None = None
    # The provider's id of its capacity (Slurm's job id), where it has one.
    capacity_id: str | None = None
    # Where its node-time went (record.goodput): when its capacity was asked for, how much of
    # the capacity stage was a wait for capacity (no node paid for), when its last step was
    # reported, and how long its saves held the training loop (rank 0's Checkpointer) and
    # its loop waited for data (the script's timed_batches).
    requested_at: Timestamp | None = None
    waited_seconds: float | None = None
    last_step_at: Timestamp | None = None
    checkpoint_stall_seconds: float | None = None
    data_wait_seconds: float | None = None
    # When the controller saw what ended it (a node lost, a notice), for an interrupted
    # attempt; and for the attempt after one, seconds from then to each stage of its
    # recovery (attempt_ended, capacity, nodes_started, state_restored, first_step).
    interrupted_at: Timestamp | None = None
    recovery: dict[str, float] | None = None

    @field_validator("startup")
    @classmethod
    def _startup_names(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        # (records written before the stage had its name called it "total")
        if v is not None and "total" in v and TO_FIRST_STEP not in v:
            v = {(TO_FIRST_STEP if k == "total" else k): s for k, s in v.items()}
        return v

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
        if self.last_step is None or not self.startup or TO_FIRST_STEP not in self.startup:
            return None
        # (started_at is once it had its nodes; the start-up counts the capacity too)
        startup = self.startup
        begun = parse_iso(self.started_at) + startup[TO_FIRST_STEP] - startup.get("capacity", 0)
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
    # The training steps in all: the script's report_step(total_steps=N), else the spec's.
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
        {"step", "total_steps", "fraction", "steps_per_second", "seconds_left"}; the rate is the
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
            "total_steps": total,
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
                "goodput": self.goodput(),
                "store": f"{self.store_uri}/jobs/{self.name}",
                "measurement_of": self.measurement_of,
            }
        )

    def goodput(self) -> dict[str, Any] | None:
        """Where its paid node-time went (trainctl.record.goodput), as JSON data."""
        from trainctl.record.goodput import goodput, rounded

        value = goodput(self)
        return None if value is None else rounded(value)

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
    done, total = progress["step"], progress["total_steps"]
    text = f"{done:,}/{total:,} steps ({progress['fraction']:.0%})"
    left = progress.get("seconds_left")
    if left is not None:
        minutes, seconds = divmod(round(left), 60)
        hours, minutes = divmod(minutes, 60)
        text += f", ~{hours}h{minutes:02d}m left" if hours else f", ~{minutes}m{seconds:02d}s left"
    return text
