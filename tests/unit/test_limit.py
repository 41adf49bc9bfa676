"""The limit (trainctl.replay.limit): the cheapest schedule any policy could follow, seeing
the trace ahead, checked on traces small enough to work out by hand."""

from __future__ import annotations

import pytest

from trainctl.replay.limit import cheapest
from trainctl.replay.training import Workload
from trainctl.spec.trace import parse_trace

SPOT, ON_DEMAND = 1.0, 3.0  # $ an hour an instance
HOUR = 3600.0


def _trace(rows: list[tuple[str, float, float, int]]) -> object:
    return parse_trace(
        {
            "name": "hand",
            "source": "made here",
            "instance_type": "p3.2xlarge",
            "pool_size": 1,
            "prices": {
                "spot_usd_per_hour": SPOT,
                "on_demand_usd_per_hour": ON_DEMAND,
                "source": "s",
            },
            "capacity": [
                {"zone": z, "start_s": a, "end_s": b, "available": n} for z, a, b, n in rows
            ],
        }
    )


def _job(hours: float = 1.0, nodes: int = 2, boot: float = 120.0) -> Workload:
    """`hours` of training on `nodes`; a start costs boot (120 s) + rendezvous (60 s), a
    restart that and a restore (20 s) and the save at leaving (0 here: no stalls)."""
    return Workload(
        name="hand",
        nodes=nodes,
        on_demand_hours=hours,
        compute_seconds=1.0,
        allreduce_seconds=0.0,
        samples_per_node_step=1,
        save_seconds=0.0,
        restore_seconds=20.0,
        bootstrap_seconds=60.0,
        boot_seconds=boot,
    )


def test_with_spot_all_along_the_limit_is_one_start_on_spot() -> None:
    trace = _trace([("a", 0, 10 * HOUR, 1)])
    limit = cheapest(trace, _job(), 0, start_s=0, deadline_s=2 * HOUR)
    assert limit is not None and limit.starts == 1 and limit.on_demand_node_hours == 0
    billed = HOUR + 180  # the work, and the start (boot and rendezvous)
    assert limit.hours == pytest.approx(billed / HOUR)
    assert limit.cost_usd == pytest.approx(2 * SPOT * billed / HOUR)


def test_without_spot_the_limit_is_on_demand() -> None:
    trace = _trace([("a", 0, 10 * HOUR, 0)])
    limit = cheapest(trace, _job(), 0, start_s=0, deadline_s=2 * HOUR)
    assert limit is not None and limit.spot_node_hours == 0
    assert limit.cost_usd == pytest.approx(2 * ON_DEMAND * (HOUR + 180) / HOUR)


def test_with_slack_the_limit_waits_for_spot() -> None:
    # Spot from 30 minutes on; the deadline leaves room to wait for it.
    trace = _trace([("a", 0, 1800, 0), ("a", 1800, 10 * HOUR, 1)])
    limit = cheapest(trace, _job(), 0, start_s=0, deadline_s=2 * HOUR)
    assert limit is not None and limit.on_demand_node_hours == 0 and limit.starts == 1
    assert limit.hours == pytest.approx((1800 + HOUR + 180) / HOUR)
    assert limit.cost_usd == pytest.approx(2 * SPOT * (HOUR + 180) / HOUR)


def test_a_tight_deadline_pays_on_demand_only_for_what_it_must() -> None:
    # Spot only from 30 minutes on, and 40 minutes of slack: waiting all 30 minutes would
    # leave 10 of them for the 180 s start, which fits; with 20 minutes of slack it must
    # train on demand first, and takes spot as it comes (one restart: boot, rendezvous,
    # restore).
    trace = _trace([("a", 0, 1800, 0), ("a", 1800, 10 * HOUR, 1)])
    roomy = cheapest(trace, _job(), 0, start_s=0, deadline_s=HOUR + 2400)
    assert roomy is not None and roomy.on_demand_node_hours == 0
    tight = cheapest(trace, _job(), 0, start_s=0, deadline_s=HOUR + 1200)
    assert tight is not None and tight.on_demand_node_hours > 0 and tight.starts == 2
    assert tight.hours <= (HOUR + 1200) / HOUR
    on_demand_only = 2 * ON_DEMAND * (HOUR + 180) / HOUR
    assert roomy.cost_usd < tight.cost_usd < on_demand_only


def test_the_limit_takes_the_zone_that_holds_and_leaves_before_a_drop() -> None:
    # Zone a drops after 30 minutes for good; zone b has room all along, from 10 minutes on.
    trace = _trace([
        ("a", 0, 1800, 1), ("a", 1800, 10 * HOUR, 0),
        ("b", 0, 600, 0), ("b", 600, 10 * HOUR, 1),
    ])  # fmt: skip
    limit = cheapest(trace, _job(), 0, start_s=0, deadline_s=3 * HOUR)
    assert limit is not None and limit.on_demand_node_hours == 0
    assert limit.starts == 1  # one start in b beats a start in a and a restart in b
    assert limit.cost_usd == pytest.approx(2 * SPOT * (HOUR + 180) / HOUR)


def test_a_deadline_shorter_than_the_work_has_no_limit() -> None:
    trace = _trace([("a", 0, 10 * HOUR, 1)])
    assert cheapest(trace, _job(), 0, start_s=0, deadline_s=HOUR) is None


def test_the_job_needs_the_whole_pool_and_the_start_moves_the_window() -> None:
    # 8 nodes on a 4-instance pool: 2 nodes an instance, so 3 of 4 is too few.
    trace = parse_trace(
        {
            "name": "pool",
            "source": "s",
            "instance_type": "p3.2xlarge",
            "pool_size": 4,
            "prices": {
                "spot_usd_per_hour": SPOT,
                "on_demand_usd_per_hour": ON_DEMAND,
                "source": "s",
            },
            "capacity": [
                {"zone": "a", "start_s": 0, "end_s": 5 * HOUR, "available": 3},
                {"zone": "a", "start_s": 5 * HOUR, "end_s": 20 * HOUR, "available": 4},
            ],
        }
    )
    job = _job(nodes=8)
    early = cheapest(trace, job, 0, start_s=0, deadline_s=2 * HOUR)
    late = cheapest(trace, job, 0, start_s=5 * HOUR, deadline_s=2 * HOUR)
    assert early is not None and early.spot_node_hours == 0
    assert late is not None and late.on_demand_node_hours == 0
