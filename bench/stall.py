"""Training stall per checkpoint: Checkpointer.save vs. a plain torch.save of the same state.

Both write the workload's model + Adam state (~110 MB) to local disk from the same process,
interleaved, with the page cache flushed (os.sync) before each timed save so that one
save's dirty pages are not charged to the next. The figure is the default, asynchronous
save (the loop waits for a copy of the state in memory; the write is background work,
finished and untimed before the next timed save); the in-line save (async_save=False) is
measured alongside, with a breakdown of where its time goes. Run in a subprocess of its own:

    python -m bench.stall --reps 5 --dir /tmp/x     # prints one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PYTHON, REPO, TOPOLOGY, WORKLOAD_ARGS, hp_args, log, ratio_figure

GOAL = 0.2


_before_save: Any = None  # a training step, run right before each timed save


def _timed(fn) -> float:
    os.sync()
    time.sleep(0.2)
    if _before_save is not None:
        # As in a training loop, the save comes right after a step: the cores are busy and
        # warm, not waking from the idle sleep above (which alone made saves 2-4x slower
        # on this VM, baseline and trainctl alike).
        _before_save()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _breakdown(ckpt: Any, reps: int, save: Any) -> dict[str, float]:
    """Where Checkpointer.save's blocking time goes: median ms per save, by part."""
    import torch

    import trainctl.train.checkpoint as module

    parts: dict[str, float] = {}

    def wrap(owner: Any, name: str, label: str) -> Any:
        real = getattr(owner, name)

        def timed(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)
        return real

    patched = [
        (torch, "save", wrap(torch, "save", "torch.save")),
        (module, "_rng_state", wrap(module, "_rng_state", "rng state")),
    ]
    samples: dict[str, list[float]] = {}
    try:
        for i in range(1000, 1000 + reps):
            ckpt.wait()  # the background fsyncs and pruning are not part of the stall
            parts.clear()
            total = _timed(lambda i=i: save(i))
            parts["other (mkdir, meta.json, rename, thread start)"] = total - sum(parts.values())
            parts["total"] = total
            for key, value in parts.items():
                samples.setdefault(key, []).append(value * 1000)
    finally:
        for owner, name, real in patched:
            setattr(owner, name, real)
    return {key: round(statistics.median(v), 2) for key, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cpu", help="cuda: the model and Adam state in GPU memory")
    args = p.parse_args(argv)
    for key in [k for k in os.environ if k.startswith(("TRAINCTL_JOB", "SM_"))]:
        del os.environ[key]  # a plain process: no control messages, ./checkpoints layout

    import torch
    import torch.nn.functional as F

    from bench.workload import build_model, synthetic_data
    from bench.workload import parse_args as workload_args
    from trainctl.train import Checkpointer, ResumableDistributedSampler, context

    torch.set_num_threads(1)
    wargs = workload_args(hp_args(WORKLOAD_ARGS))
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(wargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = synthetic_data(wargs)
    sampler = ResumableDistributedSampler(data, num_replicas=1, rank=0, seed=0)

    def train_step(i: int = 0) -> None:
        xb, yb = (t.to(device) for t in data[i * 32 : (i + 1) * 32])
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step is done: its kernels are not the save's

    for i in range(2):  # Adam's moments exist from the first step on
        train_step(i)
    global _before_save
    _before_save = train_step

    root = Path(args.dir)
    plain_dir = root / "plain"
    plain_dir.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(root / "ckpt", keep=2, ctx=context(), async_save=True)
    inline = Checkpointer(root / "inline", keep=2, ctx=context(), async_save=False)

    def plain_save(i: int) -> None:
        state = {
            "step": i,
            "epoch": 0,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": None,
            "scaler": None,
            "extra": None,
            "world_size": 1,
        }
        torch.save(state, plain_dir / f"state-{i}.pt")

    def trainctl_save(i: int) -> None:
        ckpt.save(i, model=model, optimizer=opt, sampler=sampler)

    def inline_save(i: int) -> None:
        inline.save(i, model=model, optimizer=opt, sampler=sampler)

    plain_save(0)  # warm-up (allocator, page cache, torch.save code paths)
    trainctl_save(0)
    inline_save(0)
    ckpt.wait()
    inline.wait()
    plain: list[float] = []
    tc: list[float] = []
    in_line: list[float] = []
    background: list[float] = []
    for i in range(1, args.reps + 1):
        order = [("plain", plain_save), ("tc", trainctl_save), ("inline", inline_save)]
        if i % 2 == 0:
            order.reverse()
        for name, fn in order:
            dt = _timed(lambda fn=fn, i=i: fn(i))
            if name == "plain":
                plain.append(dt)
            elif name == "inline":
                in_line.append(dt)
                inline.wait()  # its fsyncs and pruning, untimed
            else:
                tc.append(dt)
                # The write the loop did not wait for: untimed for the stall, but finished
                # before the next timed save so it is not charged to it.
                background.append(_timed(ckpt.wait))
        for old in plain_dir.glob("*.pt"):
            old.unlink()
    breakdown = _breakdown(inline, args.reps, lambda i: inline_save(i))
    ckpt.wait()
    latest = ckpt.latest_complete()
    assert latest is not None
    size = sum(f.stat().st_size for f in latest.iterdir())
    print(
        json.dumps(
            {
                "plain": plain,
                "trainctl": tc,
                "background": background,
                "inline": in_line,
                "breakdown_ms": breakdown,
                "checkpoint_bytes": size,
            }
        )
    )
    shutil.rmtree(root, ignore_errors=True)
    return 0


def measure(ctx: Any) -> list[dict[str, Any]]:
    reps = 2 * ctx.reps + 1  # cheap: 7 by default
    out = subprocess.run(
        [
            PYTHON,
            "-m",
            "bench.stall",
            "--reps",
            str(reps),
            "--dir",
            str(ctx.workdir / "stall"),
            "--device",
            "cuda" if TOPOLOGY.gpus else "cpu",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench.stall failed:\n{out.stderr[-3000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    log(
        "stall: torch.save "
        + ", ".join(f"{v:.3f}" for v in data["plain"])
        + " s; Checkpointer.save "
        + ", ".join(f"{v:.3f}" for v in data["trainctl"])
        + " s"
    )
    detail = {
        "from": f"GPU memory ({TOPOLOGY.device})" if TOPOLOGY.gpus else "CPU memory",
        "checkpoint_mb": round(data["checkpoint_bytes"] / 1e6, 1),
        # Diagnostics (medians, ms): the background write after each asynchronous save
        # (serialisation, files, meta.json, fsyncs, pruning: the loop does not wait for it),
        # the in-line save (async_save=False) and where its time goes.
        "background_write_ms": 1000 * statistics.median(data["background"]),
        "inline_save_ms": 1000 * statistics.median(data["inline"]),
        "inline_vs_torch_save": statistics.median(data["inline"])
        / statistics.median(data["plain"]),
        "inline_breakdown_ms": data["breakdown_ms"],
    }
    return [
        ratio_figure(
            "stall",
            "training stall per checkpoint (loop blocked; asynchronous save)",
            "ms",
            "torch.save of the same state to local disk",
            [v * 1000 for v in data["plain"]],
            [v * 1000 for v in data["trainctl"]],
            goal_text=f"<= {GOAL}x",
            goal_max=GOAL,
            detail=detail,
        )
    ]


if __name__ == "__main__":
    sys.exit(main())
