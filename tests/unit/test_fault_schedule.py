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
