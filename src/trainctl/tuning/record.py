"""A tuning job's record in the store, beside the training jobs: `tuning/<name>/tuning.json`
(its spec, every trial with its training job, parameters, state and objective) and
`tuning/<name>/lease.json` (the process running its search). Each trial is an ordinary
training job, `jobs/<name>-NNN/`, that names its tuning job."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainctl.errors import NotFoundError, SpecError
from trainctl.spec.checks import JOB_NAME_RE
from trainctl.spec.job import JobSpec
from trainctl.store import Store
from trainctl.tuning.ranges import ParameterRange, range_from_dict

Strategy = Literal["Bayesian", "Random", "Grid", "Hyperband"]
TrialState = Literal["Pending", "Running", "Completed", "Failed", "Stopped", "Pruned"]
TuningState = Literal["InProgress", "Completed", "Failed", "Stopped"]
TRIAL_ENDED = ("Completed", "Failed", "Stopped", "Pruned")
# Trial job names are the tuning job's name and a 3-digit number: 59 + 4 <= 63 characters.
MAX_TUNING_NAME = 59


class TuningSpec(BaseModel):
    """What a tuning job searches, how, and for how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    job: JobSpec  # every trial's spec, before its tuned hyperparameters
    ranges: dict[str, dict[str, Any]]  # name -> a range's model_dump
    objective_metric_name: str
    objective_type: Literal["Maximize", "Minimize"] = "Maximize"
    strategy: Strategy = "Bayesian"
    max_jobs: int = Field(ge=1, le=10_000)
    max_parallel_jobs: int = Field(default=1, ge=1, le=100)
    early_stopping_type: Literal["Off", "Auto"] = "Off"
    random_seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> TuningSpec:
        if self.max_parallel_jobs > self.max_jobs:
            raise ValueError(
                f"max_parallel_jobs {self.max_parallel_jobs} is more than max_jobs {self.max_jobs}"
            )
        return self

    def parameter_ranges(self) -> dict[str, ParameterRange]:
        return {name: range_from_dict(data) for name, data in self.ranges.items()}

    @property
    def prunes(self) -> bool:
        """Whether trials are stopped early from their intermediate objective values."""
        return self.early_stopping_type == "Auto" or self.strategy == "Hyperband"


class Trial(BaseModel):
    model_config = ConfigDict(extra="forbid")

    number: int
    job: str
    params: dict[str, Any]  # the tuned hyperparameters, as the script gets them
    state: TrialState = "Pending"
    objective: float | None = None  # the objective's final value
    reason: str | None = None  # why it ended other than Completed (pruned: at which report)
    # What the search noted on the trial as it ran (Hyperband: the rungs it reached), kept
    # here so a study rebuilt from the record knows it.
    search_attrs: dict[str, Any] = {}
    # Its nodes are kept warm for a later trial (keep_alive_period_in_seconds set by the
    # tuning job): what the tuning job releases at its end if no trial claimed them.
    kept_warm: bool = False
    started_at: float | None = None
    ended_at: float | None = None


class TuningRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: TuningSpec
    state: TuningState = "InProgress"
    trials: list[Trial] = []
    created_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    failure_reason: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def best(self) -> Trial | None:
        """The completed trial with the best objective (the first, among equals)."""
        done = [t for t in self.trials if t.state == "Completed" and _finite(t.objective)]
        if not done:
            return None
        sign = 1 if self.spec.objective_type == "Maximize" else -1
        return max(done, key=lambda t: (sign * (t.objective or 0.0), -t.number))

    def running(self) -> list[Trial]:
        return [t for t in self.trials if t.state not in TRIAL_ENDED]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class TuningStore:
    """A tuning job's keys in the store."""

    def __init__(self, store: Store, name: str) -> None:
        check_tuning_name(name)
        self.store, self.name = store, name
        self.prefix = f"tuning/{name}"

    @property
    def record_key(self) -> str:
        return f"{self.prefix}/tuning.json"

    @property
    def lease_key(self) -> str:
        return f"{self.prefix}/lease.json"

    def exists(self) -> bool:
        try:
            self.store.get_text(self.record_key)
        except NotFoundError:
            return False
        return True

    def load(self) -> TuningRecord:
        try:
            text = self.store.get_text(self.record_key)
        except NotFoundError:
            raise NotFoundError(f"no tuning job {self.name!r} in {self.store.uri}") from None
        try:
            return TuningRecord.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            raise SpecError(
                "tuning",
                f"tuning job {self.name!r}: its record is unreadable ({exc.__class__.__name__})",
            ) from None

    def save(self, record: TuningRecord) -> None:
        self.store.put_text(self.record_key, record.model_dump_json(indent=2))

    @property
    def stop_key(self) -> str:
        return f"{self.prefix}/control/stop"

    def request_stop(self) -> None:
        """Ask the supervisor to stop every running trial and end the tuning job (a key of
        its own: only the supervisor writes the record)."""
        self.store.put_text(self.stop_key, json.dumps({"time": time.time()}))

    def stop_requested(self) -> bool:
        try:
            self.store.get_text(self.stop_key)
        except NotFoundError:
            return False
        return True

    def event(self, kind: str, **fields: Any) -> None:
        """A line in the tuning job's own event log (trials started, pruned, ended)."""
        key = f"{self.prefix}/events.jsonl"
        try:
            before = self.store.get_text(key)
        except NotFoundError:
            before = ""
        line = json.dumps({"time": time.time(), "type": kind, **fields})
        self.store.put_text(key, before + line + "\n")


def check_tuning_name(name: str) -> str:
    if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name) or len(name) > MAX_TUNING_NAME:
        raise SpecError(
            "base_tuning_job_name",
            f"{name!r} is not a tuning job name: 1-{MAX_TUNING_NAME} letters, digits and "
            "hyphens, starting and ending with a letter or digit",
        )
    return name


def trial_job_name(tuning: str, number: int) -> str:
    return f"{tuning}-{number:03d}"
