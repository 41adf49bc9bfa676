"""Uniform Progress's decisions (trainctl.controller.deadline), one rule at a time, on a job
of 6 hours' work with a deadline of 6.9 hours (1.15x) and a 10-minute restart cost."""

from __future__ import annotations

import pytest

from trainctl.controller.deadline import Pace, decide, leave_on_demand

HOUR = 3600.0
WORK, DEADLINE, RESTART = 6 * HOUR, 6.9 * HOUR, 600.0


def pace(elapsed_hours: float, done_hours: float) -> Pace:
    return Pace(elapsed_hours * HOUR, DEADLINE, WORK, done_hours * HOUR, RESTART)


def test_the_line_runs_from_nothing_at_the_start_to_all_at_the_deadline() -> None:
    p = pace(0, 0)
    assert p.expected(0) == 0 and p.expected(DEADLINE) == WORK
    assert p.expected(DEADLINE / 2) == WORK / 2
    assert p.expected(2 * DEADLINE) == WORK  # (past the deadline: all of it)


@pytest.mark.parametrize(
    ("elapsed", "done", "market"),
    [
        (0.0, 0.0, "spot"),  # at the start, on the line: wait for spot
        (1.0, 1.0, "spot"),  # ahead (the line is at 0.87 h): wait for spot
        (2.0, 1.6, "spot-or-on-demand"),  # behind (1.74 h): spot if there, else on demand
        (3.0, 2.5, "spot-or-on-demand"),  # behind (2.61 h), 3.9 h left for 3.5 h + 20 min
        (2.0, 1.0, "on-demand"),  # 4.9 h left for 5 h of work: on demand, to the end
        (5.0, 3.0, "on-demand"),  # 1.9 h left < 3 h of work + 2 restarts: the safety net
        (6.5, 5.8, "on-demand"),  # 0.4 h left < 0.2 h + 20 min: to the end on demand
    ],
)
def test_a_job_without_capacity_asks_by_where_it_stands(elapsed, done, market) -> None:
    assert decide(pace(elapsed, done)) == market


def test_on_demand_is_left_for_spot_only_ahead_of_the_line_two_restarts_on() -> None:
    # at 2 h the line is at 1.74 h, and 20 minutes on at 2.03 h
    assert not leave_on_demand(pace(2.0, 1.8))  # ahead now, not 2 restarts on
    assert leave_on_demand(pace(2.0, 2.1))
    # the safety net holds a job on demand whatever its lead
    assert not leave_on_demand(pace(6.2, 5.6))


def test_no_work_left_asks_for_nothing_it_cannot_finish() -> None:
    done = pace(3.0, 6.0)
    assert done.left == 0 and not done.behind and decide(done) == "spot"


def test_a_job_short_of_max_run_for_another_restart_stays_on_demand() -> None:
    # ahead of the line and far from the deadline, but max_run has 2.1 h for 2 h of work
    roomy = pace(3.0, 4.0)
    assert leave_on_demand(roomy) and decide(roomy) == "spot"
    tight = Pace(3 * HOUR, DEADLINE, WORK, 4 * HOUR, RESTART, run_left=2.1 * HOUR)
    assert tight.must_finish and not leave_on_demand(tight) and decide(tight) == "on-demand"
