"""What one attempt of a job runs on: written by the controller, read by every node agent."""

from __future__ import annotations

import ipaddress
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Nodes on one machine talk over `lo`: gloo/NCCL/TensorPipe are pinned to it.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


class NodeInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=0)
    # Its name in SM_HOSTS / SM_CURRENT_HOST: one that resolves to it from every node.
    # SageMaker's algo-N where trainctl maps the names (containers: --add-host); else an
    # address (a distinct loopback one per local node: numeric, so it needs no /etc/hosts).
    host: str
    address: str  # where other nodes reach it (the master address for rank 0)
    root: str  # layout root on that machine: '/' on cloud hosts, a per-node dir locally


class ClusterInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    attempt: int = Field(ge=1)
    provider: str
    instance_type: str
    nodes: list[NodeInfo]
    master_port: int = Field(ge=1, le=65535)
    processes_per_host: int = Field(ge=1)
    # The provider's own id of the attempt's capacity where it has one (Slurm's job id).
    capacity_id: str | None = None
    # Extra environment for every node from the provider (e.g. GLOO_SOCKET_IFNAME=lo locally).
    network_env: dict[str, str] = Field(default_factory=dict)
    # How the nodes are bought where capacity is bought (EC2): "on-demand" if any node is
    # (a spot job's fallback), else "spot". None: machines of one's own (local, SSH hosts).
    market: Literal["spot", "on-demand"] | None = None

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    @property
    def host_entries(self) -> dict[str, str]:
        """name -> address of every node whose name is not its address: what a container
        adds to its /etc/hosts (`--add-host`), so the names resolve in it."""
        return {n.host: n.address for n in self.nodes if n.host != n.address}

    @property
    def master(self) -> NodeInfo:
        return self.nodes[0]

    def node(self, rank: int) -> NodeInfo:
        return self.nodes[rank]


def host_name(rank: int) -> str:
    return f"algo-{rank + 1}"


def loopback_name(rank: int) -> str:
    """The SM_HOSTS name of a local node: an address of its own in 127.0.0.0/8 (all of it
    reaches this machine on Linux), so `hosts.index(current_host)` tells nodes apart and
    `tcp://{hosts[0]}:port` reaches rank 0 with no name to resolve."""
    return f"127.0.{1 + rank // 254}.{1 + rank % 254}"


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return False
    return True


def node_name(rank: int, address: str, *, in_container: bool) -> str:
    """A node's SM_HOSTS name: algo-N in a container (mapped there to an IP address), else
    the address the other nodes reach it at (as MASTER_ADDR does)."""
    return host_name(rank) if in_container and is_ip(address) else address


def loopback_network_env() -> dict[str, str]:
    """LOOPBACK_ENV, with values the user set in this environment kept."""
    return {k: os.environ.get(k, v) for k, v in LOOPBACK_ENV.items()}


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name, optionally with :port or [IPv6]) is this machine."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
