"""A job's time limits: `max_run` bounds its training (every attempt's together), `max_wait`
the whole job, waits for capacity included; and the slack a deadline leaves."""

from __future__ import annotations

from trainctl.clock import clock
from trainctl.record import JobRecord


class TimeBudget:
    """What of the job's time is spent, from its record and the controller's clock."""

    def __init__(self, record: JobRecord) -> None:
        self.record = record
        self.job_started = clock().monotonic()
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
