"""Tuning's bad input (one line naming the field, before anything is made) and its search
(Optuna, rebuilt from the record each time it is asked)."""

from __future__ import annotations

import pytest

from tests.helpers import FIXTURES
from trainctl import Estimator
from trainctl.errors import SpecError
from trainctl.tuning import (
    CategoricalParameter,
    ContinuousParameter,
    HyperparameterTuner,
    IntegerParameter,
)
from trainctl.tuning.record import Trial, TuningRecord
from trainctl.tuning.search import prune_reason, suggest


def _estimator(**fields) -> Estimator:
    return Estimator("train.py", source_dir=str(FIXTURES / "tunable"), **fields)


def _tuner(**kw) -> HyperparameterTuner:
    args = {
        "estimator": _estimator(),
        "objective_metric_name": "accuracy",
        "hyperparameter_ranges": {"lr": ContinuousParameter(0.001, 1.0)},
        "max_jobs": 4,
    }
    return HyperparameterTuner(**{**args, **kw})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ContinuousParameter(1.0, 1.0), "ContinuousParameter: min_value 1 must be below"),
        (
            lambda: ContinuousParameter(0.0, 1.0, "Logarithmic"),
            "ContinuousParameter: a Logarithmic range needs min_value > 0, got 0",
        ),
        (lambda: IntegerParameter(1.5, 3), "IntegerParameter: an IntegerParameter's bounds"),
        (lambda: CategoricalParameter([]), "CategoricalParameter: a CategoricalParameter needs"),
        (lambda: ContinuousParameter(0, 1, "Sideways"), "ContinuousParameter: scaling_type:"),
    ],
)
def test_a_bad_range_is_one_line(make, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        make()
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_jobs": 2, "max_parallel_jobs": 3}, "max_parallel_jobs: 3 is more than max_jobs 2"),
        (
            {"objective_metric_name": "f1"},
            "objective_metric_name: no metric definition and no report_step key in",
        ),
        (
            {"estimator": _estimator(hyperparameters={"lr": 0.1})},
            "hyperparameter_ranges.lr: is also a fixed hyperparameter of the estimator (lr=0.1)",
        ),
        ({"strategy": "Genetic"}, "strategy: 'Genetic' is not one of Bayesian, Random, Grid"),
        ({"objective_type": "Max"}, "objective_type: 'Max' is not one of Maximize, Minimize"),
        ({"strategy": "Grid"}, "hyperparameter_ranges.lr: a Grid search takes categorical"),
        ({"max_jobs": None}, "max_jobs: is required with the Bayesian strategy"),
        ({"hyperparameter_ranges": {}}, "hyperparameter_ranges: needs at least one range"),
    ],
)
def test_a_tuner_that_cannot_work_is_one_line(kw: dict, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        _tuner(**kw)
    assert str(raised.value).startswith(message), str(raised.value)


def test_an_objective_from_a_metric_definition_needs_no_report_step() -> None:
    tuner = _tuner(
        objective_metric_name="val:acc",
        metric_definitions=[{"Name": "val:acc", "Regex": "accuracy=([0-9.]+)"}],
    )
    assert tuner.objective_metric_name == "val:acc"


def _record(strategy: str = "Random", **kw) -> TuningRecord:
    tuner = _tuner(
        strategy=strategy,
        hyperparameter_ranges={
            "width": IntegerParameter(8, 10),
            "optimizer": CategoricalParameter(["sgd", "adam"]),
            **kw.pop("ranges", {}),
        },
        **kw,
    )
    return TuningRecord(spec=tuner._template.model_copy(update={"name": "t"}))


def test_grid_runs_every_combination_once_then_stops() -> None:
    record = _record("Grid", max_jobs=None)
    assert record.spec.max_jobs == 6  # 3 widths x 2 optimizers
    seen = []
    while (params := suggest(record, {})) is not None:
        seen.append((params["width"], params["optimizer"]))
        record.trials.append(Trial(number=len(record.trials), job="j", params=params))
    assert sorted(seen) == sorted((w, o) for w in (8, 9, 10) for o in ("sgd", "adam"))


def test_a_rebuilt_study_does_not_repeat_itself() -> None:
    """Each ask rebuilds the study from the record: the seed moves with the trials made."""
    record = _record(ranges={"lr": ContinuousParameter(0.001, 1.0, "Logarithmic")}, max_jobs=8)
    for number in range(8):
        params = suggest(record, {})
        assert 0.001 <= params["lr"] <= 1.0 and params["width"] in (8, 9, 10)
        record.trials.append(Trial(number=number, job="j", params=params, state="Running"))
    assert len({t.params["lr"] for t in record.trials}) == 8
    again = _record(ranges={"lr": ContinuousParameter(0.001, 1.0, "Logarithmic")}, max_jobs=8)
    assert suggest(again, {}) == record.trials[0].params  # the same seed: the same start


def test_the_median_rule_prunes_a_trial_below_the_others() -> None:
    record = _record(early_stopping_type="Auto", max_jobs=6)
    curves = {n: {s: 0.1 * s for s in range(1, 11)} for n in range(3)}
    for n in range(3):
        record.trials.append(
            Trial(number=n, job=f"j{n}", params={"width": 8, "optimizer": "sgd"},
                  state="Completed", objective=1.0)
        )  # fmt: skip
    good = Trial(number=3, job="j3", params={"width": 9, "optimizer": "sgd"}, state="Running")
    poor = Trial(number=4, job="j4", params={"width": 10, "optimizer": "sgd"}, state="Running")
    record.trials += [good, poor]
    curves[3] = {s: 0.12 * s for s in range(1, 5)}
    curves[4] = {s: 0.02 * s for s in range(1, 5)}
    assert prune_reason(record, good, curves) is None
    why = prune_reason(record, poor, curves)
    assert why == (
        "pruned at report 4 of accuracy: 0.08 below the median of earlier trials at that report"
    )
    off = _record(max_jobs=6)  # early_stopping_type Off: nothing is pruned
    off.trials = record.trials
    assert prune_reason(off, poor, curves) is None


def test_hyperband_prunes_from_a_rebuilt_study() -> None:
    """Hyperband's brackets work on a study rebuilt from the record each time: the rungs
    each trial reached, noted as it ran, are kept in the record."""
    record = _record("Hyperband", max_jobs=40)
    # Hyperband sizes its brackets from a completed trial's reports (max_resource "auto")
    record.trials.append(
        Trial(number=0, job="j0", params={"width": 8, "optimizer": "sgd"},
              state="Completed", objective=0.9)
    )  # fmt: skip
    curves: dict[int, dict[int, float]] = {0: {s: 0.09 * s for s in range(1, 11)}}
    for n in range(1, 30):  # trials that ran and were watched report by report, then ended
        trial = Trial(number=n, job=f"j{n}", params={"width": 8, "optimizer": "sgd"},
                      state="Running")  # fmt: skip
        record.trials.append(trial)
        for reports in range(1, 11):
            curves[n] = {s: 0.09 * s for s in range(1, reports + 1)}
            assert prune_reason(record, trial, curves) is None
        trial.state, trial.objective = "Completed", 0.9
    assert any(k.startswith("completed_rung") for k in record.trials[1].search_attrs)
    poor = Trial(number=30, job="j30", params={"width": 9, "optimizer": "adam"}, state="Running")
    record.trials.append(poor)
    verdicts = []
    for reports in range(1, 10):
        curves[30] = {s: 0.001 * s for s in range(1, reports + 1)}
        verdicts.append(prune_reason(record, poor, curves))
    why = next(v for v in verdicts if v is not None)
    assert why.startswith("pruned at report ") and "Hyperband" in why


def test_the_dashboard_view_is_json_without_the_job_spec(tmp_path) -> None:
    """A diverged trial (NaN) and a trial whose job is not made yet still make a view that
    JSON carries (the dashboard's API), and the trials' spec, which may hold a secret in its
    environment, is not in it."""
    import json

    from trainctl.store import open_store
    from trainctl.tuning import tuning_view

    tuner = _tuner(estimator=_estimator(environment={"WANDB_API_KEY": "hush-0123456789"}))
    record = TuningRecord(spec=tuner._template.model_copy(update={"name": "t"}))
    record.trials += [
        Trial(number=0, job="t-000", params={"lr": 0.1}, state="Completed", objective=0.9),
        Trial(number=1, job="t-001", params={"lr": 0.9}, state="Failed", objective=float("nan")),
        Trial(number=2, job="t-002", params={"lr": 0.5}, state="Running", started_at=1.0),
    ]
    view = tuning_view(record, open_store(str(tmp_path / "store")))
    text = json.dumps(view, allow_nan=False)
    assert "hush" not in text and "WANDB" not in text
    assert view["best_trial"] == 0 and view["best"] == {"job": "t-000", "objective": 0.9}
    assert [t["objective"] for t in view["trials"]] == [0.9, None, None]
    assert all(t["curve"] == [] for t in view["trials"])
