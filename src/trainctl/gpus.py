"""The GPUs of a machine, found without importing torch (slow to import, and absent from a
controller's environment): `CUDA_VISIBLE_DEVICES` where it is set, else `nvidia-smi`.

Used by the local provider (to give each local node its own GPUs), by the node agent (how
many GPUs its node has: SM_NUM_GPUS and the default workers per node) and by the agent's
health check before training (a GPU already busy, uncorrected ECC errors).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

NVIDIA_SMI = "nvidia-smi"
QUERY_TIMEOUT_SECONDS = 20


def _nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's stdout, or None when there is no nvidia-smi (or it fails: no driver)."""
    import shutil

    if shutil.which(NVIDIA_SMI) is None:
        return None  # no NVIDIA driver here: no process to start
    try:
        out = subprocess.run(
            [NVIDIA_SMI, *args],
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids this process may use, in order: CUDA_VISIBLE_DEVICES's entries where it
    is set (a user who hid some GPUs keeps them hidden; "" or -1: none), else one per
    GPU `nvidia-smi -L` lists ("0", "1", ...); [] where there is no GPU."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        # CUDA stops at the first invalid entry: "-1" hides every GPU after it.
        return ids[: ids.index("-1")] if "-1" in ids else ids
    listing = _nvidia_smi("-L") or ""
    count = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
    return [str(index) for index in range(count)]


def share_gpus(ids: list[str], nodes: int) -> list[list[str]]:
    """`ids` shared out among `nodes` nodes, each an equal consecutive run (NVLink pairs
    are neighbours); what does not divide evenly stays idle ([] each without GPUs)."""
    per_node = len(ids) // nodes
    return [ids[rank * per_node : (rank + 1) * per_node] for rank in range(nodes)]


@dataclass(frozen=True)
class GpuState:
    """One GPU as nvidia-smi reports it."""

    index: str
    name: str
    memory_used_mib: int
    ecc_uncorrected: int  # volatile uncorrected ECC errors since the driver loaded


def gpu_states() -> list[GpuState] | None:
    """Every GPU of the machine, or None when nvidia-smi cannot tell."""
    text = _nvidia_smi(
        "--query-gpu=index,name,memory.used,ecc.errors.uncorrected.volatile.total",
        "--format=csv,noheader,nounits",
    )
    if text is None:
        return None
    states = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 4:
            continue
        index, name, used, ecc = parts
        states.append(
            GpuState(index, name, _int(used), _int(ecc))  # "[N/A]": no ECC on this GPU
        )
    return states


def busy_gpus() -> dict[str, list[int]]:
    """GPU (by UUID-less index) -> pids of the compute processes already on it."""
    text = _nvidia_smi("--query-compute-apps=gpu_bus_id,pid", "--format=csv,noheader")
    buses = _nvidia_smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    if text is None or buses is None:
        return {}
    index_of = {}
    for line in buses.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2:
            index_of[parts[1]] = parts[0]
    busy: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0] in index_of:
            busy.setdefault(index_of[parts[0]], []).append(_int(parts[1]))
    return busy


def health_problems(
    ids: list[str], expected: int | None, *, busy_warnings: list[str] | None = None
) -> list[str]:
    """What is wrong with the GPUs `ids` of a node before training starts (empty: nothing
    seen): fewer than `expected`, one already running another process, uncorrected ECC
    errors. Each names the GPU. With `busy_warnings`, a busy GPU goes there instead."""
    problems = []
    if expected is not None and len(ids) < expected:
        problems.append(f"{len(ids)} GPU(s) visible, {expected} expected")
    states = gpu_states()
    if states is None:
        return problems
    mine = set(ids)
    by_index = {state.index: state for state in states if state.index in mine}
    busy = busy_gpus()
    for index in ids:
        state = by_index.get(index)
        if state is None:
            continue
        if state.ecc_uncorrected > 0:
            problems.append(
                f"GPU {index} ({state.name}): {state.ecc_uncorrected} uncorrected ECC error(s)"
            )
        if pids := busy.get(index):
            (problems if busy_warnings is None else busy_warnings).append(
                f"GPU {index} ({state.name}) is busy: process(es) "
                f"{', '.join(map(str, pids))} hold {state.memory_used_mib} MiB"
            )
    return problems


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0
