"""Benchmark workload: a DDP MLP on synthetic data, written with trainctl.train.

Runs unchanged under a bare torchrun (no SM_* variables: checkpoints go to ./checkpoints or
--checkpoint-dir) and under trainctl (SM_CHECKPOINT_DIR, synced to the store by the agent).

Global rank 0 prints machine-readable lines, one JSON object each:

    BENCH {"event": "start", "t": ...}                 process start (before importing torch)
    BENCH {"event": "imported", "t": ...}              torch imported
    BENCH {"event": "joined", "t": ...}                the process group formed
    BENCH {"event": "built", "t": ...}                 the data, model, DDP and optimizer made
    BENCH {"event": "ready", "t": ..., "step": S}      model built, checkpoint restored
    BENCH {"event": "first_step", "t": ..., "step": S} first optimizer step of this process
    BENCH {"event": "step", "t": ..., "step": S, ...}  every --log-every steps (log streaming)
    BENCH {"event": "ckpt", "step": S, "stall": s}     seconds the loop was blocked in save()
    BENCH {"event": "done", "steps_per_s": ...}        steady-state rate over [warmup, steps],
                                                       with samples/s and model TFLOP/s

`t` is time.time() (wall clock), so lines from different processes compare directly.
"""

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T_IMPORTED = time.time()
T_JOINED = None
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainctl.train import (  # noqa: E402
    Checkpointer,
    PreemptionFlag,
    ResumableDistributedSampler,
    init_distributed,
    report_step,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="trainctl benchmark workload")
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    p.add_argument("--warmup", type=int, default=30, help="steps left out of the rate")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--in-features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--layers", type=int, default=2, help="hidden x hidden layers")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=8192, help="synthetic data set size")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: never (but on SIGTERM)")
    p.add_argument("--checkpoint-dir", default=None, help="default: SM_CHECKPOINT_DIR")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept per node")
    p.add_argument("--log-every", type=int, default=1, help="0: no per-step lines")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep after each step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-on-device", type=int, default=0, help="1: the data set lives on the GPU")
    args, _ = p.parse_known_args(argv)
    return args


def build_model(args):
    layers = [nn.Linear(args.in_features, args.hidden), nn.ReLU()]
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    layers.append(nn.Linear(args.hidden, args.classes))
    return nn.Sequential(*layers)


def synthetic_data(args):
    """A deterministic, learnable classification task (no downloads)."""
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.in_features, generator=g)
    w = torch.randn(args.in_features, args.classes, generator=g)
    y = (x @ w).argmax(1)
    return TensorDataset(x, y)


class DeviceBatches:
    """The data set in GPU memory, batched by the sampler's indices each epoch: no copy from
    the host and no collate in the loop, so the figure measures training."""

    def __init__(self, data, sampler, batch_size, device):
        self.features, self.labels = (t.to(device) for t in data.tensors)
        self.sampler, self.batch_size, self.device = sampler, batch_size, device

    def __iter__(self):
        batches = torch.utils.data.BatchSampler(self.sampler, self.batch_size, drop_last=True)
        for batch in batches:
            idx = torch.tensor(batch, device=self.device)
            yield self.features[idx], self.labels[idx]


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    preempt = PreemptionFlag()
    ctx = init_distributed()
    global T_JOINED
    T_JOINED = time.time()
    rank = ctx.rank

    def bench(event, **fields):
        if rank == 0:
            line = json.dumps({"event": event, "t": time.time(), **fields})
            sys.stdout.write(f"BENCH {line}\n")
            sys.stdout.flush()

    bench("start", t=T_START)
    # where a restart's time goes before the restore: torch imported, the process group up
    bench("imported", t=T_IMPORTED)
    bench("joined", t=T_JOINED)
    data = synthetic_data(args)
    sampler = ResumableDistributedSampler(data, seed=args.seed)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator(),
    )
    on_gpu = ctx.device.type == "cuda"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = True  # as GPU training runs its matmuls
        torch.backends.cudnn.allow_tf32 = True
    if on_gpu and args.data_on_device:
        # Batches indexed on the device: no host-to-device copy, no collate in the loop.
        loader = DeviceBatches(data, sampler, args.batch_size, ctx.device)
    torch.manual_seed(args.seed)
    model = build_model(args).to(ctx.device)
    ddp = DDP(model) if ctx.is_distributed else model
    if args.optimizer == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    bench("built")  # the data, the model, DDP and the optimizer
    ckpt = Checkpointer(args.checkpoint_dir, keep=args.keep, ctx=ctx)
    info = ckpt.restore(model=ddp, optimizer=opt, sampler=sampler)
    step, epoch = (info.step, info.epoch) if info else (0, 0)
    start_step = step
    params = sum(p.numel() for p in model.parameters())
    bench("ready", step=step, params=params, world=ctx.world_size)

    def save():
        started = time.perf_counter()
        ckpt.save(step, model=ddp, optimizer=opt, sampler=sampler, epoch=epoch)
        bench("ckpt", step=step, stall=time.perf_counter() - started)

    t_window = None
    ddp.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb, yb = xb.to(ctx.device, non_blocking=True), yb.to(ctx.device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            sampler.advance(len(yb))
            report_step(step)
            if step == start_step + 1:
                bench("first_step", step=step)
            if args.log_every and step % args.log_every == 0:
                bench("step", step=step, loss=round(loss.item(), 5))
            if args.step_delay:
                time.sleep(args.step_delay)
            if preempt.should_stop():
                save()
                bench("preempted", step=step)
                preempt.exit(step)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save()
            if step == start_step + args.warmup:
                if on_gpu:
                    torch.cuda.synchronize()
                t_window = (step, time.time())
            if step >= args.steps:
                break
        else:
            epoch += 1
    if t_window is not None and step > t_window[0]:
        if on_gpu:
            torch.cuda.synchronize()  # the window's steps are done, not only queued
        elapsed = time.time() - t_window[1]
        steps_per_s = (step - t_window[0]) / elapsed
        samples_per_s = steps_per_s * args.batch_size * ctx.world_size
        # A dense model's training FLOPs: ~6 per parameter per sample (forward and backward).
        bench(
            "done",
            step=step,
            window=step - t_window[0],
            steps_per_s=steps_per_s,
            samples_per_s=samples_per_s,
            model_tflops=6 * params * samples_per_s / 1e12,
            device=torch.cuda.get_device_name(ctx.device) if on_gpu else "cpu",
            world=ctx.world_size,
        )
    else:
        bench("done", step=step, window=0, steps_per_s=None)
    if ctx.is_distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
