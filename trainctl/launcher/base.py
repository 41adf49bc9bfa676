"""What every launcher returns: one node's command and the environment it adds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeCommand:
    argv: list[str]  # empty: this node runs nothing itself (an MPI worker host)
    env: dict[str, str] = field(default_factory=dict)  # on top of the SM_* environment
