"""Which injected fault (`faults`) fires when: the schedule, apart from what firing does
(the controller kills the node or serves the notice)."""

from __future__ import annotations

from trainctl.spec.parts import Fault


class FaultSchedule:
    """The job's faults not fired yet. One fires per poll: a kill is seen (and ends the
    attempt) before the next fault is due, so faults at nearby times hit successive
    attempts in order. Time faults come first, earliest first; a step fault fires once the
    script has reported its step, whatever the time. A fault naming a node the attempt
    does not have (an elastic job's shrunk one) waits for an attempt that has it."""

    def __init__(self, faults: list[Fault], fired: list[str] | None = None) -> None:
        """`fired`: the faults the job's record says fired already (a controller that takes
        the job over must not fire them again); each takes one of the same spelling."""
        left = list(faults)
        for spelled in fired or []:
            match = next((f for f in left if str(f) == spelled), None)
            if match is not None:
                left.remove(match)
        self.pending = sorted(
            left,
            key=lambda f: (not f.timed, f.at, f.step or 0),
        )

    def __bool__(self) -> bool:
        return bool(self.pending)

    def take_due(
        self,
        ranks: set[int],
        elapsed: float,
        step: int | None,
        stored: int = 0,
        stepping: float | None = None,
    ) -> Fault | None:
        """The next fault due `elapsed` seconds into the attempt's training with the
        script at `step`, `stored` checkpoint files in the store and `stepping` seconds
        since its first step, on an attempt with these node `ranks` (taken off the
        schedule)."""
        for fault in self.pending:
            if set(fault.ranks) <= ranks and fault.due(elapsed, step, stored, stepping):
                self.pending.remove(fault)
                return fault
        return None
