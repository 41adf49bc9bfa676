"""What multi-node NCCL (and, on EFA instances, libfabric) needs from the environment that
a user would otherwise have to know. A pure function of what the node found: the agent
looks up its route to the master and the aws-ofi-nccl plug-in, and the job's own
`environment` is applied after this, so a user's value always wins.

Each variable, and why, is in docs/gpus.md.
"""

from __future__ import annotations

from collections.abc import Mapping

ASYNC_ERROR_HANDLING = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "1"}
# Where the DLAMIs and AWS's containers keep the aws-ofi-nccl plug-in, newest layout first.
OFI_NCCL_DIRS = (
    "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    "/opt/amazon/ofi-nccl/lib",
    "/opt/aws-ofi-nccl/lib",
)


def nccl_env(
    network_env: Mapping[str, str],
    *,
    route_interface: str | None,
    ofi_nccl_dir: str | None,
    ld_library_path: str | None,
) -> dict[str, str]:
    """The variables to add for NCCL on one node, over the cluster's `network_env`.

    `route_interface`: the node's interface towards the master (None: unknown); it replaces
    the cluster's exclusion pattern (`^lo,docker`) but not a pinned interface (loopback
    clusters pin `lo`). `ofi_nccl_dir`: where the aws-ofi-nccl plug-in is on this node.
    """
    env = dict(ASYNC_ERROR_HANDLING)
    pinned = network_env.get("NCCL_SOCKET_IFNAME", "")
    if route_interface and (not pinned or pinned.startswith("^")):
        env["NCCL_SOCKET_IFNAME"] = route_interface
        env["GLOO_SOCKET_IFNAME"] = route_interface
    if network_env.get("FI_PROVIDER") == "efa" and ofi_nccl_dir:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [ofi_nccl_dir, ld_library_path]))
    return env
