"""Train a small MLP on the scikit-learn digits data set with DistributedDataParallel.

Works unchanged as:
  * a plain single process:  ``python train.py``
  * under torchrun (one or many nodes): ``torchrun --nnodes 2 --nproc-per-node 1 ... train.py``
  * under trainctl, which launches torchrun and sets the SageMaker-style environment
    (SM_MODEL_DIR, SM_CHANNEL_TRAIN, SM_OUTPUT_DATA_DIR).

Hyperparameters arrive as command-line arguments (``--epochs 8 --lr 0.1 ...``).
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
from torch.utils.data.distributed import DistributedSampler


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
    args, unknown = p.parse_known_args(argv)
    return args, unknown


def log(msg, rank=0, only_rank0=True):
    if not only_rank0 or rank == 0:
        print(msg, flush=True)


# --------------------------------------------------------------------------- setup


def setup_distributed():
    """Return (rank, world_size, local_rank, device, distributed)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = world_size > 1

    if torch.cuda.is_available():
        # Needed by torch.use_deterministic_algorithms with cuBLAS.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"

    if distributed:
        # RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT come from torchrun.
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
        rank = dist.get_rank()
        world_size = dist.get_world_size()
    return rank, world_size, local_rank, device, distributed


# --------------------------------------------------------------------------- data


def load_data(seed):
    """Return (X_train, X_test, y_train, y_test) as numpy arrays, features scaled to [0, 1]."""
    from sklearn.model_selection import train_test_split

    X = y = None
    channel = os.environ.get("SM_CHANNEL_TRAIN")
    if channel:
        path = os.path.join(channel, "digits.npz")
        if os.path.isfile(path):
            with np.load(path) as data:
                X, y = data["X"], data["y"]
    source = "SM_CHANNEL_TRAIN/digits.npz"
    if X is None:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        source = "sklearn.datasets.load_digits"

    X = np.asarray(X, dtype=np.float32) / 16.0
    y = np.asarray(y, dtype=np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    return X_tr, X_te, y_tr, y_te, source


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


# --------------------------------------------------------------------------- train / eval


def train_one_epoch(model, loader, optimizer, device, distributed):
    """One pass over this worker's shard. Returns (mean loss, accuracy) over all workers."""
    model.train()
    # [sum of losses, number correct, number of samples] on this worker
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()  # DDP averages gradients across workers here
        optimizer.step()
        stats[0] += loss.detach().double() * yb.numel()
        stats[1] += (logits.argmax(1) == yb).sum()
        stats[2] += yb.numel()
    if distributed:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()


@torch.no_grad()
def evaluate(model, X, y, device):
    model.eval()
    X, y = X.to(device), y.to(device)
    logits = model(X)
    loss = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).double().mean().item()
    return loss, acc


# --------------------------------------------------------------------------- main


def main(argv=None):
    args, unknown = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    rank, world_size, local_rank, device, distributed = setup_distributed()
    log(f"rank {rank}/{world_size} on {socket.gethostname()} starting", rank, only_rank0=False)
    if unknown:
        log(f"ignoring unknown arguments: {unknown}", rank)
    log(f"hyperparameters: {vars(args)} device={device} distributed={distributed}", rank)

    model_dir = os.environ.get("SM_MODEL_DIR", "./model")
    output_dir = os.environ.get("SM_OUTPUT_DATA_DIR")

    X_tr, X_te, y_tr, y_te, source = load_data(args.seed)
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    log(
        f"data: {source} train={len(y_tr)} test={len(y_te)} "
        f"features={X_tr.shape[1]} classes={num_classes}",
        rank,
    )

    train_ds = TensorDataset(torch.from_numpy(X_tr), torch.from_numpy(y_tr))
    X_test, y_test = torch.from_numpy(X_te), torch.from_numpy(y_te)
    sampler = DistributedSampler(
        train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)
    model = MLP(X_tr.shape[1], args.hidden, num_classes).to(device)
    ddp_model = (
        DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        if distributed
        else model
    )
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    # Training state kept in plain variables so checkpoint/resume can be added later:
    # (model.state_dict(), optimizer.state_dict(), start_epoch) is all that is needed.
    start_epoch = 0
    t0 = time.time()
    train_loss = train_acc = float("nan")
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        train_loss, train_acc = train_one_epoch(ddp_model, loader, optimizer, device, distributed)
        log(
            f"epoch {epoch + 1}/{args.epochs} loss={train_loss:.4f} train_acc={train_acc:.4f}", rank
        )
    train_time = time.time() - t0

    if rank == 0:
        test_loss, test_acc = evaluate(model, X_test, y_test, device)
        log(f"test_loss={test_loss:.4f}", rank)
        log(f"test_accuracy={test_acc:.4f}", rank)

        os.makedirs(model_dir, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        torch.save(state, os.path.join(model_dir, "model.pt"))
        log(f"saved model to {os.path.join(model_dir, 'model.pt')}", rank)

        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            metrics = {
                "test_accuracy": test_acc,
                "test_loss": test_loss,
                "train_loss": train_loss,
                "train_accuracy": train_acc,
                "epochs": args.epochs,
                "world_size": world_size,
                "train_seconds": round(train_time, 3),
            }
            with open(os.path.join(output_dir, "metrics.json"), "w") as f:
                json.dump(metrics, f, indent=2)

    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
