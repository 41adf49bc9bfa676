"""The HyperparameterTuner (SageMaker's API over trainctl's Estimator): validation,
starting the detached supervisor (trainctl.tuning.loop), following and attaching; the
package's face (trainctl.tuning) re-exports it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainctl.errors import SpecError
from trainctl.tuning.ranges import (
    CategoricalParameter,
    ContinuousParameter,
    IntegerParameter,
    ParameterRange,
    first_error,
)
from trainctl.tuning.views import TuningAnalytics

STRATEGIES = ("Bayesian", "Random", "Grid", "Hyperband")


FOLLOW_SECONDS = 1.0


# How long a supervisor this process started may take to hold its lease before another is
# started in its place.
SPAWN_GRACE_SECONDS = 30.0


class HyperparameterTuner:
    """SageMaker's HyperparameterTuner: search `hyperparameter_ranges` of `estimator` for
    the best `objective_metric_name`, `max_jobs` trials, `max_parallel_jobs` at a time."""

    def __init__(
        self,
        estimator: Any,
        objective_metric_name: str,
        hyperparameter_ranges: dict[str, ParameterRange],
        metric_definitions: list[dict[str, str]] | None = None,
        strategy: str = "Bayesian",
        objective_type: str = "Maximize",
        max_jobs: int | None = None,
        max_parallel_jobs: int = 1,
        early_stopping_type: str = "Off",
        base_tuning_job_name: str | None = None,
        random_seed: int | None = None,
    ) -> None:
        from trainctl.tuning.record import TuningSpec

        self._set(
            estimator, objective_metric_name, hyperparameter_ranges, metric_definitions,
            base_tuning_job_name,
        )  # fmt: skip
        _check_choice("strategy", strategy, STRATEGIES)
        _check_choice("objective_type", objective_type, ("Maximize", "Minimize"))
        _check_choice("early_stopping_type", early_stopping_type, ("Off", "Auto"))
        self._check_ranges()
        self._check_objective()
        fields = {
            "name": "unnamed",
            "job": self.estimator.spec,
            "ranges": {n: r.model_dump() for n, r in self.hyperparameter_ranges.items()},
            "objective_metric_name": objective_metric_name,
            "objective_type": objective_type,
            "strategy": strategy,
            "max_jobs": max_jobs or 1,
            "max_parallel_jobs": max_parallel_jobs,
            "early_stopping_type": early_stopping_type,
            "random_seed": 0 if random_seed is None else random_seed,
        }
        if strategy == "Grid":
            from trainctl.tuning.search import grid_size_of

            size = grid_size_of(self.hyperparameter_ranges)
            fields["max_jobs"] = min(max_jobs or size, size)
        elif max_jobs is None:
            raise SpecError("max_jobs", f"is required with the {strategy} strategy")
        if max_parallel_jobs > fields["max_jobs"]:
            raise SpecError(
                "max_parallel_jobs",
                f"{max_parallel_jobs} is more than max_jobs {fields['max_jobs']}",
            )
        try:
            self._template = TuningSpec(**fields)
        except ValidationError as exc:
            where, message = first_error(exc)
            raise SpecError(where or "tuning", message) from None

    def _set(
        self,
        estimator: Any,
        objective_metric_name: str,
        hyperparameter_ranges: dict[str, ParameterRange],
        metric_definitions: list[dict[str, str]] | None,
        base_tuning_job_name: str | None,
    ) -> None:
        """Every attribute a tuner has, set in one place (a new tuner and an attached one)."""
        # A SageMaker-shaped estimator (trainctl.sagemaker) wraps a trainctl Estimator; its
        # fit() resolves SageMaker's channels, which the tuner's fit() does the same way.
        self.estimator = getattr(estimator, "_estimator", estimator)
        self._channels = getattr(estimator, "_channels", None)
        self.objective_metric_name = objective_metric_name
        self.hyperparameter_ranges = dict(hyperparameter_ranges or {})
        self.metric_definitions = list(metric_definitions or [])
        self.base_tuning_job_name = base_tuning_job_name
        self.latest_tuning_job: str | None = None
        self.default_inputs: Any = None  # fit()'s inputs when it is given none (a tune.yaml's)
        self._store: Any = None
        self._template: Any = None

    # -- checks (before anything is made) ---------------------------------------------------
    def _check_ranges(self) -> None:
        if not self.hyperparameter_ranges:
            raise SpecError("hyperparameter_ranges", "needs at least one range to tune")
        fixed = self.estimator.spec.hyperparameters
        for name, rng in self.hyperparameter_ranges.items():
            if not isinstance(rng, ParameterRange):
                raise SpecError(
                    f"hyperparameter_ranges.{name}",
                    "must be a ContinuousParameter, IntegerParameter or CategoricalParameter",
                )
            if name in fixed:
                raise SpecError(
                    f"hyperparameter_ranges.{name}",
                    f"is also a fixed hyperparameter of the estimator ({name}={fixed[name]!r}); "
                    "tune it or fix it, not both",
                )

    def _check_objective(self) -> None:
        """The objective must come from somewhere: a metric definition (the tuner's or the
        estimator's) or a report_step key in the script's source."""
        name = self.objective_metric_name
        if not isinstance(name, str) or not name:
            raise SpecError("objective_metric_name", "must name a metric")
        defined = {d.get("Name") for d in self.metric_definitions}
        defined |= {m.Name for m in self.estimator.spec.metric_definitions}
        if name in defined:
            return
        spec = self.estimator.spec
        pattern = re.compile(rf"\b{re.escape(name)}\s*=|[\"']{re.escape(name)}[\"']")
        for path in sorted(Path(spec.source_dir).rglob("*.py"))[:500]:
            try:
                if pattern.search(path.read_text(encoding="utf-8", errors="replace")):
                    return
            except OSError:
                continue
        raise SpecError(
            "objective_metric_name",
            f"no metric definition and no report_step key in {spec.source_dir} produces "
            f"{name!r}; report it (report_step(step, {name}=...)) or define it "
            f"(metric_definitions=[{{'Name': '{name}', 'Regex': '...'}}])",
        )

    # -- running ------------------------------------------------------------------------------
    def fit(
        self,
        inputs: Any = None,
        job_name: str | None = None,
        include_cls_metadata: bool = False,
        estimator_kwargs: dict[str, Any] | None = None,
        wait: bool = True,
        logs: bool = True,
    ) -> None:
        """Start the tuning job (SageMaker's arguments; `include_cls_metadata` and
        `estimator_kwargs` have nothing to do here); with `wait`, follow it to its end
        (Ctrl-C stops following only: the tuning job goes on,
        `HyperparameterTuner.attach(name)` finds it)."""
        from trainctl.controller.submit import generate_job_name, preflight
        from trainctl.spec.parts import MetricDefinition
        from trainctl.tuning.loop import spawn_supervisor
        from trainctl.tuning.record import (
            MAX_TUNING_NAME,
            TuningRecord,
            TuningStore,
            check_tuning_name,
        )

        extra_definitions = [
            MetricDefinition(**d)
            for d in self.metric_definitions
            if d.get("Name") not in {m.Name for m in self.estimator.spec.metric_definitions}
        ]
        if inputs is None:
            inputs = self.default_inputs
        if self._channels is not None:
            inputs = self._channels(inputs)
        spec = self.estimator.job_spec(inputs)
        spec = spec.model_copy(
            update={
                "job_name": None,
                "metric_definitions": [*spec.metric_definitions, *extra_definitions],
            }
        )
        store = self.estimator.store()
        preflight(spec, store.uri)  # every check a trial's submit makes, before anything
        # `tune-train-...`: told from a training job's `train-...` at a glance
        base = self.base_tuning_job_name or f"tune-{Path(spec.entry_point).stem}"
        name = job_name or generate_job_name(base)[:MAX_TUNING_NAME].strip("-")
        tuning = TuningStore(store, check_tuning_name(name))
        if tuning.exists():
            raise SpecError("job_name", f"a tuning job named {name!r} already exists")
        record = TuningRecord(spec=self._template.model_copy(update={"name": name, "job": spec}))
        tuning.save(record)
        self._store, self.latest_tuning_job = store, name
        spawn_supervisor(store, name)
        self._spawned_at = time.monotonic()
        if logs:
            print(f"[trainctl] tuning job {name}: {record.spec.max_jobs} trial(s), "
                  f"{record.spec.max_parallel_jobs} at a time", flush=True)  # fmt: skip
        if wait:
            self.wait(logs=logs)

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> HyperparameterTuner:
        """A tuner from a tune.yaml's mapping (`trainctl tune -f`): the job's fields, as a
        job file has them, and a `tuning:` block of this constructor's arguments, each range
        a mapping with its `type` (continuous, integer, categorical)."""
        from trainctl.estimator import Estimator

        fields = dict(data)
        block = fields.pop("tuning", None)
        if not isinstance(block, dict):
            raise SpecError(
                "tuning", "the file needs a tuning: mapping (objective, ranges, budget)"
            )
        block = dict(block)
        ranges = block.pop("hyperparameter_ranges", None)
        if not isinstance(ranges, dict) or not ranges:
            raise SpecError("tuning.hyperparameter_ranges", "needs at least one range to tune")
        allowed = {
            "objective_metric_name", "metric_definitions", "strategy", "objective_type",
            "max_jobs", "max_parallel_jobs", "early_stopping_type", "base_tuning_job_name",
            "random_seed",
        }  # fmt: skip
        for key in block:
            if key not in allowed:
                raise SpecError(f"tuning.{key}", f"unknown; allowed: {', '.join(sorted(allowed))}")
        entry = fields.pop("entry_point", None)
        if not entry:
            raise SpecError("entry_point", "is required (the script to run, e.g. train.py)")
        source = fields.pop("source_dir", None)
        inputs = fields.pop("inputs", None)
        estimator = Estimator(entry, source, **fields)
        tuner = cls(
            estimator,
            hyperparameter_ranges={n: range_from_config(n, r) for n, r in ranges.items()},
            **block,
        )
        tuner.default_inputs = inputs
        return tuner

    @classmethod
    def attach(cls, tuning_job_name: str, store_uri: str | None = None) -> HyperparameterTuner:
        """The tuner of an existing tuning job. One still in progress whose supervisor is
        gone (its machine or process died) is taken over: a new supervisor continues the
        same study, losing and repeating no trial."""
        from trainctl.estimator import Estimator
        from trainctl.store import default_store, open_store
        from trainctl.tuning.ranges import range_from_dict
        from trainctl.tuning.record import TuningStore

        store = open_store(store_uri) if store_uri else default_store()
        record = TuningStore(store, tuning_job_name).load()
        spec = record.spec
        # (not __init__: its checks were made when the tuning job started, maybe elsewhere,
        # where the script's source was)
        tuner = cls.__new__(cls)
        tuner._set(
            Estimator.from_spec(spec.job, store.uri),
            spec.objective_metric_name,
            {n: range_from_dict(r) for n, r in spec.ranges.items()},
            None,
            None,
        )
        tuner._template = spec
        tuner._store, tuner.latest_tuning_job = store, tuning_job_name
        tuner._ensure_supervised()
        return tuner

    def _ensure_supervised(self) -> None:
        """A supervisor for a tuning job in progress that has none (not one this process
        started moments ago, still starting up: it holds no lease yet)."""
        from trainctl.tuning.loop import spawn_supervisor, supervisor_alive

        spawned = getattr(self, "_spawned_at", None)
        if spawned is not None and time.monotonic() - spawned < SPAWN_GRACE_SECONDS:
            return
        record = self._record()
        if record.state == "InProgress" and not supervisor_alive(self._store, record.name):
            spawn_supervisor(self._store, record.name)
            self._spawned_at = time.monotonic()

    def wait(self, logs: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """Follow the tuning job until it ends (taking it over if its supervisor is gone);
        a line per trial as it starts and ends. The description, at the end."""
        seen: dict[int, str] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        last_check = 0.0
        while True:
            record = self._record()
            if logs:
                for trial in record.trials:
                    if seen.get(trial.number) != trial.state:
                        seen[trial.number] = trial.state
                        print(_trial_line(record, trial), flush=True)
            if record.state != "InProgress":
                if logs:
                    best = record.best()
                    tail = f"; best {best.job} ({best.objective:.6g})" if best else ""
                    print(f"[trainctl] tuning job {record.name}: {record.state}{tail}", flush=True)
                return self.describe()
            if time.monotonic() - last_check > 10:
                last_check = time.monotonic()
                self._ensure_supervised()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"tuning job {record.name} still in progress")
            time.sleep(FOLLOW_SECONDS)

    def stop_tuning_job(self) -> None:
        """Stop every running trial and end the tuning job (state Stopped)."""
        from trainctl.tuning.record import TuningStore

        TuningStore(self._store_or_fail(), self._name()).request_stop()
        self._ensure_supervised()

    # -- results ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        from trainctl.tuning.views import tuning_goodput

        record = self._record()
        best = record.best()
        counts: dict[str, int] = {}
        for trial in record.trials:
            counts[trial.state] = counts.get(trial.state, 0) + 1
        return {
            "name": record.name,
            "state": record.state,
            "strategy": record.spec.strategy,
            "objective": {
                "name": record.spec.objective_metric_name,
                "type": record.spec.objective_type,
            },
            "trials": counts,
            "best_training_job": None
            if best is None
            else {"name": best.job, "objective": best.objective, "hyperparameters": best.params},
            "failure_reason": record.failure_reason,
            "goodput": tuning_goodput(self._store_or_fail(), record),
        }

    def best_training_job(self) -> str:
        """The name of the trial job with the best objective."""
        best = self._record().best()
        if best is None:
            raise SpecError("tuning", f"tuning job {self._name()!r} has no completed trial yet")
        return best.job

    def best_estimator(self) -> Any:
        """An Estimator with the best trial's hyperparameters, attached to that trial's job
        (its model_data is the trial's model)."""
        from trainctl.estimator import Estimator, TrainingJob

        record = self._record()
        best = record.best()
        if best is None:
            raise SpecError("tuning", f"tuning job {record.name!r} has no completed trial yet")
        spec = record.spec.job
        hyperparameters = {**spec.hyperparameters, **best.params}
        estimator = Estimator.from_spec(
            spec.model_copy(update={"hyperparameters": hyperparameters}),
            self._store_or_fail().uri,
        )
        estimator.latest_training_job = TrainingJob(best.job, self._store_or_fail())
        return estimator

    def _repr_html_(self) -> str:
        """The notebook view: the tuning job's state and its trials, the best in bold."""
        import html

        if self.latest_tuning_job is None:
            objective = html.escape(self.objective_metric_name)
            return f"<div><b>HyperparameterTuner</b>: {objective}, not fitted yet</div>"
        record = self._record()
        best = record.best()
        ranges = list(record.spec.ranges)
        head = "".join(
            f"<th>{html.escape(c)}</th>"
            for c in ("trial", "job", "state", record.spec.objective_metric_name, *ranges)
        )
        rows = []
        for trial in record.trials:
            cells = [
                str(trial.number),
                trial.job,
                trial.state,
                "-" if trial.objective is None else f"{trial.objective:.6g}",
                *(_short(trial.params.get(r, "-")) for r in ranges),
            ]
            tag = "b" if best is not None and trial.number == best.number else "span"
            rows.append(
                "<tr>"
                + "".join(f"<td><{tag}>{html.escape(c)}</{tag}></td>" for c in cells)
                + "</tr>"
            )
        title = html.escape(
            f"tuning job {record.name}: {record.state} ({record.spec.strategy}, "
            f"{record.spec.objective_type} {record.spec.objective_metric_name})"
        )
        return f"<div><b>{title}</b><table><tr>{head}</tr>{''.join(rows)}</table></div>"

    def analytics(self) -> TuningAnalytics:
        return TuningAnalytics(self._record(), self._store_or_fail())

    # -- helpers --------------------------------------------------------------------------
    def _name(self) -> str:
        if self.latest_tuning_job is None:
            raise SpecError("tuning", "no tuning job yet: call fit() first")
        return self.latest_tuning_job

    def _store_or_fail(self) -> Any:
        self._name()
        return self._store

    def _record(self) -> Any:
        from trainctl.tuning.record import TuningStore

        return TuningStore(self._store_or_fail(), self._name()).load()


def range_from_config(name: str, data: Any) -> ParameterRange:
    """A range from a tune.yaml: {type: continuous|integer|categorical, ...}."""
    kinds = {
        "continuous": ContinuousParameter,
        "integer": IntegerParameter,
        "categorical": CategoricalParameter,
    }
    field = f"tuning.hyperparameter_ranges.{name}"
    if not isinstance(data, dict) or data.get("type") not in kinds:
        raise SpecError(field, f"must be a mapping with type: {', '.join(kinds)}")
    args = {k: v for k, v in data.items() if k != "type"}
    try:
        return kinds[data["type"]](**args)
    except TypeError as exc:
        raise SpecError(field, str(exc)) from None


def _check_choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field, f"{value!r} is not one of {', '.join(allowed)}")


def _trial_line(record: Any, trial: Any) -> str:
    params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    head = f"[trainctl] trial {trial.number} {trial.job} {trial.state}"
    if trial.state in ("Pending", "Running"):
        return f"{head}: {params}"
    value = (
        ""
        if trial.objective is None
        else f" {record.spec.objective_metric_name}={trial.objective:.6g}"
    )
    why = f" ({trial.reason})" if trial.reason else ""
    return f"{head}{value}{why}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
