"""The search, through Optuna: what the next trial runs, and whether a running trial should
be stopped early.

The study is rebuilt in memory from the tuning record (and each trial's metric history)
whenever it is asked: the record is the only state, so a tuning job taken over by another
process continues the same study, and no Optuna storage has to live beside the store. A
sampler's seed comes from the tuning job's `random_seed` and the trials already made, so a
rebuilt study neither repeats a suggestion nor depends on which process asks.

| strategy | sampler | early stopping |
|---|---|---|
| Bayesian | TPE (Optuna's Bayesian optimisation) | median rule with `early_stopping_type="Auto"` |
| Random | random | the same |
| Grid | each combination of the categorical and integer ranges once, seeded order | the same |
| Hyperband | TPE | Hyperband (successive halving brackets) always |
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from trainctl.errors import SpecError
from trainctl.tuning.record import TRIAL_ENDED, Trial, TuningRecord, TuningSpec

# Trials that end before the median rule may stop another, and the objective values a trial
# reports before it may be stopped.
MEDIAN_STARTUP_TRIALS = 3
MEDIAN_WARMUP_REPORTS = 2

# trial number -> {n: the objective's n-th reported value}
Intermediates = dict[int, dict[int, float]]


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise SpecError("strategy", "tuning needs Optuna: pip install 'trainctl[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def grid_size(spec: TuningSpec) -> int:
    """How many trials a Grid search has: every combination, once."""
    return grid_size_of(spec.parameter_ranges())


def grid_size_of(ranges: dict[str, Any]) -> int:
    size = 1
    for name, rng in ranges.items():
        if rng.kind == "continuous":
            raise SpecError(
                f"hyperparameter_ranges.{name}",
                "a Grid search takes categorical and integer ranges only (a continuous range "
                "has no grid); use Bayesian or Random, or list values in a CategoricalParameter",
            )
        size *= len(_grid_values(rng))
    return size


def _grid_values(rng: Any) -> list[Any]:
    if rng.kind == "categorical":
        return list(rng.values)
    return list(range(int(rng.min_value), int(rng.max_value) + 1))


def _sampler(spec: TuningSpec, made: int) -> Any:
    optuna = _optuna()
    # Each (tuning seed, trial) its own stream: seeds 0 and 1 share no suggestion (plain
    # seed + made would shift one sequence by one trial).
    seed = (spec.random_seed * 1_000_003 + made) % 2**32
    if spec.strategy == "Random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Bayesian (and Hyperband's proposals): TPE, after a few random startup trials
    startup = max(2, min(10, spec.max_jobs // 4))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)


def _pruner(spec: TuningSpec) -> Any:
    optuna = _optuna()
    if spec.strategy == "Hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, reduction_factor=3)
    if spec.early_stopping_type == "Auto":
        return optuna.pruners.MedianPruner(
            n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=MEDIAN_WARMUP_REPORTS
        )
    return optuna.pruners.NopPruner()


def study_of(record: TuningRecord, intermediates: Intermediates, made: int | None = None) -> Any:
    """The record's trials as an in-memory Optuna study."""
    optuna = _optuna()
    from optuna.trial import TrialState, create_trial

    spec = record.spec
    ranges = spec.parameter_ranges()
    distributions = {name: rng.distribution() for name, rng in ranges.items()}
    study = optuna.create_study(
        study_name=spec.name,
        direction="maximize" if spec.objective_type == "Maximize" else "minimize",
        sampler=_sampler(spec, len(record.trials) if made is None else made),
        pruner=_pruner(spec),
    )
    for trial in record.trials:
        params = {name: ranges[name].to_search(v) for name, v in trial.params.items()}
        values = {s: v for s, v in intermediates.get(trial.number, {}).items() if math.isfinite(v)}
        if (
            trial.state == "Completed"
            and trial.objective is not None
            and math.isfinite(trial.objective)
        ):
            state, value = TrialState.COMPLETE, trial.objective
        elif trial.state == "Pruned":
            state, value = TrialState.PRUNED, None
        elif trial.state in TRIAL_ENDED:
            state, value = TrialState.FAIL, None
        else:
            state, value = TrialState.RUNNING, None
        study.add_trial(
            create_trial(
                params=params,
                distributions=distributions,
                value=value,
                state=state,
                intermediate_values=values,
                system_attrs=dict(trial.search_attrs),
            )
        )
    return study


def suggest(record: TuningRecord, intermediates: Intermediates) -> dict[str, Any] | None:
    """The next trial's tuned hyperparameters (as the script gets them); None when a Grid
    has no combination left."""
    spec = record.spec
    if spec.strategy == "Grid":
        return _next_combination(record)
    study = study_of(record, intermediates)
    ranges = spec.parameter_ranges()
    asked = study.ask({name: rng.distribution() for name, rng in ranges.items()})
    return {name: _plain(ranges[name].from_search(v)) for name, v in asked.params.items()}


def _next_combination(record: TuningRecord) -> dict[str, Any] | None:
    """A Grid's next combination not yet tried, in an order shuffled by the seed (so a
    budget smaller than the grid samples it evenly); None when every one has been.
    (Optuna's GridSampler knows what it ran from its own storage only, not a record.)"""
    import random

    ranges = record.spec.parameter_ranges()
    names = sorted(ranges)
    every = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(_grid_values(ranges[n]) for n in names))
    ]
    random.Random(record.spec.random_seed).shuffle(every)
    tried = [t.params for t in record.trials]
    return next((combo for combo in every if combo not in tried), None)


def prune_reason(record: TuningRecord, trial: Trial, intermediates: Intermediates) -> str | None:
    """Why the running `trial` should stop now (None: it goes on), by the tuning job's
    pruner over every trial's intermediate objective values. What the pruner notes on the
    trial as it runs (Hyperband's rungs reached) is kept in `trial.search_attrs`, so the
    next rebuilt study knows it."""
    if not record.spec.prunes or not intermediates.get(trial.number):
        return None
    study = study_of(record, intermediates)
    frozen = study.trials[trial.number]
    pruned = study.pruner.prune(study, frozen)
    trial.search_attrs = {k: _plain(v) for k, v in study.trials[trial.number].system_attrs.items()}
    if not pruned:
        return None
    report = frozen.last_step
    value = frozen.intermediate_values[report]
    if record.spec.strategy == "Hyperband":
        rule = "outside its Hyperband rung's best"
    else:
        rule = "below" if record.spec.objective_type == "Maximize" else "above"
        rule += " the median of earlier trials at that report"
    metric = record.spec.objective_metric_name
    return f"pruned at report {report} of {metric}: {value:.6g} {rule}"


def _plain(value: Any) -> Any:
    """numpy/optuna scalars as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    return value
