"""Spot replays (trainctl.replay): the real controller against a trace's market, on a
simulated clock, with stand-in nodes that train by a throughput model. Each job here is
hours of simulated time and about a second of wall time; what is asserted is what the
controller did and recorded (attempts, causes, steps lost, cost rows), never a duration of
the wall clock."""

from __future__ import annotations

import threading

import pytest

from trainctl.replay.strategies import Strategy, replay
from trainctl.replay.training import Workload
from trainctl.spec.trace import parse_trace

HOUR = 3600.0


def workload(nodes: int = 8, hours: float = 1.0) -> Workload:
    return Workload(
        name=f"test-{nodes}",
        nodes=nodes,
        on_demand_hours=hours,
        compute_seconds=0.5,
        allreduce_seconds=0.1,
        samples_per_node_step=32,
        save_seconds=5.0,
        restore_seconds=20.0,
        bootstrap_seconds=60.0,
        boot_seconds=120.0,
    )


def trace(*rows: tuple[float, float, int], pool: int = 8) -> object:
    """One zone's capacity over time: (start, end, available) rows, then full for a week."""
    capacity = [{"zone": "z1", "start_s": a, "end_s": b, "available": n} for a, b, n in rows]
    end = rows[-1][1]
    capacity.append({"zone": "z1", "start_s": end, "end_s": end + 7 * 86400, "available": pool})
    return parse_trace(
        {
            "name": "made-for-the-test",
            "source": "tests/e2e/test_spot_replay.py",
            "instance_type": "p3.2xlarge",
            "pool_size": pool,
            "prices": {"spot_usd_per_hour": 1.0, "on_demand_usd_per_hour": 3.0, "source": "t"},
            "capacity": capacity,
        }
    )


SPOT = Strategy("spot", "spot", {"use_spot_instances": True, "max_run": 86400})


@pytest.fixture(autouse=True)
def no_thread_left(home):
    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread


@pytest.mark.timeout(120)
def test_a_notice_before_a_reclaim_loses_no_step():
    """Capacity falls 30 minutes into the job: the 2-minute notice comes first, the nodes
    checkpoint and stop, the job waits out the hour without capacity and resumes from the
    checkpoint on new nodes; billed at the spot price for the time it held nodes."""
    market = trace((0, 1800, 8), (1800, 5400, 0))
    out = replay(market, workload(), SPOT, interval_seconds=900, start_s=0)
    assert out["state"] == "Completed", out
    assert out["sizes"] == [8, 8] and out["relaunches"] == 1
    assert "interruption notice" in out["causes"][0]
    assert out["redone_node_hours"] == 0  # the emergency checkpoint kept every step
    assert out["on_demand_node_hours"] == 0
    assert out["cost_usd"] == pytest.approx(out["spot_node_hours"] * 1.0)
    # an hour of training, an hour without capacity (less the first 30 minutes), restarts
    assert 1.9 < out["hours"] < 2.3, out


@pytest.mark.timeout(120)
def test_a_reclaim_without_notice_loses_the_steps_since_the_checkpoint():
    market = trace((0, 1800, 8), (1800, 2400, 0))
    out = replay(market, workload(), SPOT, interval_seconds=1000, start_s=0, notice_seconds=0)
    assert out["state"] == "Completed", out
    assert out["relaunches"] == 1
    assert out["causes"][0].startswith("algo-") and "spot capacity reclaimed" in out["causes"][0]
    # checkpointed ~1000 s into training (after a 180 s start-up), reclaimed at 1800 s: the
    # ~620 s between are trained again, on 8 nodes
    assert 8 * 500 / HOUR < out["redone_node_hours"] < 8 * 700 / HOUR, out


@pytest.mark.timeout(120)
def test_a_wait_for_capacity_is_not_counted_as_training_against_max_run():
    """An attempt trains 40 minutes, then capacity is gone for 50: max_run (80 minutes of
    training) is not reached by the wait (the controller once counted the attempt twice)."""
    market = trace((0, 2700, 8), (2700, 5700, 0))
    job = workload(hours=1.0)
    strategy = Strategy("spot", "spot", {"use_spot_instances": True, "max_run": 4800})
    out = replay(market, job, strategy, interval_seconds=600, start_s=0)
    assert out["state"] == "Completed", out
    assert out["stop_reason"] is None


@pytest.mark.timeout(120)
def test_on_demand_fallback_waits_for_spot_while_the_deadline_allows():
    """A spot job with on_demand_fallback and max_wait: a short outage is waited out on
    spot; a long one only until the deadline needs the time, then on-demand nodes finish
    the job before max_wait."""
    deadline = Strategy(
        "fallback",
        "fallback",
        {
            "use_spot_instances": True,
            "on_demand_fallback": True,
            "max_run": int(1.1 * HOUR),
            "max_wait": int(1.6 * HOUR),
        },
    )
    short = replay(trace((0, 600, 8), (600, 1200, 0)), workload(), deadline, interval_seconds=900)
    assert short["state"] == "Completed", short
    assert short["on_demand_node_hours"] == 0  # 10 minutes without spot: waited out
    long = replay(trace((0, 600, 8), (600, 30000, 0)), workload(), deadline, interval_seconds=900)
    assert long["state"] == "Completed", long
    assert long["spot_node_hours"] > 0 and long["on_demand_node_hours"] > 0
    assert long["hours"] < 1.6, long  # within max_wait
    assert long["on_demand_node_hours"] > long["spot_node_hours"], long


@pytest.mark.timeout(120)
def test_a_job_that_fell_back_to_on_demand_goes_back_to_spot_when_it_returns():
    """Spot is gone from 10 minutes to 70 into a 3-hour job with on_demand_fallback and no
    deadline: it falls back at once, tries spot after 30 minutes on demand (none yet: on
    demand again), doubles the wait, then finds spot and finishes there. Without the tries
    (spot_probe_seconds=0) it stays on demand to the end, at a higher cost. Where the market
    can be asked (EC2's placement scores), it tries once, when spot is back."""
    fallback = Strategy(
        "fallback",
        "fallback",
        {"use_spot_instances": True, "on_demand_fallback": True, "max_run": 86400},
    )
    market = trace((0, 600, 8), (600, 4200, 0))
    job = workload(hours=3.0)
    blind = {"outlook_error": None}  # a market that cannot be asked: EC2 without scores
    back = replay(
        market, job, fallback, interval_seconds=900, **blind,
        settings={"TRAINCTL_SPOT_PROBE_SECONDS": "1800"},
    )  # fmt: skip
    assert back["state"] == "Completed", back
    tries = [c for c in back["causes"] if c and c.startswith("trying spot again")]
    assert len(tries) == 2, back["causes"]  # one that found none, one that found spot
    assert back["relaunches"] == 3, back["causes"]  # the reclaim and the two tries
    stays = replay(
        market, job, fallback, interval_seconds=900, **blind,
        settings={"TRAINCTL_SPOT_PROBE_SECONDS": "0"},
    )  # fmt: skip
    assert stays["state"] == "Completed", stays
    assert stays["relaunches"] == 1 and stays["spot_node_hours"] < 8 * 0.2, stays
    assert back["spot_node_hours"] > 8 * 1.0, back  # most of the training back on spot
    assert back["redone_node_hours"] == 0  # each try relaunched from its notice checkpoint
    assert back["cost_usd"] < 0.75 * stays["cost_usd"], (back, stays)
    assert back["hours"] < stays["hours"] + 0.5, (back, stays)  # at the price of restarts
    # A job that saves neither on its own schedule nor at a notice (reclaimed without one)
    # would start over: it does not try. (One that saves at a notice tries without having
    # saved yet: its relaunch loses nothing.)
    unsaved = replay(
        market, job, fallback, interval_seconds=10 * HOUR, notice_seconds=0, **blind,
        settings={"TRAINCTL_SPOT_PROBE_SECONDS": "1800"},
    )  # fmt: skip
    assert unsaved["state"] == "Completed" and unsaved["relaunches"] == 1, unsaved["causes"]
    at_notice = replay(
        market, job, fallback, interval_seconds=10 * HOUR, **blind,
        settings={"TRAINCTL_SPOT_PROBE_SECONDS": "1800"},
    )  # fmt: skip
    assert at_notice["relaunches"] == 3 and at_notice["redone_node_hours"] == 0, at_notice
    # Asked first (answers always right here): no try while spot is out, one once it is back
    # (within ASK_SECONDS of its return), and the rest of the job on spot.
    asked = replay(
        market, job, fallback, interval_seconds=900, outlook_error=0.0,
        settings={"TRAINCTL_SPOT_PROBE_SECONDS": "1800"},
    )  # fmt: skip
    tries = [c for c in asked["causes"] if c and c.startswith("trying spot again")]
    assert len(tries) == 1 and asked["relaunches"] == 2, asked["causes"]
    assert asked["cost_usd"] < back["cost_usd"], (asked, back)
