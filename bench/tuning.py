"""Tuning the digits example: what early stopping saves, at what best accuracy.

    python -m bench.tuning                         # 12 trials, 3 at a time, seed 0
    python -m bench.tuning --seeds 0 1 2 --strategies Bayesian Random Hyperband

For each seed, tuning jobs of the same budget run one after the other, interleaved by
strategy: each strategy without early stopping (the baseline) and with it (the median rule,
`early_stopping_type="Auto"`; Hyperband prunes by its own rule). Every trial is the digits
example on 2 local nodes (torchrun, --epochs, default 12), tuning its learning rate, hidden size and
batch size; the objective is its held-out accuracy, reported each epoch. Per tuning job:
the best held-out accuracy, the node-seconds its trials spent (nodes x each trial job's
duration, pruned ones included), the wall time, and how many trials were pruned. Printed
as a table and written to bench/tuning-results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, log, machine_info

REPO = BENCH_DIR.parent
TARGET_ACCURACY = 0.97


def run_one(
    strategy: str, early: bool, seed: int, trials: int, parallel: int, epochs: int, delay: float
) -> dict[str, Any]:
    from trainctl import Estimator
    from trainctl.record.jobstore import JobStore
    from trainctl.record.keys import parse_iso
    from trainctl.tuning import (
        CategoricalParameter,
        ContinuousParameter,
        HyperparameterTuner,
        IntegerParameter,
    )

    estimator = Estimator(
        "train.py",
        source_dir=str(REPO / "examples" / "digits"),
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={
            "epochs": epochs,
            "seed": 0,
            "checkpoint-every": -1,
            "step-delay": delay,
        },
    )
    tuner = HyperparameterTuner(
        estimator,
        objective_metric_name="test_accuracy",
        hyperparameter_ranges={
            "lr": ContinuousParameter(0.01, 1.0, "Logarithmic"),
            "hidden": IntegerParameter(16, 256),
            "batch-size": CategoricalParameter([16, 32, 64]),
        },
        strategy=strategy,
        max_jobs=trials,
        max_parallel_jobs=parallel,
        early_stopping_type="Auto" if early else "Off",
        random_seed=seed,
        base_tuning_job_name=f"bench-{strategy.lower()}",
    )
    started = time.monotonic()
    tuner.fit(logs=False)
    wall = time.monotonic() - started
    record = tuner._record()
    store = tuner.estimator.store()
    node_seconds = 0.0
    spans = []  # (nodes, started, ended, accuracy if it completed)
    for trial in record.trials:
        job = JobStore(store, trial.job).load()
        node_seconds += job.spec.instance_count * (job.duration_s or 0.0)
        if job.started_at and job.ended_at:
            accuracy = trial.objective if trial.state == "Completed" else None
            spans.append(
                (job.spec.instance_count, parse_iso(job.started_at), parse_iso(job.ended_at),
                 accuracy)
            )  # fmt: skip
    best = record.best()
    objectives = [t.objective for t in record.trials if t.state == "Completed"]
    return {
        "strategy": strategy,
        "early_stopping": early or strategy == "Hyperband",
        "seed": seed,
        "tuning_job": record.name,
        "state": record.state,
        "best_accuracy": best.objective if best else None,
        "reached_target": bool(best and best.objective >= TARGET_ACCURACY),
        "node_seconds": round(node_seconds, 1),
        "wall_seconds": round(wall, 1),
        "trials": len(record.trials),
        "pruned": sum(1 for t in record.trials if t.state == "Pruned"),
        "completed_accuracies": objectives,
        "node_seconds_to_target": node_seconds_to(spans, TARGET_ACCURACY),
    }


def node_seconds_to(spans: list[tuple[int, float, float, float | None]], target: float):
    """The node-seconds every trial had spent when a trial first ended at `target` or
    better (None: none did): the cost of reaching the target, trials still running then
    counted up to that moment."""
    reached = sorted(end for _, _, end, acc in spans if acc is not None and acc >= target)
    if not reached:
        return None
    moment = reached[0]
    spent = sum(n * (min(end, moment) - start) for n, start, end, _ in spans if start < moment)
    return round(spent, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--epochs", type=int, default=12, help="each trial's training length")
    p.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="seconds added to each optimizer step: a slower model, whose training (not the "
        "trial's start-up) dominates what a trial costs",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--strategies", nargs="+", default=["Bayesian"])
    args = p.parse_args(argv)
    import os

    home = Path(tempfile.mkdtemp(prefix="trainctl-bench-tuning-"))
    os.environ["TRAINCTL_HOME"] = str(home)
    os.environ.pop("TRAINCTL_STORE", None)
    try:
        runs = _run_all(args)
    finally:
        # (every trial's job has ended with its tuning job: nothing runs from here)
        shutil.rmtree(home, ignore_errors=True)
    _report(args, runs)
    return 0


def _run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for seed in args.seeds:
        for strategy in args.strategies:
            variants = [True] if strategy == "Hyperband" else [False, True]
            for early in variants:
                log(f"tuning: {strategy} early_stopping={early} seed {seed}")
                result = run_one(
                    strategy, early, seed, args.trials, args.parallel, args.epochs, args.step_delay
                )
                brief = {k: v for k, v in result.items() if k != "completed_accuracies"}
                log(f"  {json.dumps(brief)}")
                runs.append(result)
    return runs


def _report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    summary = []
    for strategy in args.strategies:
        for early in (False, True):
            mine = [r for r in runs if r["strategy"] == strategy and r["early_stopping"] == early]
            if not mine:
                continue
            summary.append(
                {
                    "strategy": strategy,
                    "early_stopping": early,
                    "best_accuracy_median": statistics.median(
                        r["best_accuracy"] or 0 for r in mine
                    ),
                    "node_seconds_median": statistics.median(r["node_seconds"] for r in mine),
                    "reached_target": f"{sum(r['reached_target'] for r in mine)}/{len(mine)}",
                    "node_seconds_to_target_median": _median_or_none(
                        [r["node_seconds_to_target"] for r in mine]
                    ),
                    "pruned_median": statistics.median(r["pruned"] for r in mine),
                }
            )
    out = {"machine": machine_info(), "trials": args.trials, "parallel": args.parallel,
           "epochs": args.epochs, "step_delay": args.step_delay,
           "target_accuracy": TARGET_ACCURACY, "runs": runs, "summary": summary}  # fmt: skip
    (BENCH_DIR / "tuning-results.json").write_text(json.dumps(out, indent=2))
    print("| strategy | early stopping | best held-out accuracy (median) | node-seconds (median) "
          "| reached 0.97 | node-seconds to 0.97 (median of those that did) "
          "| pruned trials |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in summary:
        to_target = row["node_seconds_to_target_median"]
        print(f"| {row['strategy']} | {'yes' if row['early_stopping'] else 'no'} | "
              f"{row['best_accuracy_median']:.4f} | {row['node_seconds_median']:.0f} | "
              f"{row['reached_target']} | {'-' if to_target is None else f'{to_target:.0f}'} | "
              f"{row['pruned_median']:g} |")  # fmt: skip


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


if __name__ == "__main__":
    raise SystemExit(main())
