"""The node agent's work yields the CPU to training.

A node's CPUs are the training processes' first: the agent's own work (forwarding log
lines, uploading checkpoints, heartbeats, watching for notices) runs at a lower priority,
on what training leaves idle, instead of taking turns with the workers. On a GPU node that
is most of the CPUs and nothing changes; on a CPU-bound node (the 2-core benchmark machine)
it is the difference between supervision costing a few percent of the steps and nothing
measurable. Idle CPUs still run this work at full speed, and on Linux nice is per thread,
so processes the agent starts from its main thread before lowering it (the launcher and
the workers) keep their normal priority.
"""

from __future__ import annotations

import os
import threading

AGENT_NICENESS = 10


def yield_cpu_to_training() -> None:
    """Lower the calling thread's CPU priority by AGENT_NICENESS (Linux: per thread)."""
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(current + AGENT_NICENESS, 19))
    except (AttributeError, OSError):  # not Linux, or not permitted: same priority then
        pass
