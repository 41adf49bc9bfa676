"""What only a GPU machine can show: NCCL, CUDA memory and CUDA's generators. Every test
here skips with its reason where CUDA is absent (CI has no GPU); `make test-gpu` runs the
tier where it is. The split of GPUs between local nodes without a GPU: tests/e2e/test_gpus.py."""

from __future__ import annotations

import itertools
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.helpers import EXAMPLES, TRAINCTL  # noqa: E402
from trainctl import Estimator  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="no CUDA device on this machine"),
]
TORCHRUN = {"torch_distributed": {"enabled": True}}


def _accuracy(text: str) -> float:
    lines = [line for line in text.splitlines() if "test_accuracy=" in line]
    assert lines, text[-2000:]
    return float(lines[-1].split("test_accuracy=")[1].split()[0])


@pytest.mark.timeout(300)
def test_digits_trains_on_nccl_with_a_worker_per_gpu(home, capsys):
    """One local node with every GPU: a worker per GPU (the default), NCCL between them."""
    job = Estimator(
        entry_point="train.py",
        source_dir=str(EXAMPLES / "digits"),
        hyperparameters={"epochs": 12, "lr": 0.1, "seed": 0},
        distribution=TORCHRUN,
    ).fit(logs=True)
    console = capsys.readouterr().out
    info = job.describe()
    assert info["state"] == "Completed", info
    assert "device=cuda" in console
    assert f"rank 0/{GPUS}" in console  # world size: one worker per GPU
    assert _accuracy(console) >= 0.95


@pytest.mark.timeout(300)
@pytest.mark.skipif(GPUS == 1, reason="needs 2 GPUs to give 2 local nodes one each")
def test_two_local_nodes_train_each_on_its_own_gpus(home, capsys):
    job = Estimator(
        entry_point="train.py",
        source_dir=str(EXAMPLES / "digits"),
        instance_count=2,
        hyperparameters={"epochs": 12, "lr": 0.1, "seed": 0},
        distribution=TORCHRUN,
    ).fit(logs=True)
    console = capsys.readouterr().out
    assert job.describe()["state"] == "Completed"
    per_node = GPUS // 2
    assert f"rank 0/{2 * per_node}" in console
    logs = [job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{r}.log") for r in (0, 1)]
    shares = [
        log.split('"SM_NUM_GPUS": "')[1].split('"')[0] for log in logs if "SM_NUM_GPUS" in log
    ]
    assert all(share == str(per_node) for share in shares), shares
    assert _accuracy(console) >= 0.95


@pytest.mark.timeout(120)
def test_async_checkpoint_from_gpu_memory_resumes_bit_exact(tmp_path: Path):
    """A CUDA-resident model and Adam state saved in the background (pinned host buffers),
    restored into fresh objects: parameters, optimizer state and CUDA's generator continue
    exactly as an uninterrupted run does."""
    from trainctl.train import Checkpointer, TrainContext

    device = torch.device("cuda", 0)
    ctx = TrainContext(checkpoint_dir=tmp_path / "ckpt", device=device)

    def make(seed: int):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
        ).to(device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def train(model, opt, steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(64, 256, device=device) + random.random() + float(np.random.rand())
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    ckpt = Checkpointer(keep=2, ctx=ctx, async_save=True)
    model, opt = make(0)
    train(model, opt, 5)
    ckpt.save(5, model=model, optimizer=opt)
    ckpt.wait()
    # What an uninterrupted run does next.
    train(model, opt, 5)
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    draw = torch.rand(4, device=device)

    # A fresh process: same construction, other randomness consumed meanwhile.
    torch.manual_seed(123)
    torch.cuda.manual_seed_all(123)
    random.seed(123)
    np.random.seed(123)
    fresh, fresh_opt = make(42)
    info = ckpt.restore(model=fresh, optimizer=fresh_opt)
    assert info is not None and info.step == 5
    assert all(t.is_cuda for t in fresh.state_dict().values())
    train(fresh, fresh_opt, 5)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert torch.equal(torch.rand(4, device=device), draw)  # CUDA's generator went on too


@pytest.mark.timeout(120)
def test_adaptive_batch_adapts_on_cuda(monkeypatch):
    """AdaptiveBatch's gradient-noise estimate and batch choice, with the model and the
    gradients in GPU memory."""
    from trainctl.train.adaptive import AdaptiveBatch

    ticks = itertools.count()
    monkeypatch.setattr("trainctl.train.adaptive._clock", lambda: next(ticks) / 1000)
    device = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20000, 32, generator=g)
    Y = X @ torch.randn(32, 1, generator=g) + 0.5 * torch.randn(20000, 1, generator=g)
    X, Y = X.to(device), Y.to(device)
    model = torch.nn.Linear(32, 1, bias=False).to(device)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    adaptive = AdaptiveBatch(
        model, opt, len(Y), base_batch_size=16, max_batch_size=1024, adapt_every=10,
        smoothing=0.9, num_replicas=1, rank=0,
    )  # fmt: skip
    while adaptive.steps < 200:
        if adaptive.sampler.position >= adaptive.sampler.usable:
            adaptive.set_epoch(adaptive.epoch + 1)
        for step in adaptive:
            for micro in step.micro_batches:
                with adaptive.accumulate(micro):
                    i = torch.tensor(micro.indices, device=device)
                    loss = torch.nn.functional.mse_loss(model(X[i]), Y[i]) * micro.loss_scale
                    loss.backward()
            adaptive.step()
            if adaptive.steps >= 200:
                break
    sizes = [size for _, size in adaptive.history]
    assert max(sizes) >= 256, adaptive.history
    assert adaptive.noise.value is not None and adaptive.noise.value > 0


@pytest.mark.timeout(400)
def test_diagnose_measures_a_gpu_job(home):
    job = Estimator(
        "train.py",
        source_dir=str(EXAMPLES / "digits"),
        distribution=TORCHRUN,
        hyperparameters={"epochs": 1, "checkpoint-every": 4},
    ).fit(logs=False)
    done = subprocess.run(
        [TRAINCTL, "diagnose", job.name, "--steps", "8", "--warmup", "2", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr
    assert "ms/step" in done.stderr + done.stdout
