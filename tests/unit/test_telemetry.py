"""The controller's periodic progress save (controller.telemetry) in a store outage: it
fails in a second instead of holding the watch loop, says so once, keeps the metric points
it could not write, and says when the store takes them again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainctl.controller.telemetry import Telemetry
from trainctl.errors import StoreError
from trainctl.record import Attempt

T0 = "2026-12-01T00:00:00.000Z"  # (a record checks its times)

pytestmark = pytest.mark.timeout(30)


class OutageJobs:
    """A JobStore whose writes fail while `down`; it records what was written, and how."""

    def __init__(self) -> None:
        self.down = False
        self.records: list[int] = []  # the last step of each record saved
        self.points: list[dict] = []
        self.prompt: list[bool] = []

    def _write(self, prompt: bool) -> None:
        self.prompt.append(prompt)
        if self.down:
            raise StoreError("503 SlowDown")

    def save(self, record, *, prompt: bool = False) -> None:
        self._write(prompt)
        self.records.append(record.attempts[-1].last_step)

    def save_metric_points(self, points, *, prompt: bool = False) -> None:
        if points:
            self._write(prompt)
            self.points += points


def test_a_progress_save_in_an_outage_fails_fast_keeps_its_points_and_says_it_once():
    jobs = OutageJobs()
    spec = SimpleNamespace(metric_definitions=[])
    record = SimpleNamespace(
        spec=spec,
        metrics={},
        attempts=[Attempt(number=1, started_at=T0, last_step=1)],
        total_steps_reported=None,
    )
    said: list[str] = []
    telemetry = Telemetry(jobs, record, said.append)  # type: ignore[arg-type]
    telemetry.metric("loss", 0.5, 0, step=1)
    telemetry.save_progress()
    assert jobs.records == [1] and len(jobs.points) == 1

    jobs.down = True
    for step in (2, 3, 4):
        record.attempts[-1].last_step = step
        telemetry.metric("loss", 0.1 * step, 0, step=step)
        telemetry.save_progress()
    assert jobs.records == [1] and len(jobs.points) == 1
    assert len([s for s in said if s.startswith("could not save")]) == 1, said
    assert set(jobs.prompt) == {True}  # never held in the store's long backoff

    jobs.down = False
    telemetry.save_progress()
    assert jobs.records == [1, 4]
    assert [p["step"] for p in jobs.points] == [1, 2, 3, 4]  # none lost, in order
    assert said[-1] == "the job's progress is saved again"
    record.attempts[-1].last_step = 5
    telemetry.save_progress(prompt=False)  # a hand-off's last save waits for the store
    assert jobs.records == [1, 4, 5] and jobs.prompt[-1] is False
