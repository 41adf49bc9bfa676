"""Steady-state steps/s with log streaming and checkpoint sync on, vs. a bare torchrun."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import WORKLOAD_ARGS, log, ratio_figure, run_torchrun

GOAL = 0.97


def measure(ctx: Any) -> list[dict[str, Any]]:
    # A checkpoint (~66 MB) every 80 steps, ~4 s: far more often than a real job would, so
    # that the sync's cost shows. Its cost scales with checkpoint bytes per second (on the
    # local provider the "upload" is a copy into the store directory, on the same CPUs).
    steps = 200 if ctx.quick else 320
    hps = {
        **WORKLOAD_ARGS,
        "steps": steps,
        "warmup": 40,
        "checkpoint-every": 80,
        "keep": 2,
        "log-every": 1,
    }
    base: list[float] = []
    tc: list[float] = []
    base_stalls: list[float] = []
    tc_stalls: list[float] = []
    # Noisier than the others (a ~15 s window, checkpoints in it): 5 repetitions by default.
    reps = ctx.reps if ctx.quick else ctx.reps + 2
    for rep in range(reps):
        run = run_torchrun(ctx.procs, ctx.workdir / f"tput-base-{rep}", hps)
        base.append(run.steps_per_s())
        base_stalls += run.stalls()
        log(f"throughput rep {rep + 1}: bare torchrun {base[-1]:.2f} steps/s")
        tc_run, _, _ = ctx.runner.run(hps)
        tc.append(tc_run.steps_per_s())
        tc_stalls += tc_run.stalls()
        log(f"throughput rep {rep + 1}: trainctl     {tc[-1]:.2f} steps/s ({tc_run.info['job']})")
    detail = {
        "steps": steps,
        "window_steps": steps - hps["warmup"],
        "checkpoint_every": hps["checkpoint-every"],
        "median_checkpoint_stall_s": {
            "bare_torchrun": statistics.median(base_stalls) if base_stalls else None,
            "trainctl": statistics.median(tc_stalls) if tc_stalls else None,
        },
    }
    return [
        ratio_figure(
            "throughput",
            "steady-state steps/s, log streaming + checkpoint sync on",
            "steps/s",
            "bare torchrun, same script and steps (checkpoints to local disk)",
            base,
            tc,
            goal_text=f">= {GOAL}x",
            goal_min=GOAL,
            detail=detail,
        )
    ]
