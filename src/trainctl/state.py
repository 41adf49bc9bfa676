"""The job state machine: one enum, shared by the controller, the store records and the CLI."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    STARTING = "Starting"
    TRAINING = "Training"
    INTERRUPTED = "Interrupted"
    UPLOADING = "Uploading"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.STOPPED})

# Which transitions the controller may record. Any state may end the job (Failed/Stopped);
# Interrupted goes back to Provisioning for the next attempt.
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PROVISIONING}),
    JobState.PROVISIONING: frozenset({JobState.STARTING, JobState.INTERRUPTED}),
    JobState.STARTING: frozenset({JobState.TRAINING, JobState.INTERRUPTED, JobState.UPLOADING}),
    JobState.TRAINING: frozenset({JobState.INTERRUPTED, JobState.UPLOADING}),
    JobState.INTERRUPTED: frozenset({JobState.PROVISIONING}),
    JobState.UPLOADING: frozenset({JobState.COMPLETED, JobState.INTERRUPTED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    if src.is_terminal():
        return False
    if dst in (JobState.FAILED, JobState.STOPPED):
        return True
    return dst in ALLOWED_TRANSITIONS[src]
