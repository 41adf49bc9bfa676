"""One attempt as the controller follows it: each node's live state, how an attempt ended,
and the bookkeeping of steps (reached, checkpointed, resumed from, lost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl.record import Attempt
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
