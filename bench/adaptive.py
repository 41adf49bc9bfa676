"""Adaptive vs fixed batch size: optimizer steps and wall time to a target accuracy.

The task is real and small: scikit-learn's digits (1,536 training and 261 held-out images),
an MLP of 64-512-512-10 (300 k parameters) with SGD and momentum, one worker
(torch.set_num_threads(1)), trained in this process. Four ways, interleaved per seed so
the machine's noise hits them alike:

- fixed small: batch 16 at the tuned learning rate 0.05 (the baseline);
- fixed large: batch 512 with the linear scaling rule (lr 0.05 * 512/16 = 1.6) and a
  linear warmup over the first 20 steps (Goyal et al.);
- fixed large, unscaled: batch 512 at lr 0.05;
- adaptive: trainctl.train.AdaptiveBatch from batch 16 (lr 0.05) up to 512, learning rate
  scaled by AdaScale's gain, batch re-chosen every 10 steps.

Each run stops at the first held-out evaluation (every step) at or above the target
accuracy, or after --max-epochs. Printed: per method the median steps and seconds to the
target with their spread, and the ratios against the fixed small batch.

    python -m bench.adaptive [--seeds 0,1,2,3,4] [--target 0.97]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from bench.common import BENCH_DIR, log, summary

BASE, LARGE, LR, HIDDEN = 16, 512, 0.05, 512


def _data() -> tuple[Any, ...]:
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = torch.from_numpy(np.asarray(X, dtype=np.float32) / 16.0)
    y = torch.from_numpy(np.asarray(y, dtype=np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    train, test = order[:1536], order[1536:]
    return X[train], y[train], X[test], y[test]


def run(method: str, seed: int, target: float, max_epochs: int, data: tuple[Any, ...]):
    import torch
    import torch.nn.functional as F

    from trainctl.train import AdaptiveBatch, GlobalBatchSampler, linear_warmup_scheduler

    X_tr, y_tr, X_te, y_te = data
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 10),
    )
    lr = LR * LARGE / BASE if method == "fixed-large" else LR  # the linear scaling rule
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = linear_warmup_scheduler(opt, 20) if method == "fixed-large" else None
    if method == "adaptive":
        sampler: Any = AdaptiveBatch(
            model,
            opt,
            len(y_tr),
            base_batch_size=BASE,
            max_batch_size=LARGE,
            adapt_every=10,
            smoothing=0.9,
            seed=seed,
            num_replicas=1,
            rank=0,
        )
    else:
        size = BASE if method == "fixed-small" else LARGE
        sampler = GlobalBatchSampler(len(y_tr), size, seed=seed, num_replicas=1, rank=0)

    def accuracy() -> float:
        with torch.no_grad():
            return float((model(X_te).argmax(1) == y_te).float().mean())

    started, steps, samples = time.perf_counter(), 0, 0
    for epoch in range(max_epochs):
        sampler.set_epoch(epoch)
        for step in sampler:
            for micro in step.micro_batches:
                context = (
                    sampler.accumulate(micro) if method == "adaptive" else contextlib.nullcontext()
                )
                with context:
                    idx = torch.tensor(micro.indices)
                    (F.cross_entropy(model(X_tr[idx]), y_tr[idx]) * micro.loss_scale).backward()
            if method == "adaptive":
                sampler.step()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
                sampler.advance(step)
                if scheduler is not None:
                    scheduler.step()
            steps += 1
            samples += step.global_size
            if accuracy() >= target:
                seconds = time.perf_counter() - started
                final = getattr(sampler, "global_batch_size", None)
                return {
                    "steps": steps,
                    "seconds": seconds,
                    "samples": samples,
                    "epochs": samples / len(y_tr),
                    "final_batch": final,
                }
    return {
        "steps": None,
        "seconds": None,
        "samples": samples,
        "epochs": max_epochs,
        "final_batch": None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-epochs", type=int, default=60)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    data = _data()
    methods = ["fixed-small", "fixed-large", "fixed-large-unscaled", "adaptive"]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in (int(s) for s in args.seeds.split(",")):
        for method in methods:  # interleaved: each seed runs all three back to back
            result = run(method, seed, args.target, args.max_epochs, data)
            log(f"seed {seed} {method}: {result}")
            runs[method].append(result)

    def stat(method: str, key: str) -> dict[str, Any]:
        return summary([r[key] for r in runs[method] if r[key] is not None])

    base_steps = stat("fixed-small", "steps")["median"]
    base_seconds = stat("fixed-small", "seconds")["median"]
    table = {}
    print(
        f"to {args.target:.0%} held-out accuracy on digits (median [min-max] over seeds "
        f"{args.seeds}):"
    )
    for method in methods:
        steps, seconds = stat(method, "steps"), stat(method, "seconds")
        reached = sum(r["steps"] is not None for r in runs[method])
        row = {
            "steps": steps,
            "seconds": seconds,
            "reached": reached,
            "epochs": stat(method, "epochs"),
            "final_batch": stat(method, "final_batch"),
        }
        if steps["median"] and base_steps:
            row["steps_ratio"] = steps["median"] / base_steps
            row["seconds_ratio"] = seconds["median"] / base_seconds
            # paired per seed: the spread of the ratio
            pairs = [
                (r["seconds"] / b["seconds"])
                for r, b in zip(runs[method], runs["fixed-small"], strict=True)
                if r["seconds"] and b["seconds"]
            ]
            row["seconds_ratio_spread"] = [min(pairs), max(pairs)] if pairs else None
        table[method] = row
        spread = row.get("seconds_ratio_spread") or [None, None]
        print(
            f"  {method:20s} reached {reached}/{len(runs[method])}  "
            f"steps {steps['median']} [{steps['min']}-{steps['max']}]  "
            f"seconds {_f(seconds['median'])} [{_f(seconds['min'])}-{_f(seconds['max'])}]  "
            f"epochs {_f(row['epochs']['median'])}  "
            f"vs fixed small: steps x{_f(row.get('steps_ratio'))}, "
            f"time x{_f(row.get('seconds_ratio'))} [{_f(spread[0])}-{_f(spread[1])}]"
        )
    out = BENCH_DIR / "adaptive-results.json"
    out.write_text(json.dumps({"target": args.target, "methods": table, "runs": runs}, indent=2))
    log(f"wrote {out}")
    return 0


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
