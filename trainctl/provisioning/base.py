"""The provider interface: provision N hosts, run an agent on each, watch, terminate.

Providers own capacity only; what runs on a node is the agent's business (container/agent)
and what the agent runs is the launcher's (launcher/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from trainctl.cluster import ClusterInfo
from trainctl.estimator.spec import JobSpec
from trainctl.transport import RunningProcess


class Provider(ABC):
    name: str

    @abstractmethod
    def dry_run(self, spec: JobSpec, job: str, attempt: int) -> list[dict[str, Any]]:
        """The requests `provision` would make ({"service", "operation", "params"}), unsent."""

    @abstractmethod
    def provision(self, spec: JobSpec, job: str, attempt: int) -> ClusterInfo:
        """Hosts for one attempt, all or nothing."""

    @abstractmethod
    def start_agent(
        self, cluster: ClusterInfo, rank: int, argv: list[str], env: dict[str, str]
    ) -> RunningProcess:
        """Start the node agent on the node of `rank`; its output comes back as lines."""

    @abstractmethod
    def agent_python(self, cluster: ClusterInfo, rank: int) -> str:
        """The interpreter that runs the agent on that node."""

    @abstractmethod
    def terminate(self, job: str, *, grace: float) -> None:
        """Release everything the job holds on this provider. Idempotent; finds by tag."""

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """Take one node away without warning (fault injection: a spot reclaim)."""
        raise NotImplementedError(f"the {self.name} provider cannot kill a node")
