"""Launch overhead: submit -> first training step on 2 local nodes, vs. a bare torchrun."""

from __future__ import annotations

from typing import Any

from bench.common import WORKLOAD_ARGS, first, log, ratio_figure, run_torchrun

GOAL = 1.25
STEPS = 5


def measure(ctx: Any) -> list[dict[str, Any]]:
    hps = {**WORKLOAD_ARGS, "steps": STEPS, "warmup": 1, "checkpoint-every": 0}
    # Warm the page cache (python, torch) so the first repetition is not a cold start.
    run_torchrun(ctx.procs, ctx.workdir / "launch-warmup", hps)
    base: list[float] = []
    tc: list[float] = []
    race_free: list[float] = []
    phases: dict[str, list[float]] = {
        "base_worker_start": [],
        "tc_launched": [],
        "tc_worker_start": [],
    }
    reps = ctx.reps if ctx.quick else ctx.reps + 2  # cheap: 5 by default
    for rep in range(reps):
        run = run_torchrun(ctx.procs, ctx.workdir / f"launch-base-{rep}", hps)
        latency = run.first_step_latency()
        base.append(latency)
        phases["base_worker_start"].append(_since(run, first(run.events, "start")))
        log(f"launch rep {rep + 1}: bare torchrun {latency:.2f} s")
        if rep < 2:  # diagnostic, twice: the same, node 1 waiting for the master (no race)
            quiet = run_torchrun(
                ctx.procs, ctx.workdir / f"launch-wait-{rep}", hps, wait_for_master=True
            )
            race_free.append(quiet.first_step_latency())
            log(f"launch rep {rep + 1}: bare torchrun, race-free {race_free[-1]:.2f} s")
        tc_run, _, _ = ctx.runner.run(hps, timeout=120)
        latency = tc_run.first_step_latency()
        tc.append(latency)
        training = next(
            (e for e in tc_run.info["job_events"] if e.get("state") == "Training"), None
        )
        if training:
            phases["tc_launched"].append(_iso(training["time"]) - tc_run.t0)
        phases["tc_worker_start"].append(_since(tc_run, first(tc_run.events, "start")))
        log(f"launch rep {rep + 1}: trainctl     {latency:.2f} s ({tc_run.info['job']})")
    return [
        ratio_figure(
            "launch",
            "launch overhead: submit -> first step, 2 local nodes",
            "s",
            "bare torchrun, 2 node launchers started by hand",
            base,
            tc,
            goal_text=f"<= {GOAL}x",
            goal_max=GOAL,
            detail={
                # Bare torchrun with node 1 waiting for the master's store port before its
                # rendezvous (bench/torchrun_wait.py): the launch without torchrun's race.
                "bare_torchrun_race_free_s": _median(race_free),
                # Medians, seconds from the start: worker processes started (torch imported
                # after that), and for trainctl when every node's torchrun was launched.
                "bare_worker_start_s": _median(phases["base_worker_start"]),
                "trainctl_nodes_launched_s": _median(phases["tc_launched"]),
                "trainctl_worker_start_s": _median(phases["tc_worker_start"]),
            },
        )
    ]


def _iso(value: str) -> float:
    from trainctl.record.keys import parse_iso

    return parse_iso(value)


def _since(run: Any, event: dict[str, Any] | None) -> float | None:
    return event["t"] - run.t0 if event else None


def _median(values: list[float | None]) -> float | None:
    import statistics

    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None
