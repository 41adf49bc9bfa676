"""Recovery: a node killed (or given an interruption notice) -> training steps advancing again.

Beside each kill repetition, the baseline: the same workload started by hand with bare
torchrun, launch -> first step (what a relaunch costs at the least: the interpreters, torch's
import, the process group, the model). The goals are in seconds (issue 65's, measured on a
quiet machine); the ratio says how much of a figure is the machine's speed that day.

The workload runs as a trainctl job with an injected fault (`kill:1@T` / `notice:1@T`, T
seconds after the attempt's launch). Measured from the controller's `fault` event to the
first optimizer step of the next attempt (the workload's own timestamped BENCH line), plus
the steps lost: the controller's `steps_lost` of the interrupted attempt, and the same from
the workload's own per-step lines (last step logged by rank 0 minus the resumed step).
"""

from __future__ import annotations

from typing import Any

from bench.common import (
    TOPOLOGY,
    WORKLOAD_ARGS,
    every,
    first,
    log,
    ratio_figure,
    run_torchrun,
    summary,
)

# A week before the store diet, on a quiet machine: kill 4.65 s, notice 5.41 s (issue 65).
KILL_GOAL_S = 4.5
NOTICE_GOAL_S = 5.5
WRITE_WINDOW_STEPS = 2


def _iso(value: str) -> float:
    from trainctl.record.keys import parse_iso

    return parse_iso(value)


def _one(ctx: Any, kind: str, hps: dict[str, Any], at: float) -> dict[str, Any]:
    def recovered(desc: dict[str, Any]) -> bool:
        # The next attempt is stepping past its resume point: nothing more to measure.
        attempts = desc.get("attempts", [])
        if len(attempts) < 2 or attempts[1].get("resumed_from_step") is None:
            return False
        return (attempts[1].get("last_step") or 0) > attempts[1]["resumed_from_step"] + 5

    run, desc, per_attempt = ctx.runner.run(
        # the last node: algo-2 of two, or the only one on a 1-node GPU layout
        hps,
        faults=[f"{kind}:{TOPOLOGY.nodes - 1}@{at}"],
        timeout=240,
        stop_when=recovered,
    )
    job = run.info["job"]
    events = run.info["job_events"]
    fault = next((e for e in events if e.get("type") == "fault"), None)
    attempts = desc.get("attempts", [])
    if not run.ok or fault is None or len(attempts) < 2:
        raise RuntimeError(
            f"{kind} job {job} ended {desc.get('state')} with {len(attempts)} attempt(s) "
            f"(fault event: {fault is not None}): {desc.get('failure_reason')}"
        )
    t_fault = _iso(fault["time"])
    second = per_attempt.get(2, [])
    ready, first_step = first(second, "ready"), first(second, "first_step")
    if ready is None or first_step is None:
        raise RuntimeError(f"{kind} job {job}: attempt 2 logged no step")
    steps_before = [e["step"] for e in every(per_attempt.get(1, []), "step")]
    saved_before = [e["step"] for e in every(per_attempt.get(1, []), "ckpt") if e["t"] <= t_fault]
    lost_by_log = max(0, max(steps_before, default=0) - int(ready["step"]))
    lost_by_controller = attempts[0].get("steps_lost")

    def since_fault(kind_: str, **match: Any) -> float | None:
        for e in events:
            if e.get("type") == kind_ and all(e.get(k) == v for k, v in match.items()):
                t = _iso(e["time"])
                if t >= t_fault:
                    return round(t - t_fault, 2)
        return None

    start2 = first(second, "start")
    breakdown = {
        "attempt_ended": since_fault("attempt_end", attempt=1),
        "agents_started": since_fault("agents_started", attempt=2),
        "training_state": since_fault("state", state="Training"),
        "workers_started": round(start2["t"] - t_fault, 2) if start2 else None,
        **{
            f"torch_{name}": round(e["t"] - t_fault, 2)
            for name in ("imported", "joined", "built")
            if (e := first(second, name)) is not None
        },
        "checkpoint_restored": round(ready["t"] - t_fault, 2),
        "first_step": round(first_step["t"] - t_fault, 2),
    }
    return {
        "job": job,
        # the job's own stages (Attempt.recovery: from when the controller saw the fault)
        "job_stages": attempts[1].get("recovery"),
        "recovery_s": first_step["t"] - t_fault,
        "steps_lost": max(lost_by_log, lost_by_controller or 0),
        "steps_lost_controller": lost_by_controller,
        "steps_lost_log": lost_by_log,
        "resumed_from": int(ready["step"]),
        # The newest checkpoint rank 0 had saved locally before the fault: when it is newer
        # than the one resumed from, it had not reached the store (on every node) in time.
        "last_local_checkpoint": max(saved_before, default=None),
        "breakdown": breakdown,
    }


def measure(ctx: Any) -> list[dict[str, Any]]:
    every_n = 40
    hps = {
        **WORKLOAD_ARGS,
        "steps": 1000,  # never reached: the job is stopped once the next attempt steps
        "warmup": 10,
        "checkpoint-every": every_n,
        "keep": 2,
        "log-every": 1,
    }
    # Seconds after the attempt's launch: workers step from ~3 s on (~6 s on a slow day), a
    # checkpoint every ~2 s, so by then one or more has been saved and uploaded.
    at = 10.0
    reps = max(1, ctx.reps - 1) if ctx.quick else ctx.reps
    figures = []
    base: list[float] = []
    started = {**WORKLOAD_ARGS, "steps": 5, "warmup": 1, "checkpoint-every": 0}
    for kind in ("kill", "notice"):
        runs = []
        for rep in range(reps):
            if kind == "kill":  # interleaved with the kills; the notices share them
                bare = run_torchrun(ctx.procs, ctx.workdir / f"recovery-base-{rep}", started)
                if (latency := bare.first_step_latency()) is not None:
                    base.append(latency)
                    log(f"recovery rep {rep + 1}: bare torchrun, first step {latency:.2f} s")
            r = _one(ctx, kind, hps, at)
            runs.append(r)
            log(
                f"recovery {kind} rep {rep + 1}: {r['recovery_s']:.2f} s, "
                f"{r['steps_lost']} step(s) lost, resumed from {r['resumed_from']} ({r['job']}); "
                f"since the fault: {r['breakdown']}; the job's stages: {r['job_stages']}"
            )
        seconds = [r["recovery_s"] for r in runs]
        lost = [r["steps_lost"] for r in runs]
        s = summary(seconds)
        if kind == "kill":
            # One interval, plus the steps trained while the newest (asynchronous)
            # checkpoint was still being written and uploaded when the kill came.
            ok = s["median"] <= KILL_GOAL_S and max(lost) <= every_n + WRITE_WINDOW_STEPS
            goal = (
                f"<= {KILL_GOAL_S} s, steps lost <= {every_n} + {WRITE_WINDOW_STEPS} "
                "(1 interval + a write)"
            )
            title = "recovery after a node kill: kill -> steps advancing (local)"
        else:
            ok = s["median"] <= NOTICE_GOAL_S and max(lost) == 0
            goal = f"<= {NOTICE_GOAL_S} s, steps lost = 0"
            title = "recovery after a notice: notice -> steps advancing"
        # The ratio to bare torchrun is shown, not judged: the goals are in seconds.
        figure = ratio_figure(
            f"recovery_{kind}",
            title,
            "s",
            "bare torchrun, launch -> first step",
            base,
            seconds,
            goal_text=goal,
            detail={"checkpoint_every": every_n, "fault_at_s": at, "runs": runs},
        )
        figures.append({**figure, "pass": bool(ok), "steps_lost": lost})
    return figures
