"""Adaptive batch size (trainctl.train.adaptive): the gradient noise scale estimate, the
goodput choice, AdaScale's gain, and a resume that continues where the checkpoint was."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from tests.helpers import FIXTURES, log_lines
from trainctl import Estimator
from trainctl.train.adaptive import AdaptiveBatch, NoiseScale, efficiency, gain

SOURCE = FIXTURES / "adaptive"


@pytest.mark.timeout(30)
def test_noise_scale_estimate_recovers_a_known_scale():
    """Per-sample gradients mu + sigma * eps in d dimensions have noise scale
    d sigma^2 / |mu|^2; the estimate from local (b = 16) and global (B = 64) means finds it."""
    g = torch.Generator().manual_seed(0)
    d, sigma = 50, 2.0
    mu = torch.full((d,), 0.5, dtype=torch.float64)
    true = d * sigma**2 / float(mu @ mu)  # 16
    noise = NoiseScale(smoothing=0.99)
    for _ in range(1500):
        samples = mu + sigma * torch.randn(64, d, generator=g, dtype=torch.float64)
        local = samples.view(4, 16, d).mean(1)
        small = float((local**2).sum(1).mean())
        big = float((samples.mean(0) ** 2).sum())
        noise.update(small, 16, big, 64)
    assert noise.value == pytest.approx(true, rel=0.2)
    assert noise.grad_sqr == pytest.approx(float(mu @ mu), rel=0.2)


@pytest.mark.timeout(30)
def test_gain_and_efficiency_limits():
    assert gain(64, 16, 0.0) == pytest.approx(1.0)  # no noise: a bigger batch buys nothing
    assert gain(64, 16, 1e9) == pytest.approx(4.0)  # all noise: linear scaling
    assert gain(64, 16, 48) == pytest.approx(64 * 64 / (16 * 112))
    assert efficiency(64, 16, 48) == pytest.approx(64 / 112)
    assert gain(16, 16, 5.0) == 1.0 and efficiency(16, 16, 5.0) == 1.0


def _regression(seed: int = 0, n: int = 20000, d: int = 32):
    """Linear regression from zero weights: the gradient shrinks towards the optimum while
    its per-sample noise (the label noise) does not, so the noise scale grows."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    Y = X @ torch.randn(d, 1, generator=g) + 0.5 * torch.randn(n, 1, generator=g)
    model = torch.nn.Linear(d, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    return X, Y, model


@pytest.fixture
def steady_clock(monkeypatch):
    """Each read of the step timer 1 ms after the last: a step's compute then costs the same
    whatever else the machine runs (the batch sizes chosen follow from the gradients)."""
    ticks = itertools.count()
    monkeypatch.setattr("trainctl.train.adaptive._clock", lambda: next(ticks) / 1000)


def _train(adaptive: AdaptiveBatch, model, X, Y, steps: int) -> list[float]:
    phis = []
    while adaptive.steps < steps:
        if adaptive.sampler.position >= adaptive.sampler.usable:
            adaptive.set_epoch(adaptive.epoch + 1)
        for step in adaptive:
            for micro in step.micro_batches:
                with adaptive.accumulate(micro):
                    i = torch.tensor(micro.indices)
                    loss = torch.nn.functional.mse_loss(model(X[i]), Y[i]) * micro.loss_scale
                    loss.backward()
            adaptive.step()
            phis.append(adaptive.noise.value)
            if adaptive.steps >= steps:
                break
    return phis


@pytest.mark.timeout(60)
def test_batch_grows_as_the_noise_scale_does(steady_clock):
    X, Y, model = _regression()
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    adaptive = AdaptiveBatch(
        model,
        opt,
        len(Y),
        base_batch_size=16,
        max_batch_size=1024,
        adapt_every=10,
        smoothing=0.9,
        num_replicas=1,
        rank=0,
    )
    phis = _train(adaptive, model, X, Y, 200)
    assert adaptive.history[0] == (0, 16)
    sizes = [size for _, size in adaptive.history]
    assert max(sizes) >= 256, adaptive.history  # grown with the noise scale ...
    assert phis[-1] > 5 * phis[20], (phis[20], phis[-1])  # ... which grew
    # the learning rate was scaled by AdaScale's gain: progress counts more than steps
    assert adaptive.progress > adaptive.steps * 2
    assert opt.param_groups[0]["lr"] == 0.02  # the user's LR is left as it was
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(X), Y))
    assert loss < 0.3  # the label noise's floor is 0.25: it trained


@pytest.mark.timeout(30)
def test_best_batch_size_follows_the_noise_scale():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    adaptive = AdaptiveBatch(
        model,
        opt,
        10000,
        base_batch_size=32,
        max_batch_size=4096,
        max_per_worker=256,
        num_replicas=1,
        rank=0,
    )
    # a step of m samples per micro-batch costs 1 ms + 10 us per sample, plus 2 ms
    for m in (16, 64):
        adaptive.throughput.observe(1, 2, m, 2 * (1e-3 + 1e-5 * m), 2e-3)
    chosen = []
    for phi in (1.0, 30.0, 300.0, 3000.0, 1e6):
        adaptive.sampler.set_global_batch_size(32, min_accum=2)
        for _ in range(8):  # each choice at most doubles: follow it to where it settles
            adaptive.sampler.set_global_batch_size(adaptive.best_batch_size(phi), min_accum=2)
        chosen.append(adaptive.global_batch_size)
    assert chosen == sorted(chosen) and chosen[0] == 32 and chosen[-1] >= 2048, chosen


@pytest.mark.timeout(30)
def test_state_continues_after_load(tmp_path, steady_clock):
    X, Y, model = _regression(n=4000)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    kwargs = dict(
        base_batch_size=16, max_batch_size=512, adapt_every=5, smoothing=0.8, num_replicas=1, rank=0
    )
    adaptive = AdaptiveBatch(model, opt, len(Y), **kwargs)
    _train(adaptive, model, X, Y, 150)
    torch.save(adaptive.state_dict(), tmp_path / "state.pt")
    again = AdaptiveBatch(model, opt, len(Y), **kwargs)
    again.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert again.global_batch_size == adaptive.global_batch_size > 16
    assert again.noise.value == adaptive.noise.value
    assert (again.progress, again.steps, again.history) == (
        adaptive.progress,
        adaptive.steps,
        adaptive.history,
    )
    assert (again.epoch, again.sampler.position) == (adaptive.epoch, adaptive.sampler.position)
    assert again.throughput.fit() == adaptive.throughput.fit()
    other = AdaptiveBatch(model, opt, len(Y), **{**kwargs, "base_batch_size": 32})
    with pytest.raises(ValueError, match="trained with base_batch_size 16, not 32"):
        other.load_state_dict(adaptive.state_dict())


@pytest.mark.timeout(30)
def test_bad_adaptive_input_names_the_field():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [
        (dict(base_batch_size=64, max_batch_size=32), "max_batch_size must be an integer of at"),
        (dict(base_batch_size=0, max_batch_size=32), "base_batch_size must be a positive"),
        (dict(base_batch_size=8, max_batch_size=32, max_per_worker=0), "max_per_worker must"),
        (dict(base_batch_size=8, max_batch_size=32, adapt_every=0), "adapt_every must"),
        (dict(base_batch_size=8, max_batch_size=32, smoothing=1.0), "smoothing must be in"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            AdaptiveBatch(model, opt, 100, num_replicas=1, rank=0, **kwargs)
    with pytest.raises(ValueError, match="global_batch_size must be an integer of at least"):
        AdaptiveBatch(model, opt, 100, base_batch_size=2, max_batch_size=8, num_replicas=4, rank=0)
    with pytest.raises(ValueError, match="must be the DistributedDataParallel-wrapped model"):
        AdaptiveBatch(model, opt, 100, base_batch_size=8, max_batch_size=32, num_replicas=2, rank=0)


def _states(log: str, kind: str) -> dict[int, str]:
    return {
        int(m.group(1)): m.group(2)
        for m in re.finditer(rf"^{kind} (\d+) (.*)$", "\n".join(log_lines(log)), re.M)
    }


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_adaptive_state_survives_kill_and_resume(home):
    """Two DDP workers (the communication hook measures each one's gradient); worker 1 is
    SIGKILLed at step 45; the relaunch restores the checkpoint of step 40 and continues
    with its batch size, noise scale and progress exactly."""
    job = Estimator(
        "train.py",
        source_dir=str(SOURCE),
        instance_count=2,
        hyperparameters={"epochs": 6, "kill-at-step": 45, "checkpoint-every": 10},
        max_restarts=1,
    ).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    assert len(info["attempts"]) == 2 and info["attempts"][1]["resumed_from_step"] == 40
    first = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    second = job.store.get_text(f"jobs/{job.name}/logs/attempt-2/node-0.log")
    saved = _states(first, "ADAPT")
    restored = _states(second, "RESTORED")
    assert list(restored) == [40]
    assert restored[40] == saved[40]  # batch, noise scale, progress, steps, position
    assert "phi=None" not in saved[40]
    after = _states(second, "ADAPT")
    assert min(after) == 41
    batches = [
        int(re.search(r"batch=(\d+)", s).group(1)) for s in (*saved.values(), *after.values())
    ]
    assert batches[0] == 16 and max(batches) >= 64, sorted(set(batches))
    accuracy = float(re.search(r"ACCURACY ([0-9.]+)", second).group(1))
    assert accuracy > 0.9
    # the metrics it reported are in the job's history
    names = {point["name"] for point in job.metric_history()}
    assert {"batch_size", "noise_scale", "gain"} <= names
