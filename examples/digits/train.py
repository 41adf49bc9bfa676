"""Train a small MLP on the scikit-learn digits data set with DistributedDataParallel.

Works unchanged as:
  * a plain single process:  ``python train.py``
  * under torchrun (one or many nodes): ``torchrun --nnodes 2 --nproc-per-node 1 ... train.py``
  * under trainctl, which launches torchrun and sets the SageMaker-style environment
    (SM_MODEL_DIR, SM_CHECKPOINT_DIR, SM_CHANNEL_TRAIN, SM_OUTPUT_DATA_DIR).

Hyperparameters arrive as command-line arguments (``--epochs 8 --lr 0.1 ...``).

Training survives interruptions bit-exactly (through ``trainctl.train``): it checkpoints every
``--checkpoint-every`` steps into SM_CHECKPOINT_DIR (default ./checkpoints), saves an emergency
checkpoint and exits with code 85 on SIGTERM, and on start resumes from the newest complete
checkpoint, at the exact step and sample of the epoch. An interrupted and resumed run ends
with a model.pt identical, tensor for tensor, to the uninterrupted run's.
"""

import argparse
import json
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from trainctl.train import (
    Checkpointer,
    PreemptionFlag,
    ResumableDistributedSampler,
    batches,
    finish,
    init_distributed,
    report_step,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP MLP on sklearn digits")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=32,
        help="per-worker batch size",
    )
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--checkpoint-every",
        "--checkpoint_every",
        dest="checkpoint_every",
        type=int,
        default=10,
        help="checkpoint every N optimizer steps (0: at the end of each epoch; <0: only on "
        "SIGTERM)",
    )
    p.add_argument(
        "--keep-checkpoints",
        "--keep_checkpoints",
        dest="keep_checkpoints",
        type=int,
        default=3,
        help="checkpoints kept on each node",
    )
    p.add_argument(
        "--step-delay",
        "--step_delay",
        dest="step_delay",
        type=float,
        default=0.0,
        help="seconds to sleep after each optimizer step (to test interruptions)",
    )
    args, unknown = p.parse_known_args(argv)
    return args, unknown


def log(msg, rank=0, only_rank0=True):
    if not only_rank0 or rank == 0:
        print(msg, flush=True)


# --------------------------------------------------------------------------- data


def load_data(seed):
    """Return (X_train, X_test, y_train, y_test) as numpy arrays, features scaled to [0, 1]."""
    X = y = None
    channel = os.environ.get("SM_CHANNEL_TRAIN")
    if channel:
        path = os.path.join(channel, "digits.npz")
        if os.path.isfile(path):
            with np.load(path) as data:
                X, y = data["X"], data["y"]
    source = "SM_CHANNEL_TRAIN/digits.npz"
    if X is None:
        X, y = load_digits()
        source = "sklearn.datasets.load_digits"

    X = np.asarray(X, dtype=np.float32) / 16.0
    y = np.asarray(y, dtype=np.int64)
    X_tr, X_te, y_tr, y_te = stratified_split(X, y, test_size=0.2, seed=seed)
    return X_tr, X_te, y_tr, y_te, source


def load_digits():
    """scikit-learn's digits (1,797 8x8 images), read from the data file it ships: the same
    arrays as sklearn.datasets.load_digits, without importing scikit-learn, whose import
    costs every worker process about a second of CPU at each start."""
    import importlib.util

    found = importlib.util.find_spec("sklearn")  # (finds the package; imports nothing)
    if found is None or found.origin is None:
        raise SystemExit("the digits data comes with scikit-learn: pip install scikit-learn")
    path = os.path.join(os.path.dirname(found.origin), "datasets", "data", "digits.csv.gz")
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def stratified_split(X, y, *, test_size, seed):
    """A seeded split keeping each class's share in both parts (as train_test_split's
    stratify does)."""
    rng = np.random.default_rng(seed)
    test = []
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        test.extend(members[: round(len(members) * test_size)])
    is_test = np.zeros(len(y), dtype=bool)
    is_test[test] = True
    train_idx, test_idx = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    train_idx, test_idx = rng.permutation(train_idx), rng.permutation(test_idx)
    return X[train_idx], X[test_idx], y[train_idx], y[test_idx]


# --------------------------------------------------------------------------- model


class MLP(nn.Module):
    def __init__(self, in_features, hidden, num_classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def evaluate(model, X, y, device):
    model.eval()
    X, y = X.to(device), y.to(device)
    logits = model(X)
    loss = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).double().mean().item()
    return loss, acc


def global_stats(stats, distributed):
    """[sum of losses, number correct, number of samples] summed over all workers."""
    stats = stats.clone()
    if distributed:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return stats


# --------------------------------------------------------------------------- main


def main(argv=None):
    args, unknown = parse_args(argv)
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        # Bit-identical resumes on a GPU need deterministic kernels (and cuBLAS a fixed
        # workspace). On the CPU this model's kernels are deterministic already, and the call
        # costs every process ~1.3 s of CPU: it imports torch._inductor to set one flag.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)

    # From here on SIGTERM means "stop at the next step": checkpoint there and exit with 85.
    preempt = PreemptionFlag()
    # Process group (gloo on CPU, nccl on CUDA) when WORLD_SIZE > 1.
    ctx = init_distributed()
    rank, device, distributed = ctx.rank, ctx.device, ctx.is_distributed
    log(f"rank {rank}/{ctx.world_size} on {socket.gethostname()} starting", rank, only_rank0=False)
    if unknown:
        log(f"ignoring unknown arguments: {unknown}", rank)
    log(f"hyperparameters: {vars(args)} device={device} distributed={distributed}", rank)

    X_tr, X_te, y_tr, y_te, source = load_data(args.seed)
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    log(
        f"data: {source} train={len(y_tr)} test={len(y_te)} "
        f"features={X_tr.shape[1]} classes={num_classes}",
        rank,
    )

    train_ds = TensorDataset(torch.from_numpy(X_tr), torch.from_numpy(y_tr))
    X_test, y_test = torch.from_numpy(X_te), torch.from_numpy(y_te)
    # Same order as torch's DistributedSampler, plus the position inside the epoch.
    sampler = ResumableDistributedSampler(
        train_ds, num_replicas=ctx.world_size, rank=rank, shuffle=True, seed=args.seed
    )
    # Its own generator: starting an epoch's iterator must not draw from the global RNG.
    loader = DataLoader(
        train_ds, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator()
    )
    # A whole epoch's batches, counted before a resume moves the sampler mid-epoch (then
    # len(loader) is what is left of that epoch, not an epoch).
    steps_per_epoch = len(loader)

    torch.manual_seed(args.seed)
    model = MLP(X_tr.shape[1], args.hidden, num_classes).to(device)
    ddp_model = (
        DDP(model, device_ids=[ctx.local_rank] if device.type == "cuda" else None)
        if distributed
        else model
    )
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    # Resume last, right before the loop: it restores the RNG states too. Every rank loads
    # the same model/optimizer state (into the plain model under DDP) and its own position.
    ckpt = Checkpointer(ctx.checkpoint_dir, keep=args.keep_checkpoints, ctx=ctx)
    info = ckpt.restore(model=model, optimizer=optimizer, sampler=sampler)
    step, start_epoch = (info.step, info.epoch) if info else (0, 0)
    # The resumed epoch's running loss/accuracy sums (all workers'), kept on rank 0.
    carried = info.extra.get("epoch_stats") if info and isinstance(info.extra, dict) else None
    last_saved = step if info else None
    if info:
        log(f"resumed from checkpoint step {info.step} (epoch {info.epoch + 1})", rank)

    def save(epoch, stats_all):
        nonlocal last_saved
        ckpt.save(
            step,
            model=model,
            optimizer=optimizer,
            sampler=sampler,
            epoch=epoch,
            extra={"epoch_stats": stats_all.cpu().tolist()},
        )
        last_saved = step

    t0 = time.time()
    train_loss = train_acc = float("nan")
    total = args.epochs * steps_per_epoch  # the work in all: `trainctl status` shows progress
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # keeps the position when this is the resumed epoch
        ddp_model.train()
        # [sum of losses, number correct, number of samples] on this worker
        stats = torch.zeros(3, dtype=torch.float64, device=device)
        if carried is not None and rank == 0:
            stats += torch.tensor(carried, dtype=torch.float64, device=device)
        carried = None
        for xb, yb in batches(loader):  # the loader, timed by `trainctl diagnose`
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad(set_to_none=True)
            logits = ddp_model(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()  # DDP averages gradients across workers here
            optimizer.step()
            stats[0] += loss.detach().double() * yb.numel()
            stats[1] += (logits.argmax(1) == yb).sum()
            stats[2] += yb.numel()

            step += 1
            sampler.advance(yb.shape[0])
            report_step(step, total_steps=total, loss=loss.item())  # loss: `trainctl metrics JOB`
            if args.step_delay > 0:
                time.sleep(args.step_delay)
            if preempt.should_stop():  # SIGTERM on any node: all ranks stop at this step
                save(epoch, global_stats(stats, distributed))
                log(f"preempted: emergency checkpoint at step {step}, exiting", rank)
                preempt.exit(step)
            if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                save(epoch, global_stats(stats, distributed))

        stats = global_stats(stats, distributed)
        if args.checkpoint_every == 0 and step != last_saved:
            save(epoch, stats)
        train_loss, train_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        log(
            f"epoch {epoch + 1}/{args.epochs} loss={train_loss:.4f} train_acc={train_acc:.4f}", rank
        )
        if rank == 0:  # held-out accuracy per epoch: the curve a tuner's early stopping reads
            _, epoch_test_acc = evaluate(model, X_test, y_test, device)
            report_step(step, test_accuracy=round(epoch_test_acc, 6))
    train_time = time.time() - t0

    if rank == 0:
        test_loss, test_acc = evaluate(model, X_test, y_test, device)
        log(f"test_loss={test_loss:.4f}", rank)
        log(f"test_accuracy={test_acc:.4f}", rank)

        model_dir = ctx.model_dir
        os.makedirs(model_dir, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        path = os.path.join(model_dir, "model.pt")
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        log(f"saved model to {path}", rank)

        output_dir = os.environ.get("SM_OUTPUT_DATA_DIR")
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            metrics = {
                "test_accuracy": test_acc,
                "test_loss": test_loss,
                "train_loss": train_loss,
                "train_accuracy": train_acc,
                "epochs": args.epochs,
                "world_size": ctx.world_size,
                "steps": step,
                "resumed_from_step": info.step if info else None,
                "train_seconds": round(train_time, 3),
            }
            with open(os.path.join(output_dir, "metrics.json"), "w") as f:
                json.dump(metrics, f, indent=2)


if __name__ == "__main__":
    main()
    # Barrier, flush, exit: skips process-group destructors that can hang at exit (finish.py).
    finish(0)
