"""One attempt as the controller follows it: each node's live state, how an attempt ended,
and the bookkeeping of steps (reached, checkpointed, resumed from, lost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl.record.models import Attempt
from trainctl.transport import RunningProcess


@dataclass
class LiveNode:
    rank: int
    proc: RunningProcess
    launched: bool = False
    idle: bool = False
    exit_code: int | None = None
    result: dict[str, Any] = field(default_factory=dict)
    exited_at: float | None = None
    last_seen: float = 0.0
    lost: str | None = None  # why this node counts as lost (infrastructure, not user code)
    # Set by the attempt's machine watcher: the provider says the machine is gone (why).
    machine_lost: str | None = None
    # Seconds per start-up stage on this node: the provider's (ssh, agent, image) and the
    # agent's (code, venv).
    startup: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptEnd:
    outcome: str  # completed | stopped | failed | interrupted
    cause: str | None
    exit_code: int | None = None
    detail: str | None = None


def count_step(attempt: Attempt, event: str, step: int) -> None:
    """A step the script reported (progress, a checkpoint, a preemption) in `attempt`."""
    attempt.last_step = max(step, attempt.last_step or 0)
    if event == "checkpoint":
        attempt.last_checkpoint_step = step


def count_held(attempt: Attempt, event: str, seconds: Any) -> None:
    """The script's loop held: a save's stall (each save's seconds: added) or its wait for
    data (the process's running total: the latest kept), for the attempt's goodput."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < 1e9:
        return
    if event == "checkpoint_stall":
        attempt.checkpoint_stall_seconds = (attempt.checkpoint_stall_seconds or 0.0) + seconds
    else:
        attempt.data_wait_seconds = max(float(seconds), attempt.data_wait_seconds or 0.0)


def settle_steps_lost(earlier: list[Attempt], resumed_from: int) -> list[Attempt]:
    """A new attempt resumed from step `resumed_from`: every earlier attempt not yet accounted
    for (one cut short before it trained, say) lost what it reached beyond that point; one
    that reached no step lost nothing. Returns the attempts it accounted for."""
    settled = [attempt for attempt in earlier if attempt.steps_lost is None]
    count_steps_lost(settled, resumed_from)
    return settled


def count_steps_lost(earlier: list[Attempt], resumed_from: int) -> None:
    """What each of `earlier` reached beyond `resumed_from` (nothing if it reached no step)."""
    for attempt in earlier:
        reached = attempt.last_step if attempt.last_step is not None else resumed_from
        attempt.steps_lost = max(0, reached - resumed_from)


class Resumes:
    """Where an attempt resumed from, and what that makes the earlier attempts lose. Only
    rank 0's stream tells: its `resumed` comes before its steps, but another node's
    `checkpoint` travels another stream and can overtake it. A step of rank 0 before any
    `resumed` is taken for a start from scratch (a guess); the script's own `resumed`, when
    it comes, replaces the guess and the losses counted from it."""

    def __init__(self) -> None:
        # Earlier attempts whose loss was counted from a guessed resume.
        self.guessed: list[Attempt] | None = None

    def resumed(
        self, attempts: list[Attempt], attempt: Attempt, step: int, *, guessed: bool = False
    ) -> bool:
        """`attempt` (the last of `attempts`) resumed from `step`; whether that is news."""
        if attempt.resumed_from_step is not None:
            if guessed or self.guessed is None:
                return False
            counted, self.guessed = self.guessed, None
            if step == attempt.resumed_from_step:
                return False  # the guess was right
            count_steps_lost(counted, step)
            attempt.resumed_from_step = step
            return True
        attempt.resumed_from_step = step
        settled = settle_steps_lost(attempts[:-1], step)
        self.guessed = settled if guessed else None
        return True
