"""Ending a training process without PyTorch's teardown hazards.

With torch 2.13 and gloo, destroying a process group right after a collective can deadlock:
the destructor joins gloo's worker thread while holding the GIL, and that thread needs the
GIL to release the last collective's tensors (seen as a worker that finished training and
never exits). Exiting right after an all-reduce can also abort. `finish()` synchronises the
ranks, flushes output and ends the process without running those destructors, so a job
whose work is done always exits with the code it means.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from trainctl.train import _background


def finish(code: int = 0) -> NoReturn:
    """End the process with `code`; call it on every rank as a script's last statement.

    First it waits for background work (checkpoint fsyncs and pruning). With a process
    group: barrier, flush stdout/stderr, and exit without running destructors (or atexit
    handlers). Without one there is no hazard, so it is a plain `sys.exit(code)`
    (a SystemExit that in-process callers, tests say, can catch).
    """
    _background.join_all()  # checkpoint fsyncs and pruning still running
    _background.run_at_end()  # (the last step report_step held back; no atexit below)
    from trainctl.train.diagnosis import report_early_end

    report_early_end()  # a diagnose run whose script ended before its steps were measured
    if "torch.distributed" not in sys.modules:
        sys.exit(code)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        sys.exit(code)
    try:
        dist.barrier()
    except Exception:  # a peer already gone must not turn a finished job into a hang
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
