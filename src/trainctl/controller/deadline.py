"""Spot with a deadline: Uniform Progress (Wu et al., "Can't Be Late", NSDI 2024), on
trainctl's fault model.

A job that knows its work (`total_steps`, or the script's `report_step(total_steps=N)`) and its
deadline (`max_wait`, from its start) has a straight line from nothing done at its start to
all done at its deadline: the expected progress ep(t) = work * t / deadline. With cp(t) the
work done (in seconds of training at the job's pace, up to its last checkpoint), the
restart cost d (a relaunch's start-up and what a checkpoint interval loses), the paper's
rules, as the controller applies them:

1. **Uniform progress.** Without capacity and behind the line (cp < ep(t)): take on-demand
   now (spot first if it is there, rule 2), rather than wait for spot.
2. **Taking risks.** Spot whenever it can be had, behind the line or not; a job on spot
   stays there until it is preempted.
3. **Hysteresis.** On on-demand, stay until cp >= ep(t + 2d): then checkpoint and relaunch
   to try spot (a try that finds none is back on demand, and waits longer before the next).
4. **Safety net.** Once the time left is less than the work left and 2d (R(t) < C(t) + 2d),
   on-demand only, to the end.

Ahead of the line and without capacity, the job waits for spot. Where the provider can be
asked whether spot has room without launching (EC2's placement scores), rule 3 is relaxed: a
job on on-demand also tries spot whenever the answer is good and the safety net would still
hold after one more restart (`affords_try`): a try costs a restart and, asked first, seldom
finds nothing, so it need not wait to be two restarts ahead of the line. `decide` and
`leave_on_demand` are the whole policy: pure functions of a `Pace`, tested alone
(tests/unit/test_deadline.py), used by the controller (controller.capacity) on EC2, in the
spot replay and in `trainctl estimate` alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Market = Literal["spot", "spot-or-on-demand", "on-demand"]
# A relaunch costs at least this much when nothing better is measured: a start-up (EC2's
# launch, the agent, the code) and half of a checkpoint interval redone.
DEFAULT_RESTART_SECONDS = 600.0


@dataclass(frozen=True)
class Pace:
    """Where a job with known work stands against its deadline, in seconds since its start
    (work as seconds of training at the job's full-size pace)."""

    elapsed: float
    deadline: float  # max_wait
    work: float  # the whole job's training
    done: float  # of it, up to the last checkpoint
    restart: float = DEFAULT_RESTART_SECONDS  # d
    # What is left of max_run, the training budget (every attempt's start-up counts in it):
    # a relaunch spends it too. None: not bounded.
    run_left: float | None = None

    def expected(self, at: float) -> float:
        """ep(t): the work done by `at` on the straight line to the deadline."""
        return self.work * min(1.0, max(0.0, at / self.deadline))

    @property
    def left(self) -> float:
        return max(0.0, self.work - self.done)

    @property
    def behind(self) -> bool:
        return self.done < self.expected(self.elapsed)

    @property
    def room(self) -> float:
        """R(t): the time to the deadline or, where it is less, what is left of max_run."""
        room = self.deadline - self.elapsed
        return room if self.run_left is None else min(room, self.run_left)

    @property
    def must_finish(self) -> bool:
        """The safety net: R(t) < C(t) + 2d."""
        return self.room < self.left + 2 * self.restart


def decide(pace: Pace) -> Market:
    """What a job without capacity asks for now (rules 1, 2 and 4)."""
    if pace.must_finish:
        return "on-demand"
    if pace.behind:
        return "spot-or-on-demand"
    return "spot"


def affords_try(pace: Pace) -> bool:
    """Whether a try back to spot that the provider, asked, says has room can be afforded:
    the safety net still holds after one more restart (a try that finds none costs one)."""
    return pace.room >= pace.left + 3 * pace.restart


def leave_on_demand(pace: Pace) -> bool:
    """Whether a job on on-demand capacity should checkpoint and try spot (rule 3)."""
    if pace.must_finish:
        return False
    return pace.done >= pace.expected(pace.elapsed + 2 * pace.restart)
