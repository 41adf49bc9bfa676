"""`trainctl tensorboard`'s sources and mirror, without TensorBoard: which runs a job and a
tuning job give, and what a mirror pass copies (new files whole, grown ones appended in
place, never a key that leaves its run's folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.errors import NotFoundError
from trainctl.store import open_store

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _job(store, name: str, tuning: str | None = None):
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec

    spec = build_spec(entry_point="train.py", source_dir=str(FIXTURES / "tunable"), job_name=name)
    record = create_job(spec, store)
    if tuning is not None:
        from trainctl.record.jobstore import JobStore

        record.tuning_job = tuning
        JobStore(store, name).save(record)
    return record


@pytest.mark.timeout(30)
def test_a_job_and_a_tuning_jobs_trials_are_runs_side_by_side(home: Path) -> None:
    from trainctl.estimator import Estimator
    from trainctl.tensorboard import log_sources, mirror
    from trainctl.tuning import ContinuousParameter, HyperparameterTuner
    from trainctl.tuning.record import Trial, TuningRecord, TuningStore

    store = open_store((home / "store").as_uri())
    _job(store, "alone")
    for n in range(2):
        _job(store, f"tune-lr-00{n}", tuning="tune-lr")
    tuner = HyperparameterTuner(
        Estimator("train.py", source_dir=str(FIXTURES / "tunable")),
        objective_metric_name="accuracy",
        hyperparameter_ranges={"lr": ContinuousParameter(0.001, 1.0)},
        max_jobs=2,
    )
    record = TuningRecord(spec=tuner._template.model_copy(update={"name": "tune-lr"}))
    record.trials = [Trial(number=n, job=f"tune-lr-00{n}", params={"lr": 0.1}) for n in range(2)]
    TuningStore(store, "tune-lr").save(record)

    sources = log_sources(store, ["alone", "tune-lr", "alone"])
    assert [run for run, _ in sources] == ["alone", "tune-lr/tune-lr-000", "tune-lr/tune-lr-001"]
    assert sources[0][1].uri.endswith("/jobs/alone/tensorboard")
    with pytest.raises(NotFoundError, match="no job or tuning job named 'nope'"):
        log_sources(store, ["nope"])

    logs = sources[1][1]
    logs.put_bytes("events.out.tfevents.1", b"first ")
    logs.put_bytes("node-1/events.out.tfevents.2", b"other node")
    mirrored = home / "mirror"
    assert mirror(sources, mirrored) == 2
    local = mirrored / "tune-lr" / "tune-lr-000" / "events.out.tfevents.1"
    inode = local.stat().st_ino
    logs.put_bytes("events.out.tfevents.1", b"first second")  # the writer went on
    assert mirror(sources, mirrored) == 1 and mirror(sources, mirrored) == 0
    assert local.read_bytes() == b"first second"
    assert local.stat().st_ino == inode  # appended where TensorBoard holds it open
    assert (mirrored / "tune-lr" / "tune-lr-000" / "node-1" / "events.out.tfevents.2").exists()
