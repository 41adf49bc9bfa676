"""Goodput (trainctl.record.goodput): an attempt's node-time split by cause, worked by hand
from the times and reports its record holds; jobs and tuning runs summed; odd reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.controller.attempts import count_held
from trainctl.record.costs import InstanceCost
from trainctl.record.goodput import (
    PAID,
    attempt_seconds,
    goodput,
    goodput_text,
    of_jobs,
    rounded,
)
from trainctl.record.models import Attempt, AttemptNode, JobRecord, NodeRestored, Restored
from trainctl.spec.job import JobSpec

T0 = "2026-12-06T10:00:00.000Z"
SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "tunable"


def at(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"2026-12-06T10:{int(minutes):02d}:{rest:06.3f}Z"


def attempt(number: int = 1, nodes: int = 2, **fields) -> Attempt:
    base = {
        "number": number,
        "nodes": [AttemptNode(rank=r, host=f"h{r}", address="127.0.0.1") for r in range(nodes)],
    }
    return Attempt(**{**base, **fields})


def trained(**fields) -> Attempt:
    """Asked at 0; waited 20 s for capacity; nodes at 30 (10 s provisioning); 4 s restoring
    inside 12 s of setup to the launch at 42; first step at 50; last step at 250 (200 steps,
    20 of them redone later); ended at 260."""
    restored = Restored()
    restored.add(NodeRestored(rank=0, seconds=4.0))
    restored.add(NodeRestored(rank=1, seconds=3.0))
    values = {
        "requested_at": T0,
        "waited_seconds": 20.0,
        "started_at": at(30),
        "ended_at": at(260),
        "startup": {"capacity": 30.0, "launch": 8.0, "to_first_step": 50.0},
        "restored": restored,
        "resumed_from_step": 100,
        "last_step": 300,
        "last_step_at": at(250),
        "steps_lost": 20,
        "checkpoint_stall_seconds": 6.0,
        "data_wait_seconds": 14.0,
    }
    return attempt(**{**values, **fields})


def record(*attempts: Attempt, instances: list[InstanceCost] | None = None) -> JobRecord:
    spec = JobSpec(entry_point="train.py", source_dir=str(SOURCE), instance_count=2)
    return JobRecord(
        name="job",
        spec=spec,
        store_uri="file:///s",
        source_uri="file:///s/src.tar.gz",
        source_sha256="0" * 64,
        owner="me",
        trainctl_version="0",
        created_at=T0,
        updated_at=T0,
        attempts=list(attempts),
        instances=instances or [],
    )


def test_an_attempt_that_trained_is_split_by_cause():
    seconds = attempt_seconds(trained(), now=0.0)
    # training span 200 s: 6 s of saves, 14 s waiting for data, 20 of its 200 steps redone
    # at its pace (1 step/s over what is left of it: 10 % of the span, capped by the rest)
    assert seconds == pytest.approx(
        {
            "waiting": 20.0,
            "provisioning": 10.0,
            "restore": 4.0,
            "setup": 8.0,
            "startup": 8.0,
            "checkpoint": 6.0,
            "data": 14.0,
            "redone": 20.0,
            "after": 10.0,
            "training": 160.0,
        }
    )
    assert sum(seconds[c] for c in PAID) == pytest.approx(240.0)  # from the ask that got them


def test_the_job_sums_its_attempts_in_node_hours_and_money():
    first = trained()
    second = attempt(
        2,
        nodes=1,
        requested_at=at(262),
        waited_seconds=0.0,
        started_at=at(270),
        ended_at=at(400),
        startup={"capacity": 8.0, "launch": 5.0, "to_first_step": 20.0},
        last_step=420,
        last_step_at=at(390),
    )
    priced = [
        InstanceCost(attempt=1, rank=r, instance_id=f"i-{r}", instance_type="p3.2xlarge",
                     market="spot", seconds=230.0, usd_per_hour=0.9) for r in (0, 1)
    ] + [InstanceCost(attempt=2, rank=0, instance_id="i-2", instance_type="p3.2xlarge",
                      market="on-demand", seconds=130.0, usd_per_hour=3.06)]  # fmt: skip
    value = goodput(record(first, second, instances=priced))
    assert value is not None
    assert [a.nodes for a in value.attempts] == [2, 1]
    paid_seconds = 2 * 240.0 + 1 * (400 - 262)
    assert value.paid_node_hours == pytest.approx(paid_seconds / 3600)
    # attempt 2: 8 s provisioning, 7 s setup, 5 s start-up, 108 s training, 10 s after
    training = 2 * 160.0 + 108.0
    assert value.causes["training"].node_hours == pytest.approx(training / 3600)
    assert value.goodput == pytest.approx(training / paid_seconds)
    assert value.causes["waiting"].node_hours == pytest.approx(40 / 3600)
    assert value.causes["waiting"].usd is None  # waiting is not paid for
    # at each attempt's billed price a node-hour (its instances' average)
    assert value.usd == pytest.approx(2 * 240 / 3600 * 0.9 + 138 / 3600 * 3.06)
    text = goodput_text(rounded(value))
    assert text.startswith(f"{100 * training / paid_seconds:.0f} % of 0.172 node-h paid, $0.24")
    assert "steps redone after a loss 6 %" in text  # 2 nodes x 20 s of 618
    assert text.endswith("; 0.0111 node-h waiting for capacity (unpaid)")


def test_an_attempt_that_never_stepped_spent_everything_getting_there():
    restored = Restored()
    restored.add(NodeRestored(rank=0, seconds=2.5))
    never = attempt(requested_at=T0, waited_seconds=0.0, started_at=at(5), ended_at=at(17),
                    restored=restored)  # fmt: skip
    seconds = attempt_seconds(never, now=0.0)
    assert seconds["provisioning"] == pytest.approx(5.0)
    assert (seconds["restore"], seconds["setup"]) == pytest.approx((2.5, 9.5))
    assert seconds["training"] == 0.0 and seconds["startup"] == 0.0


def test_a_record_from_before_the_fields_and_a_running_attempt():
    """No requested_at: the capacity stage says when capacity was asked for; no end: now."""
    old = attempt(started_at=at(30), startup={"capacity": 12.0, "launch": 3.0,
                  "to_first_step": 20.0}, last_step=50)  # fmt: skip
    from trainctl.record.keys import parse_iso

    seconds = attempt_seconds(old, now=parse_iso(at(100)))
    assert seconds["provisioning"] == pytest.approx(12.0) and seconds["waiting"] == 0.0
    assert seconds["startup"] == pytest.approx(3.0) and seconds["setup"] == pytest.approx(5.0)
    # no step time known: training is the span from the first step, none of it after
    assert seconds["training"] == 0.0 and seconds["after"] == pytest.approx(62.0)


def test_odd_reports_never_overflow_the_span():
    seconds = attempt_seconds(
        trained(steps_lost=10_000, checkpoint_stall_seconds=1e6, last_step_at=at(5)), now=0.0
    )
    assert min(seconds.values()) >= 0
    assert sum(seconds[c] for c in PAID) == pytest.approx(240.0)
    a = trained()
    for bad in (-1, float("nan"), float("inf"), True, "3", None):
        count_held(a, "checkpoint_stall", bad)
        count_held(a, "data_wait", bad)
    assert (a.checkpoint_stall_seconds, a.data_wait_seconds) == (6.0, 14.0)
    count_held(a, "checkpoint_stall", 1.5)  # each save's stall: added
    count_held(a, "data_wait", 9.0)  # a running total: the larger kept
    assert (a.checkpoint_stall_seconds, a.data_wait_seconds) == (7.5, 14.0)
    assert NodeRestored.from_message({"rank": 0, "seconds": "x"}).seconds == 0.0
    assert NodeRestored.from_message({"rank": 0, "seconds": 1.25}).seconds == 1.25


def test_a_tuning_run_sums_its_trials():
    one, two = record(trained()), record(trained())
    two.name = "job-2"
    data = of_jobs([one, two, record()])  # a trial without attempts adds nothing
    assert data is not None
    assert [j["job"] for j in data["jobs"]] == ["job", "job-2"]
    assert data["paid_node_hours"] == pytest.approx(2 * 480 / 3600, abs=1e-6)
    assert data["goodput"] == pytest.approx(160 / 240, abs=1e-4)
    assert of_jobs([record()]) is None
