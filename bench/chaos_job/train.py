"""The soak's job (bench/chaos.py): training whose result does not depend on how many nodes
ran it, bit for bit, so that a schedule with an elastic shrink can be checked against an
uninterrupted run like any other.

Each step's global batch (GLOBAL samples of a fixed permutation per epoch) is cut into
SHARDS fixed micro-batches; shard s belongs to rank s % world. A rank computes the gradient
of each shard it owns on its own, into row s of a [SHARDS, parameters] buffer (zeros in the
rows it does not own), the ranks sum the buffer (x + 0 == x exactly), and every rank adds
the rows in the order 0..SHARDS-1: the same bits on 1 node or 2. SGD with momentum (state
that must come back), checkpoints through trainctl.train.Checkpointer every
--checkpoint-every steps and at a notice (PreemptionFlag), report_step each step.
"""

import argparse
import time

import torch

from trainctl.train import Checkpointer, PreemptionFlag, finish, init_distributed, report_step

SHARDS = 2
GLOBAL = 32
SAMPLES = 1024
FEATURES = 16


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args, _ = parser.parse_known_args()
    return args


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = (x[:, : FEATURES // 2].sum(dim=1) > 0).long()
    return x, y


def main():
    args = parse_args()
    ctx = init_distributed()
    world, rank = ctx.world_size, ctx.rank
    preempt = PreemptionFlag(ctx)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    )
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    ckpt = Checkpointer(keep=3)
    info = ckpt.restore(model=model, optimizer=optimizer)
    step = info.step if info else 0
    x, y = data()
    steps_per_epoch = SAMPLES // GLOBAL
    total = args.epochs * steps_per_epoch
    while step < total:
        epoch, index = divmod(step, steps_per_epoch)
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(1000 + epoch))
        batch = order[index * GLOBAL : (index + 1) * GLOBAL]
        shards = batch.chunk(SHARDS)
        rows = torch.zeros(SHARDS, sum(sizes))
        for s in range(rank, SHARDS, world):
            for p in params:
                p.grad = None
            loss = torch.nn.functional.cross_entropy(model(x[shards[s]]), y[shards[s]])
            loss.backward()
            rows[s] = torch.cat([p.grad.reshape(-1) for p in params])
        if world > 1:
            torch.distributed.all_reduce(rows)
        total_grad = rows[0].clone()
        for s in range(1, SHARDS):
            total_grad += rows[s]
        total_grad /= SHARDS
        for p, g in zip(params, total_grad.split(sizes), strict=True):
            p.grad = g.reshape(p.shape).clone()
        optimizer.step()
        step += 1
        report_step(step, min_interval=0.0)
        time.sleep(args.step_delay)
        if preempt.should_stop():
            ckpt.save(step, model=model, optimizer=optimizer, epoch=epoch)
            preempt.exit(step)
        if step % args.checkpoint_every == 0:
            ckpt.save(step, model=model, optimizer=optimizer, epoch=epoch)
    ckpt.wait()
    if ctx.is_chief:
        torch.save(model.state_dict(), ctx.model_dir / "model.pt")
    finish()


if __name__ == "__main__":
    main()
