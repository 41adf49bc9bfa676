"""How the controller runs a node agent and reads its output: a handful of primitives.

`RunningProcess` is what every transport returns (local.py a child process, ssh/ one over
SSH, store.py a node followed through the store alone): merged
stdout/stderr lines, poll/wait for the exit code, terminate/kill.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator


class RunningProcess(ABC):
    # Seconds per start-up stage the provider spent starting it (ssh, agent, image).
    startup: dict[str, float] | None = None

    @abstractmethod
    def lines(self) -> Iterator[str]:
        """Output lines (without newline) until the process closes its output."""

    @abstractmethod
    def poll(self) -> int | None: ...

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Exit code; raises TimeoutError if still running after `timeout`."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask to stop (SIGTERM): the agent forwards it to the workers."""

    @abstractmethod
    def kill(self) -> None:
        """Stop now, with every process it started."""

    def tell(self, line: str) -> bool:
        """A control line to the agent at once, over the input the controller holds (its
        pipe), where it has one; False where it has none (an adopted node, a node only the
        store reaches): the lease is the channel then."""
        return False
