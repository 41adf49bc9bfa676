"""A job's time limits: `max_run` bounds its training (every attempt's together), `max_wait`
the whole job, waits for capacity included; and the slack a deadline leaves."""

from __future__ import annotations

from trainctl.clock import clock
from trainctl.controller.deadline import DEFAULT_RESTART_SECONDS, Pace
from trainctl.record.models import TO_FIRST_STEP, Attempt, JobRecord
from trainctl.spec.settings import Settings, get_settings


class TimeBudget:
    """What of the job's time is spent, from its record and the controller's clock."""

    def __init__(self, record: JobRecord, settings: Settings | None = None) -> None:
        self.record = record
        # (the controller's: asked at every check of the deadline, and reading the settings
        # anew scans the environment)
        self.settings = settings or get_settings()
        self.job_started = clock().monotonic()
        # The job's time before this controller (a takeover's): the deadline is the job's.
        self.waited_before = 0.0
        if record.started_at is not None:
            from trainctl.record.keys import parse_iso

            self.waited_before = max(0.0, clock().time() - parse_iso(record.started_at))
        # Training of the attempts that ended (a wait for capacity after one is not training).
        self.trained_before = sum(a.training_seconds or 0.0 for a in record.attempts)

    def slack(self) -> float | None:
        """Seconds the job can still spend not training and end by its max_wait, if all of
        max_run's training is still to come (None: no max_wait)."""
        spec = self.record.spec
        if spec.max_wait is None:
            return None
        left = spec.max_wait - (clock().monotonic() - self.job_started)
        return left - max(0.0, spec.max_run - self.trained_before)

    def pace(self) -> Pace | None:
        """Where the job stands against its deadline, where its work and its pace are known
        (trainctl.controller.deadline); None: no max_wait, no total, or no pace yet (the job
        has not trained: until it has, the deadline's slack counts max_run as its work, as
        for a job whose work is unknown). The work done is what a relaunch keeps, in seconds
        at the job's pace: up to the last checkpoint, or to the last step for a job that has
        shown it saves when told to stop. A relaunch costs the attempts' mean
        start-up (less any wait for capacity) and the steps they lost."""
        spec, record = self.record.spec, self.record
        progress = record.progress(clock().time())
        if spec.max_wait is None or progress is None or not progress["steps_per_second"]:
            # (No pace yet, measured on the real traces: taking the line from max_run before
            # the first pace sends a job to on-demand at its first minute without spot, 0.63x
            # the cost in the median against 0.53x waiting on the slack; both in time.)
            return None
        rate = progress["steps_per_second"]
        saved_steps = max(
            (a.last_checkpoint_step or a.resumed_from_step or 0 for a in record.attempts),
            default=0,
        )
        if resumes_where_stopped(record.attempts[:-1]):
            # The script saves when told to stop: a relaunch by choice (a try back to spot)
            # keeps every step so far, not only those of the last periodic save.
            saved_steps = max(saved_steps, record.attempts[-1].last_step or 0)
        starts = [
            a.startup[TO_FIRST_STEP] - a.startup.get("capacity", 0.0)
            for a in record.attempts
            if a.startup and TO_FIRST_STEP in a.startup
        ]
        lost = [a.steps_lost for a in record.attempts if a.steps_lost is not None]
        restart = DEFAULT_RESTART_SECONDS
        if starts:
            restart = sum(starts) / len(starts) + (sum(lost) / len(lost) / rate if lost else 0.0)
        return Pace(
            elapsed=clock().monotonic() - self.job_started + self.waited_before,
            deadline=float(spec.max_wait),
            work=progress["total_steps"] / rate,
            done=saved_steps / rate,
            restart=max(self.settings.min_restart_seconds, restart),
            run_left=spec.max_run - self.trained(),
        )

    def trained(self) -> float:
        """Seconds of max_run spent: the attempts that ended, and the one under way since it
        had its nodes."""
        from trainctl.record.keys import parse_iso

        spent = 0.0
        for attempt in self.record.attempts:
            if attempt.training_seconds is not None:
                spent += attempt.training_seconds
            elif attempt.ended_at is None:
                spent += max(0.0, clock().time() - parse_iso(attempt.started_at))
        return spent

    def reached(self, training_started: float | None) -> str | None:
        """Which limit the job has reached, as its stop reason (None: neither).
        `training_started`: when the attempt under way started training, if it did."""
        spec = self.record.spec
        now = clock().monotonic()
        attempts = self.record.attempts
        training = training_started is not None and bool(attempts) and attempts[-1].ended_at is None
        trained = self.trained_before + (now - training_started if training else 0.0)
        # Wall time is never less than training time: when both are past, the wait binds.
        if spec.max_wait is not None and now - self.job_started > spec.max_wait:
            return (
                f"MaxWaitTimeExceeded: max_wait of {spec.max_wait} s reached "
                f"({len(attempts)} attempt(s))"
            )
        if trained > spec.max_run:
            return f"MaxRuntimeExceeded: max_run of {spec.max_run} s reached"
        return None


def resumes_where_stopped(earlier: list[Attempt]) -> bool:
    """Whether an earlier attempt of the job saved at its last step and the next resumed
    there: the script saves when it is told to stop (a notice), so a relaunch by choice
    loses nothing even before this attempt's first save. (At or after the last step it
    reported: a script that reports every few hundred steps saves at a notice past its last
    report; that is still where it stopped.)"""
    return any(
        a.steps_lost == 0
        and a.last_step
        and a.last_checkpoint_step is not None
        and a.last_checkpoint_step >= a.last_step
        for a in earlier
    )
