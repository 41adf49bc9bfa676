"""Which injected fault fires when (trainctl.controller.faults): time faults earliest
first, step faults once the script reports the step, and a fault for a node the attempt
lacks waits."""

from __future__ import annotations

from trainctl.controller.faults import FaultSchedule
from trainctl.spec.parts import Fault


def _schedule(*specs: str) -> FaultSchedule:
    return FaultSchedule([Fault.parse(s) for s in specs])


def test_time_faults_fire_one_at_a_time_earliest_first() -> None:
    schedule = _schedule("kill:1@6", "notice:0@5")
    assert schedule.take_due({0, 1}, elapsed=4.9, step=100) is None
    assert str(schedule.take_due({0, 1}, elapsed=7.0, step=None)) == "notice:0@5"
    assert str(schedule.take_due({0, 1}, elapsed=7.0, step=None)) == "kill:1@6"
    assert not schedule


def test_a_step_fault_waits_for_its_step_however_long_it_takes() -> None:
    schedule = _schedule("kill:1@step30")
    assert schedule.take_due({0, 1}, elapsed=3600.0, step=29) is None
    assert schedule.take_due({0, 1}, elapsed=0.5, step=None) is None
    assert str(schedule.take_due({0, 1}, elapsed=0.5, step=31)) == "kill:1@step30"


def test_a_checkpoint_fault_waits_for_the_nodes_nth_stored_checkpoint_file() -> None:
    """A script that reports no steps (the Trainer, Lightning unchanged) still has a point
    to aim at: its Nth checkpoint file in the store, on any machine."""
    schedule = _schedule("kill:0@ckpt3", "nocapacity:algo-2@ckpt1+5")
    assert [str(f) for f in schedule.pending] == ["kill:0@ckpt3", "nocapacity:1@ckpt1+5"]
    assert schedule.take_due({0, 1}, elapsed=3600.0, step=500, stored=0) is None
    assert (
        str(schedule.take_due({0, 1}, elapsed=1.0, step=None, stored=2)) == "nocapacity:1@ckpt1+5"
    )
    assert schedule.take_due({0, 1}, elapsed=1.0, step=None, stored=2) is None
    assert str(schedule.take_due({0, 1}, elapsed=1.0, step=None, stored=3)) == "kill:0@ckpt3"


def test_a_fault_for_a_node_the_attempt_lacks_waits_for_one_that_has_it() -> None:
    schedule = _schedule("kill:2@1", "kill:0@3")
    assert str(schedule.take_due({0, 1}, elapsed=5.0, step=None)) == "kill:0@3"
    assert schedule.take_due({0, 1}, elapsed=5.0, step=None) is None
    assert str(schedule.take_due({0, 1, 2}, elapsed=5.0, step=None)) == "kill:2@1"


def test_the_faults_the_record_says_fired_never_fire_again() -> None:
    """A controller that takes a job over builds its schedule from the record: a fault the
    dead controller fired is not pending, even twice spelled the same (each takes one)."""
    schedule = FaultSchedule(
        [Fault.parse(s) for s in ("kill:1@6", "kill:1@6", "notice:0@step30")],
        fired=["kill:1@6", "nocapacity:0@1"],
    )
    assert [str(f) for f in schedule.pending] == ["kill:1@6", "notice:0@step30"]


def test_a_first_step_fault_counts_from_the_first_step_not_from_the_launch() -> None:
    """`first+N`: a script with 40 s of imports is not hit before it trained at all, and
    one that reports no steps is hit N s into its training all the same."""
    schedule = _schedule("kill:1@first+5", "nocapacity:0@first+2.5+30")
    assert [str(f) for f in schedule.pending] == ["kill:1@first+5", "nocapacity:0@first+2.5+30"]
    assert not any(f.timed for f in schedule.pending)
    assert schedule.take_due({0, 1}, elapsed=3600.0, step=None, stepping=None) is None
    assert schedule.take_due({0, 1}, elapsed=40.0, step=None, stepping=2.0) is None
    fired = schedule.take_due({0, 1}, elapsed=41.0, step=None, stepping=3.0)
    assert str(fired) == "nocapacity:0@first+2.5+30" and fired.duration == 30.0
    assert schedule.take_due({0, 1}, elapsed=42.0, step=None, stepping=4.9) is None
    assert str(schedule.take_due({0, 1}, elapsed=44.0, step=9, stepping=5.0)) == "kill:1@first+5"
