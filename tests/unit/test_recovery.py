"""The recovery strategies (trainctl.controller.recovery): each replayed strategy is the class
the controller selects for the same job fields, so a strategy is defined once; and each
class's decisions, one rule at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainctl.clock import VirtualClock, clock, use_clock
from trainctl.cluster import ClusterInfo, NodeInfo
from trainctl.controller.deadline import Pace
from trainctl.controller.recovery import (
    ASK_SECONDS,
    ASKED_PROBE_SECONDS,
    FAMILY,
    STARTUP_ALLOWANCE_SECONDS,
    AsAsked,
    FallBackAtDeadline,
    FallBackNow,
    RecoveryContext,
    UniformProgress,
    for_job,
    replayed,
    spot_has_room,
)
from trainctl.provisioning.base import CapacityProbe, SpotOutlook
from trainctl.record.models import JobRecord
from trainctl.replay.strategies import strategies
from trainctl.spec.job import JobSpec
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import Settings


def _record(tmp_path: Path, **fields: Any) -> JobRecord:
    (tmp_path / "train.py").write_text("pass\n")
    spec = JobSpec(
        entry_point="train.py", source_dir=str(tmp_path), instance_type="p3.2xlarge", **fields
    )
    return JobRecord(
        name="j", spec=spec, store_uri="file:///s", source_uri="file:///s",
        source_sha256="0" * 64, owner="u", trainctl_version="0",
        created_at="2026-12-03T00:00:00Z", updated_at="2026-12-03T00:00:00Z",
    )  # fmt: skip


class _Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, **fields: Any) -> None:
        self.said.append((kind, fields))


class _Outlook(SpotOutlook):
    """A provider that answers whether spot has room, one answer per question."""

    def __init__(self, answers: list[bool | None]) -> None:
        self.answers = answers
        self.asked: list[int] = []

    def spot_outlook(self, request: CapacityRequest, job: str) -> bool | None:
        self.asked.append(request.instance_count)
        return self.answers.pop(0)


def _ctx(
    record: JobRecord,
    *,
    slack: float | None = None,
    pace: Pace | None = None,
    provider: object | None = None,
    probe_seconds: float = 600,
):
    events, lines = _Events(), []
    ctx = RecoveryContext(
        # object(): no CapacityProbe or SpotOutlook, cannot be asked
        provider=provider or object(),  # type: ignore[arg-type]
        jobs=events,  # type: ignore[arg-type]
        record=record,
        settings=Settings(spot_probe_seconds=probe_seconds),
        info=lines.append,
        deadline_slack=lambda: slack,
        pace=lambda: pace,
    )
    return ctx, events, lines


def _cluster(market: str) -> ClusterInfo:
    nodes = [NodeInfo(rank=r, host=f"h{r}", address="127.0.0.1", root="/") for r in range(2)]
    return ClusterInfo(
        job="j", attempt=1, provider="aws", instance_type="p3.2xlarge", nodes=nodes,
        master_port=29500, processes_per_host=1, market=market,
    )  # fmt: skip


def test_every_replayed_strategy_is_the_class_its_fields_select(tmp_path: Path) -> None:
    rows = replayed(64, 6.0)
    assert [s.name for s in strategies(64, 6.0)] == [r.name for r in rows]
    assert len({r.name for r in rows}) == len(rows) == 7
    for row in rows:
        extra = {"total_steps": 10_000} if row.knows_work else {}
        chosen = type(for_job(_record(tmp_path, instance_count=64, **row.fields, **extra)))
        declared = [kind for kind in FAMILY if row in kind.replayed(64, 6.0)]
        assert declared == [chosen], (row.name, chosen, declared)


def test_fields_select_the_strategy(tmp_path: Path) -> None:
    spot = {"use_spot_instances": True, "on_demand_fallback": True}
    assert type(for_job(_record(tmp_path))) is AsAsked
    assert type(for_job(_record(tmp_path, use_spot_instances=True))) is AsAsked
    assert type(for_job(_record(tmp_path, **spot))) is FallBackNow
    deadline = _record(tmp_path, **spot, max_run=3600, max_wait=7200)
    assert type(for_job(deadline)) is FallBackAtDeadline
    deadline.total_steps_reported = 500  # the script said its work
    assert type(for_job(deadline)) is UniformProgress


def test_back_to_spot_waits_longer_after_each_try_that_found_none(tmp_path: Path) -> None:
    record = _record(tmp_path, use_spot_instances=True, on_demand_fallback=True)
    ctx, events, _ = _ctx(record)
    now = FallBackNow()
    on_demand = _cluster("on-demand")
    assert now.leave_for_spot(ctx, on_demand, 599, saved=True) is None
    assert now.leave_for_spot(ctx, on_demand, 600, saved=False) is None  # would start over
    assert now.leave_for_spot(ctx, _cluster("spot"), 9999, saved=True) is None
    assert now.leave_for_spot(ctx, on_demand, 600, saved=True) == (
        "trying spot again after 10 min on demand"
    )
    assert ctx.trying_spot
    request = CapacityRequest.of(record.spec)
    assert now.market(ctx, request) == request  # spot if it is back, else on-demand at once
    ctx.after_provision(on_demand, 2)  # none found
    assert (ctx.trying_spot, ctx.spot_misses) == (False, 1)
    assert events.said[-1] == ("spot_probe", {"attempt": 2, "found": False, "misses": 1})
    assert now.leave_for_spot(ctx, on_demand, 1199, saved=True) is None
    assert now.leave_for_spot(ctx, on_demand, 1200, saved=True) is not None
    ctx.after_provision(_cluster("spot"), 3)
    assert ctx.spot_misses == 0


def test_the_deadline_asks_for_spot_alone_while_its_slack_allows(tmp_path: Path) -> None:
    record = _record(
        tmp_path, use_spot_instances=True, on_demand_fallback=True, max_run=3600, max_wait=7200
    )
    request = CapacityRequest.of(record.spec)
    roomy, events, _ = _ctx(record, slack=STARTUP_ALLOWANCE_SECONDS + 1)
    assert FallBackAtDeadline().market(roomy, request) == request.spot_only()
    tight, events, _ = _ctx(record, slack=STARTUP_ALLOWANCE_SECONDS)
    assert FallBackAtDeadline().market(tight, request) == request
    FallBackAtDeadline().market(tight, request)
    assert [kind for kind, _ in events.said] == ["on_demand_fallback"]  # said once
    # a try back to spot only while the deadline can afford two start-ups
    short, _, _ = _ctx(record, slack=2 * STARTUP_ALLOWANCE_SECONDS - 1)
    assert FallBackAtDeadline().leave_for_spot(short, _cluster("on-demand"), 9999, True) is None


@pytest.mark.parametrize(
    ("done", "elapsed", "asked"),
    [
        (2000.0, 1000.0, "spot"),  # ahead of the line: wait for spot
        (400.0, 1000.0, "either"),  # behind: spot if there is some, else on-demand
        (500.0, 9000.0, "on-demand"),  # the safety net: on demand to the end
    ],
)
def test_uniform_progress_asks_by_where_the_job_stands(tmp_path, done, elapsed, asked) -> None:
    record = _record(
        tmp_path, use_spot_instances=True, on_demand_fallback=True, max_run=9000,
        max_wait=10000, total_steps=100,
    )  # fmt: skip
    pace = Pace(elapsed=elapsed, deadline=10000, work=5000, done=done, restart=300)
    ctx, events, _ = _ctx(record, pace=pace)
    request = CapacityRequest.of(record.spec)
    expected = {
        "spot": request.spot_only(),
        "either": request,
        "on-demand": request.on_demand_only(),
    }[asked]
    assert UniformProgress().market(ctx, request) == expected
    UniformProgress().market(ctx, request)
    assert [kind for kind, _ in events.said] == ["deadline_policy"]  # once per change


def test_a_provider_that_answers_is_asked_before_a_try_and_not_too_often(tmp_path: Path) -> None:
    record = _record(tmp_path, use_spot_instances=True, on_demand_fallback=True, instance_count=2)
    outlook = _Outlook([False, True])
    ctx, _, _ = _ctx(record, provider=outlook, probe_seconds=3600)
    on_demand = _cluster("on-demand")
    with use_clock(VirtualClock()):
        assert FallBackNow().leave_for_spot(ctx, on_demand, ASKED_PROBE_SECONDS - 1, True) is None
        assert outlook.asked == []  # not before a try could be made
        assert FallBackNow().leave_for_spot(ctx, on_demand, ASKED_PROBE_SECONDS, True) is None
        assert FallBackNow().leave_for_spot(ctx, on_demand, ASKED_PROBE_SECONDS + 60, True) is None
        assert outlook.asked == [2]  # "no room", kept for ASK_SECONDS
        clock().sleep(ASK_SECONDS)
        # asked again: room; the try need not wait out spot_probe_seconds (3600 s)
        why = FallBackNow().leave_for_spot(ctx, on_demand, 900, True)
        assert why == "trying spot again after 15 min on demand" and ctx.trying_spot
        assert outlook.asked == [2, 2]


def test_without_an_answer_a_try_waits_out_spot_probe_seconds(tmp_path: Path) -> None:
    record = _record(tmp_path, use_spot_instances=True, on_demand_fallback=True)
    outlook = _Outlook([None, None])
    ctx, _, _ = _ctx(record, provider=outlook, probe_seconds=3600)
    with use_clock(VirtualClock()):
        assert FallBackNow().leave_for_spot(ctx, _cluster("on-demand"), 900, True) is None
        clock().sleep(ASK_SECONDS)
        assert FallBackNow().leave_for_spot(ctx, _cluster("on-demand"), 3600, True) is not None


def test_uniform_progress_asked_tries_spot_behind_its_line_while_it_can_afford_it(
    tmp_path: Path,
) -> None:
    record = _record(
        tmp_path, use_spot_instances=True, on_demand_fallback=True, max_run=9000,
        max_wait=10000, total_steps=100,
    )  # fmt: skip
    behind = Pace(elapsed=3000, deadline=10000, work=5000, done=1000, restart=300)
    blind, _, _ = _ctx(record, pace=behind)
    assert UniformProgress().leave_for_spot(blind, _cluster("on-demand"), 3000, True) is None
    outlook = _Outlook([True])
    asked, _, _ = _ctx(record, pace=behind, provider=outlook)
    why = UniformProgress().leave_for_spot(asked, _cluster("on-demand"), 3000, True)
    assert why == (
        "trying spot again after 50 min on demand: 8 min behind the deadline's line; spot said "
        "to have room"
    )
    # one restart more would leave less than the safety net's two: not asked, no try
    tight = Pace(elapsed=3000, deadline=10000, work=8000, done=1000, restart=300)
    outlook = _Outlook([True])
    unaffordable, _, _ = _ctx(record, pace=tight, provider=outlook)
    assert UniformProgress().leave_for_spot(unaffordable, _cluster("on-demand"), 3000, True) is None
    assert outlook.asked == []


def test_a_count_is_the_answer_where_the_provider_can_count() -> None:
    class Counted(CapacityProbe, SpotOutlook):
        def __init__(self, count: int | None) -> None:
            self.count = count

        def available_nodes(self, request: CapacityRequest, job: str) -> int | None:
            return self.count

        def spot_outlook(self, request: CapacityRequest, job: str) -> bool | None:
            return True

    request = None  # not read by these providers
    assert spot_has_room(Counted(1), request, "j", 2) is False  # type: ignore[arg-type]
    assert spot_has_room(Counted(2), request, "j", 2) is True  # type: ignore[arg-type]
    assert spot_has_room(Counted(None), request, "j", 2) is True  # type: ignore[arg-type]
    assert spot_has_room(object(), request, "j", 2) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("last_step", "saved_at", "lost", "resumes"),
    [
        (400, 400, 0, True),  # saved at its last step
        (300, 412, 0, True),  # saved at a notice past its last report (every 100 steps)
        (400, 300, 0, False),  # its last save was behind it
        (400, 400, 12, False),  # steps were lost
        (None, None, 0, False),  # never stepped
    ],
)
def test_an_earlier_attempt_that_saved_where_it_stopped_lets_a_try_lose_nothing(
    last_step, saved_at, lost, resumes
) -> None:
    from trainctl.controller.budget import resumes_where_stopped
    from trainctl.record.models import Attempt

    earlier = Attempt(
        number=1, started_at="2026-12-06T00:00:00Z", last_step=last_step,
        last_checkpoint_step=saved_at, steps_lost=lost,
    )  # fmt: skip
    assert resumes_where_stopped([earlier]) is resumes


def test_an_elastic_spot_job_grows_when_asked_spot_has_room_not_by_blind_relaunches(
    tmp_path: Path,
) -> None:
    from trainctl.controller.capacity import CapacitySizer

    record = _record(tmp_path, use_spot_instances=True, instance_count=4, min_instance_count=2)
    settings = Settings(elastic_probe_seconds=900)

    def sizer(provider: object) -> CapacitySizer:
        return CapacitySizer(
            provider, _Events(), record, settings,  # type: ignore[arg-type]
            should_stop=lambda: None, info=lambda line: None,
        )  # fmt: skip

    with use_clock(VirtualClock()):
        asked = sizer(_Outlook([False, True]))
        assert asked.growth(2, ASKED_PROBE_SECONDS - 1) is None  # too soon to relaunch
        assert asked.growth(2, 5000) is None  # "no room": no relaunch, however long
        clock().sleep(ASK_SECONDS)
        assert asked.growth(2, 5000) == "growing: spot is said to have room for 4 node(s)"
        assert asked.recovery._asked is not None
        blind = sizer(object())  # cannot be asked: a relaunch every elastic_probe_seconds
        assert blind.growth(2, 899) is None
        assert blind.growth(2, 900) == "growing: trying for 4 node(s) again"


def test_a_replay_that_did_not_complete_says_how_it_got_there():
    """The estimate's `not_completed_attempts`: each attempt's start, size, steps and end."""
    from types import SimpleNamespace

    from trainctl.replay.strategies import story

    def attempt(number, at, steps, outcome, cause):
        return SimpleNamespace(
            number=number, started_at=f"2026-01-01T00:{at:02d}:00Z", nodes=[0] * 8,
            resumed_from_step=steps[0], last_step=steps[1], outcome=outcome, cause=cause,
        )  # fmt: skip

    record = SimpleNamespace(
        created_at="2026-01-01T00:00:00Z",
        state=SimpleNamespace(value="Stopped"),
        stop_reason="MaxWaitTimeExceeded: max_wait of 4140 s reached (2 attempt(s))",
        attempts=[
            attempt(1, 0, (None, 900), "interrupted", "spot reclaimed"),
            attempt(2, 31, (0, 400), None, None),
        ],
    )
    assert story(record) == (
        "MaxWaitTimeExceeded: max_wait of 4140 s reached (2 attempt(s)): "
        "attempt 1 at 0 s, 8 node(s), steps 0-900: interrupted (spot reclaimed); "
        "attempt 2 at 1860 s, 8 node(s), steps 0-400: running"
    )
