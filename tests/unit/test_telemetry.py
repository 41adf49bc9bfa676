"""The controller's periodic progress save (controller.telemetry) in a store outage: it
fails in a second instead of holding the watch loop, says so once, keeps the metric points
it could not write, and says when the store takes them again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainctl.controller.telemetry import Telemetry
from trainctl.errors import StoreError
from trainctl.record.models import Attempt

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


def test_the_progress_is_compared_only_after_a_line_or_a_value_since_the_last_look():
    """Progress moves with the nodes' lines: without one, no JSON of the attempt is made to
    see whether it moved (a fifth of a spot replay's CPU); a hand-off's save looks anyway."""
    jobs = OutageJobs()
    record = SimpleNamespace(
        spec=SimpleNamespace(metric_definitions=[]),
        metrics={},
        attempts=[Attempt(number=1, started_at=T0, last_step=1)],
        total_steps_reported=None,
    )
    telemetry = Telemetry(jobs, record, lambda text: None)  # type: ignore[arg-type]
    telemetry.save_progress()
    assert jobs.records == [1]
    record.attempts[-1].last_step = 2  # (moved by no line: not looked at)
    telemetry.save_progress()
    assert jobs.records == [1]
    telemetry.changes += 1  # a line heard (the watch counts them)
    telemetry.save_progress()
    assert jobs.records == [1, 2]
    telemetry.progress_message(record.attempts[-1], 0, {"event": "step", "step": 3})
    telemetry.save_progress()
    assert jobs.records == [1, 2, 3]
    record.attempts[-1].last_step = 4
    telemetry.save_progress(prompt=False)
    assert jobs.records == [1, 2, 3, 4]


def test_a_total_that_shrinks_or_falls_below_the_step_reached_is_said_once_and_not_believed():
    """A script that counts a resumed epoch's rest as an epoch reports a smaller total after
    a relaunch (status said `114/60 steps (100%)`): the larger total stays the job's work, for
    status and the deadline policy alike, and each oddity is said once."""

    class Jobs(OutageJobs):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[str, dict]] = []

        def event(self, kind: str, **fields) -> None:
            self.events.append((kind, fields))

    jobs = Jobs()
    first = Attempt(number=1, started_at=T0, last_step=40)
    record = SimpleNamespace(
        spec=SimpleNamespace(metric_definitions=[]), metrics={}, attempts=[first],
        total_steps_reported=None, warnings=[],
    )  # fmt: skip
    said: list[str] = []
    telemetry = Telemetry(jobs, record, said.append)  # type: ignore[arg-type]
    step = {"event": "step", "step": 10, "total_steps": 120}
    assert telemetry.progress_message(first, 0, step)
    assert record.total_steps_reported == 120 and said == []
    second = Attempt(number=2, started_at=T0)
    record.attempts.append(second)
    for n in (41, 42, 43):  # the resumed epoch's rest counted as the whole: 60
        telemetry.progress_message(second, 0, {"event": "step", "step": n, "total_steps": 60})
    assert record.total_steps_reported == 120
    assert [kind for kind, _ in jobs.events] == ["total_changed"]
    assert jobs.events[0][1] == {"reported": 60, "kept": 120, "reached": 41}
    assert len(said) == 1 and "went from 120 to 60 steps; 120 is kept" in said[0]
    telemetry.progress_message(second, 0, {"event": "step", "step": 130, "total_steps": 125})
    assert record.total_steps_reported == 125  # larger: believed
    assert len(said) == 2 and "total of 125 steps is below step 130" in said[1]
    telemetry.progress_message(second, 0, {"event": "step", "step": 131, "total_steps": 126})
    assert len(said) == 2, "each oddity is said once"
    assert record.warnings == [s.removeprefix("warning: ") for s in said]  # for `status`
