"""The parts of a job spec that are models of their own: distribution (the launcher),
metric definitions, injected faults."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainctl.errors import SpecError

FAULT_RE = re.compile(
    r"(kill|notice|nocapacity):((?:algo-[1-9][0-9]*|[0-9]+)(?:,(?:algo-[1-9][0-9]*|[0-9]+))*)"
    r"@(step[0-9]+|ckpt[0-9]+|first\+[0-9]+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?)"
    r"(?:\+([0-9]+(?:\.[0-9]+)?))?"
)


FAULT_FORMAT = (
    "KIND:NODE@WHEN with KIND kill, notice or nocapacity, NODE a rank (0, 1, ...) or "
    "algo-N, or several joined by commas (hit at once), WHEN seconds into the attempt's "
    "training, stepN (once the script has reported step N), first+N (N seconds after the "
    "attempt's first training step, reported or not) or ckptN (once the attempt's nodes have "
    "stored N checkpoint files); nocapacity takes +SECONDS too (how long no replacement can "
    "be had)"
)


class Fault(BaseModel):
    """An injected fault: at `at` seconds into training of the current attempt. `kill` ends
    the node's processes (a lost machine), `notice` serves it an interruption notice, and
    `nocapacity` kills it and leaves no capacity for a replacement for `duration` seconds
    (None: for good), as a spot reclaim in a pool that has run dry. Several nodes
    (`nocapacity:2,3@20+60`: `rank` and `others`) are hit at the same moment."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str
    rank: int
    at: float = 0.0
    # Instead of `at`: once the attempt's script has reported this step (a condition, not a
    # time, so the fault hits the same point of training on a fast machine and a slow one).
    step: int | None = None
    # Instead of `at`: once the attempt's nodes have stored this many checkpoint files (their
    # checkpoint dirs' files and saved-state files of their working dirs): the point of
    # training a script that reports no steps reaches on any machine.
    checkpoints: int | None = None
    # Instead of `at`: this many seconds after the attempt's first training step (the
    # script's first reported step or resume, else its first optimizer step as the worker
    # hook sees it): past a slow script's imports and data loading, on any machine.
    after_first_step: float | None = None
    duration: float | None = None
    others: tuple[int, ...] = ()

    @property
    def ranks(self) -> tuple[int, ...]:
        return (self.rank, *self.others)

    @property
    def timed(self) -> bool:
        """Aimed at a time into the attempt's training (`at`), not at a point it reaches."""
        return self.step is None and self.checkpoints is None and self.after_first_step is None

    @classmethod
    def parse(cls, text: str) -> Fault:
        m = FAULT_RE.fullmatch(text.strip())
        if not m:
            raise ValueError(
                f"{text!r} is not {FAULT_FORMAT} "
                "(e.g. kill:1@30, notice:algo-2@12.5, kill:1@step40)"
            )
        ranks = [
            int(node[5:]) - 1 if node.startswith("algo-") else int(node)
            for node in m.group(2).split(",")
        ]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{text!r} names a node twice")
        if m.group(4) is not None and m.group(1) != "nocapacity":
            raise ValueError(f"{text!r}: only nocapacity takes +SECONDS")
        duration = float(m.group(4)) if m.group(4) is not None else None
        when = m.group(3)
        step = int(when[4:]) if when.startswith("step") else None
        checkpoints = int(when[4:]) if when.startswith("ckpt") else None
        after_first_step = float(when[6:]) if when.startswith("first+") else None
        timed = step is None and checkpoints is None and after_first_step is None
        return cls(
            kind=m.group(1),
            rank=ranks[0],
            others=tuple(ranks[1:]),
            at=float(when) if timed else 0.0,
            step=step,
            checkpoints=checkpoints,
            after_first_step=after_first_step,
            duration=duration,
        )

    def __str__(self) -> str:
        tail = f"+{self.duration:g}" if self.duration is not None else ""
        nodes = ",".join(str(r) for r in self.ranks)
        when = f"step{self.step}" if self.step is not None else f"{self.at:g}"
        if self.checkpoints is not None:
            when = f"ckpt{self.checkpoints}"
        if self.after_first_step is not None:
            when = f"first+{self.after_first_step:g}"
        return f"{self.kind}:{nodes}@{when}{tail}"

    def due(
        self,
        elapsed: float,
        step: int | None,
        stored: int = 0,
        stepping: float | None = None,
    ) -> bool:
        """Whether the fault fires now: `elapsed` seconds into the attempt's training, with
        the script's latest reported `step` (None: none yet), `stored` checkpoint files
        stored by the attempt's nodes, `stepping` seconds since its first step (None: none
        yet)."""
        if self.after_first_step is not None:
            return stepping is not None and stepping >= self.after_first_step
        if self.step is not None:
            return step is not None and step >= self.step
        if self.checkpoints is not None:
            return stored >= self.checkpoints
        return elapsed >= self.at


class StrictModel(BaseModel):
    # strict: a job file's "yes" is not true, "2" not a count (JobSpec's own fields likewise)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TorchDistributed(StrictModel):
    enabled: bool = True


class MPIDistribution(StrictModel):
    enabled: bool = True
    processes_per_host: int | None = Field(default=None, ge=1)
    custom_mpi_options: str = ""


class SMDistributed(StrictModel):
    """SageMaker's data-parallel library, asked for by name: torchrun runs it (its ranks
    import a stand-in over torch.distributed), and its scripts' toolkit says it is on
    (`sagemaker_distributed_dataparallel_enabled` in SM_FRAMEWORK_PARAMS)."""

    dataparallel: TorchDistributed


class Distribution(StrictModel):
    """Which launcher runs the entry point on each host. Absent: plain `python`, once per host."""

    torch_distributed: TorchDistributed | None = None
    mpi: MPIDistribution | None = None
    smdistributed: SMDistributed | None = None

    @model_validator(mode="after")
    def _smdistributed_under_torchrun(self) -> Distribution:
        if self.smdistributed and self.launcher != "torchrun":
            raise ValueError("smdistributed runs under torchrun: enable torch_distributed too")
        return self

    @model_validator(mode="after")
    def _one_launcher(self) -> Distribution:
        if (
            self.torch_distributed
            and self.torch_distributed.enabled
            and self.mpi
            and self.mpi.enabled
        ):
            raise ValueError("enable either torch_distributed or mpi, not both")
        return self

    @property
    def launcher(self) -> str:
        """'torchrun', 'mpi' or 'python'."""
        if self.torch_distributed and self.torch_distributed.enabled:
            return "torchrun"
        if self.mpi and self.mpi.enabled:
            return "mpi"
        return "python"


INPUT_MODES = ("File", "FastFile")


class ChannelConfig(StrictModel):
    """How one input channel reaches the nodes (SageMaker's TrainingInput, the parts that
    trainctl honours): every node gets every object (FullyReplicated), or each of N nodes
    gets every N-th object of the channel in key order (ShardedByS3Key). `input_mode`: File
    gives the script its own copy of a file:// channel, which nothing it writes can reach
    through; FastFile links the original instead (no copy of very large data, but a write
    changes it). s3:// channels are downloaded either way."""

    distribution: Literal["FullyReplicated", "ShardedByS3Key"] = "FullyReplicated"
    content_type: str | None = Field(default=None, min_length=1, max_length=256)
    input_mode: Literal["File", "FastFile"] = "File"


class MetricDefinition(StrictModel):
    Name: str = Field(min_length=1, max_length=255)
    Regex: str = Field(min_length=1, max_length=500)

    @field_validator("Regex")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            pattern = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        if pattern.groups < 1:
            raise ValueError("needs one capture group for the metric's value")
        return v


def parse_distribution(name: str) -> dict[str, Any] | None:
    """The CLI's `--distribution NAME` shorthand."""
    table: dict[str, dict[str, Any] | None] = {
        "torch_distributed": {"torch_distributed": {"enabled": True}},
        "torchrun": {"torch_distributed": {"enabled": True}},
        "mpi": {"mpi": {"enabled": True}},
        "none": None,
    }
    if name not in table:
        raise SpecError("distribution", f"unknown {name!r}; allowed: {', '.join(table)}")
    return table[name]
