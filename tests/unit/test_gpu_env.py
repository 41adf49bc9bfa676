"""The GPU and NCCL plumbing that needs no GPU: which GPUs a process may use, how local
nodes share them, the node's route to its master, and the NCCL variables made from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.gpus import share_gpus, visible_gpus
from trainctl.launcher.nccl import nccl_env
from trainctl.node.route import route_interface

ROUTES = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ens5\t00000A0A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ens6\t00000A0A\t00000000\t0001\t0\t0\t50\t0000FFFF\t0\t0\t0
down0\t0000000B\t00000000\t0000\t0\t0\t0\t000000FF\t0\t0\t0
"""


@pytest.mark.parametrize(
    ("visible", "ids"),
    [("0,1,2,3", ["0", "1", "2", "3"]), ("2, 3", ["2", "3"]), ("", []), ("1,-1,2", ["1"])],
)
def test_cuda_visible_devices_is_what_may_be_used(visible: str, ids: list[str]) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": visible}) == ids


def test_nodes_share_gpus_in_equal_consecutive_runs() -> None:
    ids = [str(i) for i in range(8)]
    assert share_gpus(ids, 2) == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    assert share_gpus(ids, 3) == [["0", "1"], ["2", "3"], ["4", "5"]]  # 6 and 7 stay idle
    assert share_gpus([], 2) == [[], []]


def test_the_route_to_the_master_names_its_interface(tmp_path: Path) -> None:
    table = tmp_path / "route"
    table.write_text(ROUTES)
    assert route_interface("10.10.3.4", table) == "ens5"  # the lower metric of two /16s
    assert route_interface("172.17.0.2", table) == "docker0"
    assert route_interface("8.8.8.8", table) == "eth0"  # the default route
    assert route_interface("11.0.0.1", table) == "eth0"  # a route that is down is no route
    assert route_interface("127.0.0.5", table) == "lo"
    assert route_interface("10.1.2.3", tmp_path / "missing") is None


def test_nccl_variables_follow_the_route_and_efa() -> None:
    efa = {"NCCL_SOCKET_IFNAME": "^lo,docker", "FI_PROVIDER": "efa"}
    env = nccl_env(efa, route_interface="ens5", ofi_nccl_dir="/opt/ofi", ld_library_path="/x")
    assert env == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_SOCKET_IFNAME": "ens5",
        "GLOO_SOCKET_IFNAME": "ens5",
        "LD_LIBRARY_PATH": "/opt/ofi:/x",
    }
    # a pinned interface (loopback clusters) stays; no plug-in without EFA; no route: none set
    loopback = nccl_env({"NCCL_SOCKET_IFNAME": "lo"}, route_interface="eth0",
                        ofi_nccl_dir="/opt/ofi", ld_library_path=None)  # fmt: skip
    assert "NCCL_SOCKET_IFNAME" not in loopback and "LD_LIBRARY_PATH" not in loopback
    assert "NCCL_SOCKET_IFNAME" not in nccl_env({}, route_interface=None, ofi_nccl_dir=None,
                                                ld_library_path=None)  # fmt: skip
