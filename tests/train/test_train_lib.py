"""trainctl.train: context, sampler, checkpoints, preemption, and the bit-exact resume bar.

The multi-process tests run gloo on 127.0.0.1 (GLOO_SOCKET_IFNAME=lo): two ranks started
directly with torchrun's environment variables, and the digits example under bare torchrun
as 2 nodes x 1 process, each node with its own checkpoint dir (nodes share no file system:
the test merges them the way the agent does through the store).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import FIXTURES, REPO
from trainctl import protocol
from trainctl.train import (
    Checkpointer,
    PreemptionFlag,
    ResumableDistributedSampler,
    TrainContext,
    context,
    linear_warmup_scheduler,
    per_worker_batch,
    report_step,
    scaled_lr,
    warmup_lr,
)
from trainctl.train import report as progress_mod
from trainctl.train.checkpoint import is_complete, step_dir_name
from trainctl.train.interval import DEFAULT_INTERVAL_SECONDS, POLICY_ENV, CheckpointPolicy

pytestmark = pytest.mark.timeout(60)  # each test; the slower ones set their own below


DIGITS = REPO / "examples" / "digits" / "train.py"

DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path) -> Path:
    """No torchrun/SM_*/trainctl variables; cwd is tmp_path."""
    for key in list(os.environ):
        if key in DIST_VARS or key.startswith(("SM_", "TRAINCTL_", "TORCHELASTIC_")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ============================================================================ context


def test_context_plain_process(clean_env: Path) -> None:
    ctx = context()
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert ctx.node_rank == 0
    assert ctx.is_chief and not ctx.is_distributed
    assert ctx.device == (
        torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    )
    assert ctx.model_dir == clean_env / "model"
    assert ctx.checkpoint_dir == clean_env / "checkpoints"
    assert ctx.output_data_dir == clean_env / "output"
    assert ctx.channels == {} and ctx.hyperparameters == {}


def test_context_torchrun(clean_env: Path, monkeypatch) -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    env["GROUP_RANK"] = "1"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ctx = context()
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (3, 1, 4, 2)
    assert ctx.node_rank == 1
    assert not ctx.is_chief and ctx.is_distributed
    assert ctx.checkpoint_dir == clean_env / "checkpoints"
    assert ctx.model_dir == clean_env / "model"


def test_context_sagemaker_env(clean_env: Path, monkeypatch) -> None:
    root = clean_env / "opt" / "ml"
    env = {
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "SM_CURRENT_HOST_RANK": "1",
        "SM_MODEL_DIR": str(root / "model"),
        "SM_CHECKPOINT_DIR": str(root / "checkpoints"),
        "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
        "SM_INPUT_DIR": str(root / "input"),
        "SM_CHANNELS": json.dumps(["train", "val-set"]),
        "SM_CHANNEL_TRAIN": str(root / "input" / "data" / "train"),
        "SM_CHANNEL_VAL_SET": str(root / "input" / "data" / "val-set"),
        "SM_HPS": json.dumps({"epochs": 8, "lr": 0.1, "batch-size": 32}),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ctx = context()
    assert (ctx.rank, ctx.node_rank, ctx.world_size) == (2, 1, 4)
    assert ctx.model_dir == root / "model"
    assert ctx.checkpoint_dir == root / "checkpoints"
    assert ctx.output_data_dir == root / "output" / "data"
    assert ctx.channels == {
        "train": root / "input" / "data" / "train",
        "val-set": root / "input" / "data" / "val-set",
    }
    assert ctx.hyperparameters == {"epochs": 8, "lr": 0.1, "batch-size": 32}


def test_context_reads_what_the_agent_sets(clean_env: Path) -> None:
    """Contract: context() of the environment trainctl.launcher.layout gives a node."""
    from trainctl.cluster import ClusterInfo, NodeInfo, host_name
    from trainctl.launcher.layout import Layout, sagemaker_env
    from trainctl.spec.build import build_spec

    (clean_env / "src").mkdir()
    (clean_env / "src" / "train.py").write_text("")
    spec = build_spec(
        entry_point="train.py",
        source_dir=str(clean_env / "src"),
        hyperparameters={"lr": 0.1},
        inputs={"train": "file:///data"},
    )
    cluster = ClusterInfo(
        job="job-1",
        attempt=1,
        provider="local",
        instance_type="local",
        nodes=[NodeInfo(rank=r, host=host_name(r), address="127.0.0.1", root="/") for r in (0, 1)],
        master_port=29500,
        processes_per_host=1,
    )
    layout = Layout(clean_env / "node-1")
    env = sagemaker_env(spec, cluster, 1, layout, num_gpus=0, num_cpus=2)
    env.update(RANK="1", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1")
    ctx = context(env)
    assert (ctx.rank, ctx.node_rank, ctx.world_size) == (1, 1, 2)
    assert ctx.model_dir == layout.model
    assert ctx.checkpoint_dir == layout.checkpoints(spec)
    assert ctx.output_data_dir == layout.output_data
    assert ctx.channels == {"train": layout.channel("train")}
    assert ctx.hyperparameters == {"lr": 0.1}


# ============================================================================ sampler


@pytest.mark.parametrize(
    ("length", "replicas", "shuffle", "drop_last"),
    [(1437, 2, True, False), (100, 3, True, False), (101, 4, True, True), (10, 3, False, False)],
)
def test_sampler_matches_torch(length: int, replicas: int, shuffle: bool, drop_last: bool) -> None:
    from torch.utils.data.distributed import DistributedSampler

    data = list(range(length))
    for rank in range(replicas):
        ours = ResumableDistributedSampler(
            length, replicas, rank, shuffle, seed=7, drop_last=drop_last
        )
        theirs = DistributedSampler(
            data, replicas, rank, shuffle=shuffle, seed=7, drop_last=drop_last
        )
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


def test_sampler_resumes_mid_epoch() -> None:
    full = ResumableDistributedSampler(1437, 2, 1, seed=3)
    full.set_epoch(5)
    expected = list(full)
    assert list(full) == expected  # deterministic for (seed, epoch)

    sampler = ResumableDistributedSampler(1437, 2, 1, seed=3)
    sampler.set_epoch(5)
    loader = torch.utils.data.DataLoader(range(1437), batch_size=32, sampler=sampler)
    for i, batch in enumerate(loader):  # the loader prefetches; the loop says what it used
        sampler.advance(len(batch))
        if i == 6:
            break
    state = sampler.state_dict()
    assert state == {"epoch": 5, "consumed": 7 * 32, "seed": 3}

    resumed = ResumableDistributedSampler(1437, 2, 1, seed=999)  # the saved seed wins
    resumed.load_state_dict(state)
    resumed.set_epoch(5)  # the loop's set_epoch for the resumed epoch keeps the position
    assert len(resumed) == len(expected) - 224
    rest = [
        int(i) for b in torch.utils.data.DataLoader(range(1437), 32, sampler=resumed) for i in b
    ]
    assert rest == expected[224:]
    for batch in loader:
        resumed.advance(len(batch))
    assert len(resumed) == 0
    resumed.set_epoch(6)  # the next epoch starts from its beginning
    full.set_epoch(6)
    assert len(resumed) == len(full) and list(resumed) == list(full)
    assert resumed.state_dict() == {"epoch": 6, "consumed": 0, "seed": 3}

    with pytest.raises(ValueError):
        resumed.advance(10_000)


# ============================================================================ checkpoints


def _ctx(tmp_path: Path) -> TrainContext:
    return TrainContext(checkpoint_dir=tmp_path / "ckpt", device=torch.device("cpu"))


def _make(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = linear_warmup_scheduler(opt, warmup_steps=10)
    sampler = ResumableDistributedSampler(64, 1, 0, seed=1)
    return model, opt, sched, sampler


def _train(model, opt, sched, sampler, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 5) + random.random() + float(np.random.rand())
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
        sampler.advance(4)


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _save(ckpt: Checkpointer, step: int, objs, **kw) -> Path:
    """Save, and wait for the background write (async_save): the files are then whole."""
    model, opt, sched, sampler = objs
    path = ckpt.save(step, model=model, optimizer=opt, scheduler=sched, sampler=sampler, **kw)
    ckpt.wait()
    return path


def _restore(ckpt: Checkpointer, objs):
    model, opt, sched, sampler = objs
    return ckpt.restore(model=model, optimizer=opt, scheduler=sched, sampler=sampler)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("async_save", [True, False], ids=["async", "in-line"])
def test_checkpoint_round_trip_is_bit_exact(clean_env: Path, async_save: bool) -> None:
    ckpt = Checkpointer(keep=3, ctx=_ctx(clean_env), async_save=async_save)
    a = _make()
    a[3].set_epoch(2)
    _train(*a, steps=5)
    path = _save(ckpt, 5, a, epoch=2, extra={"best": 0.5})
    assert path == clean_env / "ckpt" / "step-000000005"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "rank-0.pt", "state.pt"]
    assert json.loads((path / "meta.json").read_text()) == {
        "step": 5,
        "epoch": 2,
        "world_size": 1,
        "files": ["state.pt", "rank-0.pt"],
    }
    state = torch.load(path / "state.pt", weights_only=False)
    assert set(state) == {
        "step",
        "epoch",
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "extra",
        "world_size",
        "sharded",
    }
    assert state["sharded"] is None  # a plain model: its whole state is in state.pt
    own = torch.load(path / "rank-0.pt", weights_only=True)  # plain tensors and builtins
    # and CUDA's generators where CUDA exists (one state per device)
    rng_keys = {"python", "numpy", "torch"} | ({"cuda"} if torch.cuda.is_available() else set())
    assert set(own["rng"]) == rng_keys and own["sampler"]["consumed"] == 20

    # What an uninterrupted run does next.
    draws = (torch.rand(4), random.random(), float(np.random.rand()))
    _train(*a, steps=5)
    expected = _params(a[0])

    # A fresh process: same construction, other randomness consumed meanwhile.
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    b = _make(seed=42)
    info = _restore(ckpt, b)
    assert info is not None
    assert (info.step, info.epoch, info.extra, info.path) == (5, 2, {"best": 0.5}, path)
    b[3].set_epoch(2)
    assert b[3].state_dict() == {"epoch": 2, "consumed": 20, "seed": 1}
    assert b[2].last_epoch == 5 and b[1].state_dict()["state"][0]["momentum_buffer"] is not None
    # The RNG streams continue exactly where they were at the save.
    t, r, n = torch.rand(4), random.random(), float(np.random.rand())
    assert torch.equal(t, draws[0]) and r == draws[1] and n == draws[2]

    # Restoring again rewinds them; the continuation is identical tensor for tensor.
    assert _restore(ckpt, b).step == 5
    torch.rand(4), random.random(), np.random.rand()
    _train(*b, steps=5)
    got = _params(b[0])
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.timeout(30)
def test_checkpoint_keep_prunes_old_steps(clean_env: Path) -> None:
    ckpt = Checkpointer(keep=2, ctx=_ctx(clean_env))
    objs = _make()
    for step in range(1, 6):
        _save(ckpt, step * 10, objs)
    ckpt.wait()  # pruning is background work
    assert sorted(p.name for p in (clean_env / "ckpt").iterdir()) == [
        "step-000000040",
        "step-000000050",
    ]
    assert ckpt.latest_complete() == clean_env / "ckpt" / "step-000000050"
    # A newer leftover (say from a run that went further) is neither pruned nor pruning.
    (clean_env / "ckpt" / step_dir_name(900)).mkdir()
    _save(ckpt, 60, objs)
    ckpt.wait()
    assert sorted(p.name for p in (clean_env / "ckpt").iterdir()) == [
        "step-000000060",
        "step-000000900",
    ]
    assert ckpt.latest_complete() == clean_env / "ckpt" / "step-000000060"


SAVE_THEN_EXIT = r"""
import os, sys, threading, time
import torch
import trainctl.train.checkpoint as module
from trainctl.train import Checkpointer, finish

real_fsync = os.fsync
def slow_fsync(fd):  # durability work that outlives the training loop by a while
    time.sleep(0.3)
    real_fsync(fd)
module.os.fsync = slow_fsync
ckpt = Checkpointer(sys.argv[1], keep=1)
model = torch.nn.Linear(4, 2)
for step in (1, 2):
    ckpt.save(step, model=model)
print("background:", [t.name for t in threading.enumerate() if t.name.startswith("trainctl-")])
if sys.argv[2] == "finish":
    finish(0)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["finish", "return"])
def test_checkpoint_durability_runs_in_background_and_completes_before_exit(
    clean_env: Path, tmp_path: Path, ending: str
) -> None:
    script = tmp_path / "save.py"
    script.write_text(SAVE_THEN_EXIT)
    root = tmp_path / "ckpt"
    out = subprocess.run(
        [sys.executable, str(script), str(root), ending],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # save() returned while the last step's fsyncs (and the prune of step 1) were pending...
    assert "background: ['trainctl-checkpoint-2']" in out.stdout, out.stdout
    # ...and the exit waited for them: step 1 pruned (keep=1), step 2 complete.
    assert sorted(p.name for p in root.iterdir()) == [step_dir_name(2)]
    assert is_complete(root / step_dir_name(2)) is not None


@pytest.mark.timeout(30)
def test_restore_skips_incomplete_and_corrupt(clean_env: Path, capsys) -> None:
    root = clean_env / "ckpt"
    ckpt = Checkpointer(keep=None, ctx=_ctx(clean_env))
    objs = _make()
    assert ckpt.restore(model=objs[0]) is None  # nothing there yet
    for step in (10, 20, 30, 40, 50):
        _train(*objs, steps=1)
        _save(ckpt, step, objs, epoch=step)
    # 50: state.pt truncated (meta says complete)
    data = (root / step_dir_name(50) / "state.pt").read_bytes()
    (root / step_dir_name(50) / "state.pt").write_bytes(data[: len(data) // 2])
    # 40: no meta.json (a save that did not finish)
    (root / step_dir_name(40) / "meta.json").unlink()
    # 30: meta lists a rank file that never arrived
    meta = json.loads((root / step_dir_name(30) / "meta.json").read_text())
    meta["files"].append("rank-1.pt")
    (root / step_dir_name(30) / "meta.json").write_text(json.dumps(meta))
    # 60: only .tmp leftovers of a crashed save
    (root / step_dir_name(60)).mkdir()
    (root / step_dir_name(60) / "state.pt.tmp").write_bytes(b"partial")
    (root / step_dir_name(60) / "meta.json.tmp").write_text("{")

    assert is_complete(root / step_dir_name(50)) is not None
    assert [s for s, _, _ in ckpt.complete()] == [50, 20, 10]
    fresh = _make(seed=5)
    info = _restore(ckpt, fresh)
    assert info is not None and (info.step, info.epoch) == (20, 20)
    assert "cannot load checkpoint" in capsys.readouterr().err
    state = torch.load(root / step_dir_name(20) / "state.pt", weights_only=False)
    assert all(torch.equal(v, fresh[0].state_dict()[k]) for k, v in state["model"].items())

    # Everything corrupt: a fresh start.
    for step in (10, 20):
        (root / step_dir_name(step) / "rank-0.pt").write_bytes(b"garbage")
    assert ckpt.restore(model=fresh[0]) is None


@pytest.mark.timeout(30)
def test_restore_after_a_world_size_change(clean_env: Path, capsys) -> None:
    """Saved by 2 ranks, resumed by 1: model and optimizer load, the sampler's position is
    rescaled to the same number of samples seen, RNG states are left alone."""
    two = TrainContext(rank=0, world_size=2, checkpoint_dir=clean_env / "ckpt")
    model, opt, _, _ = _make()
    sampler = ResumableDistributedSampler(64, 2, 0, seed=1)
    sampler.advance(12)
    saver = Checkpointer(ctx=two)
    path = saver.save(7, model=model, optimizer=opt, sampler=sampler, epoch=1)
    saver.wait()
    assert is_complete(path) is None  # rank-1.pt comes from the other node
    shutil.copy(path / "rank-0.pt", path / "rank-1.pt")
    one = Checkpointer(ctx=_ctx(clean_env))
    b = _make(seed=3)
    resumed = ResumableDistributedSampler(64, 1, 0, seed=1)
    torch.manual_seed(9)
    draw = torch.rand(2)
    torch.manual_seed(9)
    info = one.restore(model=b[0], optimizer=b[1], sampler=resumed)
    assert info is not None and (info.step, info.epoch) == (7, 1)
    assert torch.equal(torch.rand(2), draw)  # untouched
    assert resumed.state_dict() == {"epoch": 0, "consumed": 24, "seed": 1}
    assert all(torch.equal(v, b[0].state_dict()[k]) for k, v in model.state_dict().items())
    assert "world size changed 2 -> 1" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_save_writes_only_tmp_names_until_complete(clean_env: Path, monkeypatch) -> None:
    ckpt = Checkpointer(keep=3, ctx=_ctx(clean_env))
    objs = _make()
    _save(ckpt, 1, objs)
    real_save = torch.save
    finished: list[str] = []

    def spy(obj, f, *args, **kwargs):
        target = Path(f.name if hasattr(f, "name") else f)
        assert target.name.endswith(protocol.TMP_SUFFIX), target
        final = target.with_name(target.name[: -len(protocol.TMP_SUFFIX)])
        assert not final.exists()
        assert not (target.parent / "meta.json").exists()
        present = {p.name for p in target.parent.iterdir() if not p.name.endswith(".tmp")}
        assert present == set(finished)  # only files whose write had finished
        real_save(obj, f, *args, **kwargs)
        finished.append(final.name)

    monkeypatch.setattr(torch, "save", spy)
    path = _save(ckpt, 2, objs)
    assert sorted(finished) == ["rank-0.pt", "state.pt"]
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "rank-0.pt", "state.pt"]

    # A save that dies half-way leaves no whole-looking file and no meta.json.
    calls = []

    def dying(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"half")
            raise OSError("disk full")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying)
    with pytest.raises(RuntimeError, match="disk full"):  # raised by wait(), from the writer
        _save(ckpt, 3, objs)
    assert [p.name for p in (clean_env / "ckpt" / step_dir_name(3)).iterdir()] == ["state.pt"]
    monkeypatch.setattr(torch, "save", real_save)
    assert _restore(ckpt, _make()).step == 2


def test_a_torch_save_in_place_cut_anywhere_is_never_taken_for_whole(tmp_path: Path) -> None:
    """What the node's syncs check before a copy of a script's own save replaces the last
    one (trainctl.node.sync.unfinished): a real torch.save of a model and its optimizer, and
    an np.savez, cut at any byte, are never whole; the whole files are."""
    from trainctl.node.sync import unfinished

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "a")
    np.savez(tmp_path / "b.npz", weights=np.random.default_rng(0).random((32, 64)))
    for whole, name in [
        ((tmp_path / "a").read_bytes(), "snapshot.pt"),
        ((tmp_path / "b.npz").read_bytes(), "arrays.npz"),
    ]:
        path = tmp_path / name
        path.write_bytes(whole)
        assert unfinished(path, len(whole)) is None
        for cut in {0, 4, 30, *range(64, len(whole), 97), len(whole) - 22, len(whole) - 1}:
            path.write_bytes(whole[:cut])
            assert unfinished(path, cut) is not None, (name, cut, len(whole))


# ============================================================================ small helpers


def test_preemption_flag_single_process(clean_env: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    flag = PreemptionFlag(TrainContext(device=torch.device("cpu")), check_every=3)
    try:
        assert not flag.requested and not flag.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        assert flag.requested
        assert [flag.should_stop() for _ in range(3)] == [False, True, True]
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_report_step_throttled(clean_env: Path, monkeypatch, capsys) -> None:
    report_step(1)
    assert capsys.readouterr().out == ""  # outside trainctl: nothing
    monkeypatch.setenv("TRAINCTL_JOB", "job-1")
    monkeypatch.setattr(progress_mod, "_last_sent", None)
    monkeypatch.setattr(progress_mod, "_unsent", None)
    for step in range(1, 50):
        report_step(step)
    assert [protocol.parse(line) for line in capsys.readouterr().out.splitlines()] == [
        {"event": "step", "step": 1}
    ]
    monkeypatch.setattr(progress_mod, "_last_sent", time.monotonic() - 1)
    report_step(50)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(progress_mod, "_last_sent", None)
    report_step(51)
    assert [protocol.parse(line) for line in capsys.readouterr().out.splitlines()] == [
        {"event": "step", "step": 50}
    ]


@pytest.mark.parametrize("ending", ["return", "finish"])
def test_the_last_step_held_back_is_sent_as_the_script_ends(clean_env: Path, ending) -> None:
    """A script that ends within the throttle's interval of its last report: the step it
    reached still reaches the record (before, the record said the step of the last message
    sent, up to half a second of steps earlier), when it returns or calls finish()."""
    script = clean_env / "steps.py"
    end = "from trainctl.train import finish\nfinish(0)\n" if ending == "finish" else ""
    script.write_text(
        "from trainctl.train import report_step\n"
        "for step in range(1, 21):\n"
        "    report_step(step)\n" + end
    )
    env = {**os.environ, "TRAINCTL_JOB": "job-1"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    sent = [protocol.parse(line) for line in out.stdout.splitlines()]
    assert sent == [{"event": "step", "step": 1}, {"event": "step", "step": 20}]


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ('@@trainctl@@ {"event": "step", "step": 3}', ""),
        ('[rank0]:@@trainctl@@ {"event": "step", "step": 3}', ""),
        ('[1,0]<stdout>:@@trainctl@@ {"event": "step", "step": 3}', ""),
        ('USED 1 2@@trainctl@@ {"event": "step", "step": 3}', "USED 1 2"),
        ('x@@trainctl@@ {"event": "step", "step": 3}', "x"),
    ],
)
def test_a_control_message_is_split_from_the_text_before_it(line: str, text: str) -> None:
    assert protocol.split(line) == (text, {"event": "step", "step": 3})


@pytest.mark.parametrize("line", ["plain output", "@@trainctl@@ not json", "@@trainctl@@ [1]"])
def test_a_line_without_a_control_message_is_all_text(line: str) -> None:
    assert protocol.split(line) == (line, None)


def test_large_batch_helpers() -> None:
    assert per_worker_batch(1024, 8) == (128, 1)
    assert per_worker_batch(1024, 8, max_per_worker=32) == (32, 4)
    assert per_worker_batch(96, 4, max_per_worker=10) == (8, 3)
    with pytest.raises(ValueError, match="not divisible by the world size 3"):
        per_worker_batch(100, 3)
    assert scaled_lr(0.1, 1024, 256) == pytest.approx(0.4)
    assert warmup_lr(0, 0.4, 100) == 0.0
    assert warmup_lr(50, 0.4, 100) == pytest.approx(0.2)
    assert warmup_lr(100, 0.4, 100) == warmup_lr(1000, 0.4, 100) == 0.4
    assert warmup_lr(0, 0.4, 100, start_factor=0.25) == pytest.approx(0.1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
    sched = linear_warmup_scheduler(opt, warmup_steps=4)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([warmup_lr(s, 0.4, 4) for s in range(6)])


# ============================================================================ processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_env(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


class Procs:
    """Processes a test starts, all tagged; whatever is left is SIGKILLed afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tag = f"TRAINLIB_TEST_{uuid.uuid4().hex}"
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in DIST_VARS and not k.startswith(("SM_", "TRAINCTL_", "TORCHELASTIC_"))
        }
        env.update(GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        if torch.cuda.device_count() < 2:
            # These runs put 2 ranks on this machine; NCCL needs a GPU for each (2 ranks on
            # one GPU: "Duplicate GPU detected"). With fewer, they run on the CPU over gloo.
            env["CUDA_VISIBLE_DEVICES"] = ""
        env[self.tag] = "1"
        env.update(extra)
        return env

    def start(self, argv: list[str], log: Path, cwd: Path, **env: str) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def tagged(self) -> list[int]:
        marker = self.tag.encode() + b"="
        return [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and int(p) != os.getpid() and marker in _proc_env(int(p))
        ]

    def kill_all(self) -> None:
        for _ in range(3):
            pids = self.tagged()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for proc in self.started:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.2)

    def leftovers(self) -> list[int]:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            alive = [p for p in self.tagged() if not _is_zombie(p)]
            if not alive:
                return []
            time.sleep(0.1)
        return alive


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        for proc in p.started:
            if proc.poll() is None:
                proc.kill()
        p.kill_all()
    assert not p.leftovers(), "processes left behind"


def _wait_for(
    cond: Callable[[], bool], what: str, timeout: float, watch: list[subprocess.Popen]
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if any(p.poll() is not None for p in watch):
            raise AssertionError(f"a process exited while waiting for {what}")
        time.sleep(0.02)


def _wait_all(started: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    return [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in started]


# ---------------------------------------------------------------------------- two ranks

WORKER = r"""
import json, os, random, sys, time
from pathlib import Path
import numpy as np
import torch
from trainctl.train import Checkpointer, PreemptionFlag, finish, init_distributed

mode, out = sys.argv[1], Path(sys.argv[2])
torch.set_num_threads(1)
ctx = init_distributed()
assert torch.distributed.is_initialized() and ctx.world_size == 2
seed = 100 + ctx.rank
torch.manual_seed(seed); random.seed(seed); np.random.seed(seed)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
ckpt = Checkpointer(keep=2, ctx=ctx)

def train_step():
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()

def snapshot():
    return {
        "draws": [torch.rand(3).tolist(), random.random(), float(np.random.rand())],
        "params": {k: v.tolist() for k, v in model.state_dict().items()},
        "momentum": [s["momentum_buffer"].tolist() for s in opt.state_dict()["state"].values()],
    }

def dump(name, obj):
    (out / f"{name}-{ctx.rank}.json").write_text(json.dumps(obj))

if mode == "preempt":
    flag = PreemptionFlag(ctx)
    step = 0
    while step < 2000:
        train_step()
        step += 1
        (out / f"progress-{ctx.rank}").write_text(str(step))
        time.sleep(0.01)
        if flag.should_stop():
            dump("stop", {"step": step, "requested": flag.requested})
            ckpt.save(step, model=model, optimizer=opt, epoch=1)
            flag.exit(step)
    sys.exit(3)
elif mode == "save":
    for step in range(1, 5):
        train_step()
        ckpt.save(step, model=model, optimizer=opt, extra={"saved_by": ctx.rank})
    dump("saved", snapshot())
elif mode == "due":  # save when the interval says, whatever this rank's own clock says
    saved, began = [], time.monotonic()
    for step in range(1, 41):
        train_step()
        time.sleep(0.05)
        if ckpt.due():
            ckpt.save(step, model=model, optimizer=opt)
            saved.append([step, round(time.monotonic() - began, 3)])
    dump("due", {"saved": saved, "interval": ckpt.interval_seconds()})
elif mode == "restore":
    info = ckpt.restore(model=model, optimizer=opt)
    dump("restored", {"step": info and info.step, "extra": info and info.extra, **snapshot()})
# The library's end (a barrier, then an exit without destructors): with torch 2.13's gloo,
# a process that destroys its group and exits can still abort in a worker thread's
# destructor ("terminate called without an active exception", seen under load).
finish(0)
"""


def _start_ranks(
    procs: Procs,
    tmp_path: Path,
    mode: str,
    ckpt_dirs: list[Path],
    rank_env: list[dict[str, str]] | None = None,
):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    port = str(_free_port())
    started = []
    for rank in (0, 1):
        env = dict(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRAINCTL_JOB="job-1")
        env.update(SM_CHECKPOINT_DIR=str(ckpt_dirs[rank]), SM_CURRENT_HOST_RANK=str(rank))
        env.update(rank_env[rank] if rank_env else {})
        argv = [sys.executable, str(script), mode, str(out)]
        log = tmp_path / f"{mode}-{rank}.log"
        started.append(procs.start(argv, log, tmp_path / f"node{rank}", **env))
    return started, out


def _logs(tmp_path: Path, mode: str) -> str:
    return "\n".join((tmp_path / f"{mode}-{r}.log").read_text() for r in (0, 1))


def _events(text: str) -> list[dict]:
    # (split, as the agent reads them: the background writer's message can land inside a
    # line the main thread is printing)
    return [m for line in text.splitlines() if (m := protocol.split(line)[1])]


@pytest.mark.timeout(60)
def test_sigterm_to_one_rank_stops_both_at_the_same_step(procs: Procs, tmp_path: Path) -> None:
    nodes = [tmp_path / "node0" / "ckpt", tmp_path / "node1" / "ckpt"]
    ranks, out = _start_ranks(procs, tmp_path, "preempt", nodes)
    progress = out / "progress-1"
    _wait_for(
        lambda: progress.exists() and int(progress.read_text() or 0) >= 5,
        "rank 1 to train",
        30,
        ranks,
    )
    ranks[1].send_signal(signal.SIGTERM)  # rank 1 only
    codes = _wait_all(ranks, 30)
    logs = _logs(tmp_path, "preempt")
    assert codes == [protocol.EXIT_PREEMPTED] * 2, logs
    stop = [json.loads((out / f"stop-{r}.json").read_text()) for r in (0, 1)]
    assert stop[0]["step"] == stop[1]["step"] >= 5
    assert (stop[0]["requested"], stop[1]["requested"]) == (False, True)
    step = stop[0]["step"]
    said = _events((tmp_path / "preempt-0.log").read_text())
    # rank 0 also says how long the save held its loop (the job's goodput), once
    stalls = [m for m in said if m["event"] == "checkpoint_stall"]
    assert len(stalls) == 1 and stalls[0]["seconds"] >= 0, said
    assert [m for m in said if m["event"] != "checkpoint_stall"] == [
        {"event": "step", "step": step},
        {"event": "checkpoint", "step": step},
        {"event": "preempted", "step": step},
    ]
    # node 1's first worker announces its own part, so its agent uploads it at once
    assert _events((tmp_path / "preempt-1.log").read_text()) == [
        {"event": "checkpoint", "step": step}
    ]

    # Each node holds its own part of the emergency checkpoint.
    name = step_dir_name(step)
    assert sorted(p.name for p in (nodes[0] / name).iterdir()) == [
        "meta.json",
        "rank-0.pt",
        "state.pt",
    ]
    assert sorted(p.name for p in (nodes[1] / name).iterdir()) == ["rank-1.pt"]
    meta = json.loads((nodes[0] / name / "meta.json").read_text())
    assert meta == {
        "step": step,
        "epoch": 1,
        "world_size": 2,
        "files": ["state.pt", "rank-0.pt", "rank-1.pt"],
    }
    assert is_complete(nodes[0] / name) is None  # rank-1.pt lives on node 1
    union = tmp_path / "union"
    for node in nodes:
        shutil.copytree(node, union, dirs_exist_ok=True)
    assert is_complete(union / name) == meta


@pytest.mark.timeout(60)
def test_two_ranks_save_per_node_and_restore_from_the_union(procs: Procs, tmp_path: Path) -> None:
    nodes = [tmp_path / "node0" / "ckpt", tmp_path / "node1" / "ckpt"]
    ranks, out = _start_ranks(procs, tmp_path, "save", nodes)
    assert _wait_all(ranks, 40) == [0, 0], _logs(tmp_path, "save")
    # keep=2 on each node; rank 0's files only on node 0, rank 1's only on node 1.
    per_node = (["meta.json", "rank-0.pt", "state.pt"], ["rank-1.pt"])
    for node, files in zip(nodes, per_node, strict=True):
        assert sorted(p.name for p in node.iterdir()) == [step_dir_name(3), step_dir_name(4)]
        for step in (3, 4):
            assert sorted(p.name for p in (node / step_dir_name(step)).iterdir()) == files
    for rank in (0, 1):  # the first worker of every node announces each checkpoint
        log = (tmp_path / f"save-{rank}.log").read_text()
        assert [e["step"] for e in _events(log) if e["event"] == "checkpoint"] == [1, 2, 3, 4]

    # What the agent does: the union of both nodes on every node.
    union = [tmp_path / "union0", tmp_path / "union1"]
    for dest in union:
        for node in nodes:
            shutil.copytree(node, dest, dirs_exist_ok=True)
    ranks, out = _start_ranks(procs, tmp_path, "restore", union)
    assert _wait_all(ranks, 40) == [0, 0], _logs(tmp_path, "restore")
    saved = [json.loads((out / f"saved-{r}.json").read_text()) for r in (0, 1)]
    restored = [json.loads((out / f"restored-{r}.json").read_text()) for r in (0, 1)]
    for r in (0, 1):
        assert restored[r]["step"] == 4
        assert restored[r]["extra"] == {"saved_by": 0}
        assert restored[r]["draws"] == saved[r]["draws"]  # each rank its own RNG streams
        assert restored[r]["params"] == saved[0]["params"]  # rank 0's model everywhere
        assert restored[r]["momentum"] == saved[0]["momentum"]
    assert saved[0]["draws"] != saved[1]["draws"]
    assert {"event": "resumed", "step": 4} in _events(_logs(tmp_path, "restore"))


# ---------------------------------------------------------------------------- the bar

DIGITS_ARGS = ["--epochs", "3", "--checkpoint-every", "10", "--keep-checkpoints", "3"]
STEPS = 3 * 23  # 1437 samples, 2 ranks, 32 per batch: 23 steps an epoch


def _digits(procs: Procs, run: Path, *args: str, ckpt: list[Path] | None = None):
    """The digits example as 2 nodes x 1 process under bare torchrun, one dir per node."""
    port = str(_free_port())
    started = []
    for node_rank in (0, 1):
        node = run / f"node{node_rank}"
        env = {
            "SM_CHECKPOINT_DIR": str(ckpt[node_rank] if ckpt else node / "ckpt"),
            "SM_MODEL_DIR": str(node / "model"),
            "TRAINCTL_JOB": "digits-test",  # so the script's control lines show up
            "TMPDIR": str(node),  # torchrun's torchelastic_* temp dirs stay in tmp_path
        }
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node_rank),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            str(DIGITS),
            *DIGITS_ARGS,
            *args,
        ]
        started.append(procs.start(argv, run / f"node{node_rank}.log", node, **env))
    return started


def _run_log(run: Path) -> str:
    return "\n".join((run / f"node{r}.log").read_text() for r in (0, 1))


def _model(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "node0" / "model" / "model.pt", weights_only=True)


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def _merge(run: Path, into: Path) -> list[Path]:
    """The agent's part: each node's checkpoint files (no .tmp) -> the union on every node."""
    dests = [into / "node0" / "ckpt", into / "node1" / "ckpt"]
    for dest in dests:
        for node_rank in (0, 1):
            src = run / f"node{node_rank}" / "ckpt"
            shutil.copytree(
                src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*" + ".tmp")
            )
    return dests


def _finish(procs: Procs, interrupted: Path, resumed: Path) -> list[dict]:
    ckpt = _merge(interrupted, resumed)
    ranks = _digits(procs, resumed, ckpt=ckpt)
    assert _wait_all(ranks, 90) == [0, 0], _run_log(resumed)
    log = _run_log(resumed)
    assert "test_accuracy=" in log
    return _events((resumed / "node0.log").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Model A: the uninterrupted 2-node run."""
    run = tmp_path_factory.mktemp("uninterrupted")
    p = Procs(run)
    try:
        ranks = _digits(p, run)
        assert _wait_all(ranks, 90) == [0, 0], _run_log(run)
    finally:
        p.kill_all()
    events = _events((run / "node0.log").read_text())
    assert not any(e["event"] == "resumed" for e in events)
    assert {"event": "checkpoint", "step": 60} in events
    assert sorted(p.name for p in (run / "node0" / "ckpt").iterdir()) == [
        step_dir_name(40),
        step_dir_name(50),
        step_dir_name(60),
    ]
    return _model(run)


@pytest.mark.timeout(150)
def test_digits_sigterm_resume_is_bit_identical(
    procs: Procs, tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    run = tmp_path / "preempted"
    ranks = _digits(procs, run, "--step-delay", "0.02")
    worker_log = run / "node0.log"
    _wait_for(
        lambda: worker_log.exists() and '"checkpoint", "step": 10}' in worker_log.read_text(),
        "the first checkpoint",
        60,
        ranks,
    )
    time.sleep(0.1)
    workers = _children(ranks[1].pid)  # node 1's torchrun -> its one worker
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGTERM)
    codes = _wait_all(ranks, 60)
    log = _run_log(run)
    assert all(code != 0 for code in codes), log
    assert log.count("exitcode  : 85") == 2, log  # torchrun's report of each worker
    preempted = [e for e in _events(worker_log.read_text()) if e["event"] == "preempted"]
    assert len(preempted) == 1 and 10 < preempted[0]["step"] < STEPS
    step = preempted[0]["step"]

    events = _finish(procs, run, tmp_path / "resumed")
    assert events[0] == {"event": "resumed", "step": step}
    _assert_identical(reference, _model(tmp_path / "resumed"))


@pytest.mark.timeout(150)
def test_digits_hard_kill_resume_is_bit_identical(
    procs: Procs, tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    run = tmp_path / "killed"
    ranks = _digits(procs, run, "--step-delay", "0.02")
    worker_log = run / "node0.log"
    _wait_for(
        lambda: worker_log.exists() and '"checkpoint", "step": 20}' in worker_log.read_text(),
        "the second checkpoint",
        60,
        ranks,
    )
    time.sleep(0.15)  # a few steps past the checkpoint: those are lost
    victims = [pid for proc in ranks for pid in [proc.pid, *_children(proc.pid)]]
    assert len(victims) == 4
    for pid in victims:  # both torchrun process groups and the workers' own sessions
        os.killpg(pid, signal.SIGKILL)
    assert _wait_all(ranks, 30) == [-signal.SIGKILL] * 2
    procs.kill_all()
    saved = [e["step"] for e in _events(worker_log.read_text()) if e["event"] == "checkpoint"]
    assert saved and saved[-1] >= 20
    last_step = max(e["step"] for e in _events(worker_log.read_text()) if e["event"] == "step")

    events = _finish(procs, run, tmp_path / "resumed")
    assert events[0] == {"event": "resumed", "step": saved[-1]}
    assert saved[-1] < STEPS
    assert last_step >= saved[-1]
    _assert_identical(reference, _model(tmp_path / "resumed"))


# ---------------------------------------------------------------------------- the bar, swept


class _Killed(Exception):
    """Stands for SIGKILL: the run stops at once, without an emergency checkpoint."""


@pytest.fixture
def digits_in_process(clean_env: Path, monkeypatch) -> Iterator[Callable[..., int]]:
    """The digits example's main() as one process, run in this process (fast enough to sweep
    interruption points); returns the exit code and puts model.pt under <name>/model."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_train_example", DIGITS)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    deterministic = torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    handler = signal.getsignal(signal.SIGTERM)

    def run(ckpt: str, name: str, *, stop_at: int = 0, kill_at: int = 0) -> int:
        """stop_at/kill_at: the n-th step of this run gets a SIGTERM / is killed."""
        calls = [0]

        def should_stop(self) -> bool:
            calls[0] += 1
            if calls[0] == kill_at:
                raise _Killed
            return calls[0] == stop_at

        with monkeypatch.context() as m:
            m.setenv("SM_CHECKPOINT_DIR", str(clean_env / ckpt))
            m.setenv("SM_MODEL_DIR", str(clean_env / name / "model"))
            m.setattr(PreemptionFlag, "should_stop", should_stop)
            argv = ["--epochs", "2", "--checkpoint-every", "10", "--keep-checkpoints", "2"]
            try:
                example.main(argv)
            except SystemExit as e:
                return int(e.code or 0)
            except _Killed:
                return -9
            finally:
                signal.signal(signal.SIGTERM, handler)
        return 0

    try:
        yield run
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


@pytest.mark.timeout(60)
def test_digits_resume_at_any_step_single_process(
    digits_in_process: Callable[..., int], clean_env: Path
) -> None:
    """Interruptions at epoch and checkpoint boundaries, first and last step, and twice."""

    def model(name: str) -> dict[str, torch.Tensor]:
        return torch.load(clean_env / name / "model" / "model.pt", weights_only=True)

    assert digits_in_process("ckpt-ref", "ref") == 0  # 2 epochs x 45 steps
    reference = model("ref")
    scenarios = [
        {"stop_at": 1},
        {"stop_at": 44},
        {"stop_at": 45},  # the last step of epoch 1
        {"stop_at": 50},  # on a checkpoint step
        {"stop_at": 90},  # the very last step
        {"kill_at": 9},  # before any checkpoint: starts over
        {"kill_at": 46},
        {"kill_at": 90},
    ]
    for n, interruption in enumerate(scenarios):
        code = digits_in_process(f"ckpt-{n}", f"cut-{n}", **interruption)
        assert code == (protocol.EXIT_PREEMPTED if "stop_at" in interruption else -9)
        assert not (clean_env / f"cut-{n}" / "model").exists()
        assert digits_in_process(f"ckpt-{n}", f"run-{n}") == 0
        _assert_identical(reference, model(f"run-{n}"))

    # Twice: SIGTERM at step 30, then killed 25 steps after resuming, then to the end.
    assert digits_in_process("ckpt-twice", "a", stop_at=30) == protocol.EXIT_PREEMPTED
    assert digits_in_process("ckpt-twice", "b", kill_at=25) == -9
    assert digits_in_process("ckpt-twice", "c") == 0
    _assert_identical(reference, model("c"))


@pytest.mark.timeout(30)
def test_async_save_blocks_only_for_the_copy_and_saves_the_state_of_its_step(
    clean_env: Path, monkeypatch
) -> None:
    """The writer is held back: save() has returned, training changes the model and the
    extra, and the checkpoint still holds the state at save time, bit for bit."""
    import threading

    ckpt = Checkpointer(keep=3, ctx=_ctx(clean_env), async_save=True)
    objs = _make()
    _train(*objs, steps=3)
    before = _params(objs[0])
    extra = {"best": [0.5]}
    release = threading.Event()
    real_save = torch.save

    def held(obj, f, *args, **kwargs):
        assert release.wait(10), "never released"
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", held)
    path = ckpt.save(3, model=objs[0], optimizer=objs[1], sampler=objs[3], extra=extra)
    assert not (path / "meta.json").exists(), "save() waited for the write"
    _train(*objs, steps=2)  # the loop goes on and changes everything in place
    extra["best"].append(0.9)
    assert any(not torch.equal(before[k], v) for k, v in _params(objs[0]).items())
    release.set()
    ckpt.wait()
    monkeypatch.setattr(torch, "save", real_save)
    assert is_complete(path) is not None
    fresh = _make(seed=5)
    info = ckpt.restore(model=fresh[0], optimizer=fresh[1], sampler=fresh[3])
    assert info is not None and info.step == 3 and info.extra == {"best": [0.5]}
    assert all(torch.equal(before[k], v) for k, v in _params(fresh[0]).items())


@pytest.mark.timeout(30)
def test_async_save_refuses_an_unpicklable_value_by_name_before_writing(clean_env: Path) -> None:
    ckpt = Checkpointer(keep=3, ctx=_ctx(clean_env), async_save=True)
    objs = _make()
    with pytest.raises(TypeError, match=r"\['extra'\]\['hook'\] cannot be saved"):
        ckpt.save(1, model=objs[0], optimizer=objs[1], extra={"hook": lambda: 1})
    ckpt.wait()
    assert not (clean_env / "ckpt" / step_dir_name(1)).exists()


def _torchrun(nprocs: int, mode: str, out: Path, **env: str) -> None:
    script = FIXTURES / "fsdp" / "train.py"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    port = str(_free_port())
    done = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            str(nprocs),
            "--master-port",
            port,
            str(script),
            mode,
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out), **env},  # (torchelastic_*)
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("async_save", "saved_by", "restored_by"), [("1", 2, 3), ("0", 2, 1)], ids=["async", "in-line"]
)
def test_fsdp_shards_restore_on_another_world_size(
    tmp_path: Path, async_save: str, saved_by: int, restored_by: int
) -> None:
    """FSDP2 on CPU: the Checkpointer saves the shards with torch.distributed.checkpoint, and
    a job of another size reads them back: every parameter and Adam moment bit-identical."""
    _torchrun(saved_by, "save", tmp_path, TRAINCTL_ASYNC_CHECKPOINT=async_save)
    step = tmp_path / "ckpt" / step_dir_name(3)
    meta = json.loads((step / "meta.json").read_text())
    shards = [f"dcp/__{r}_0.distcp" for r in range(saved_by)]
    assert meta["files"] == ["state.pt", "rank-0.pt", "rank-1.pt", "dcp/.metadata", *shards]
    assert torch.load(step / "state.pt", weights_only=False)["model"] is None  # in the shards
    _torchrun(restored_by, "restore", tmp_path)
    saved = torch.load(tmp_path / "full.pt")
    restored = torch.load(tmp_path / f"restored-{restored_by}.pt")
    assert sorted(saved) == sorted(restored) and len(saved) == 12
    assert all(torch.equal(saved[k], restored[k]) for k in saved)


@pytest.mark.timeout(60)
def test_ranks_save_when_rank_0s_interval_says(procs: Procs, tmp_path: Path) -> None:
    """Checkpointer.due(): the controller's policy gives rank 0 a half-second interval before
    its first save (at the assumed 5-s hold); rank 1 is given none (every 30 minutes, by
    itself never due). Both save at rank 0's steps: a save is collective, so a rank that
    decided alone would hang the other."""
    # sqrt(2 * 5 s * 3600 / rate) = 0.5 s
    policy = CheckpointPolicy(1, 144_000.0, 144_000.0, "test")
    nodes = [tmp_path / "node0" / "ckpt", tmp_path / "node1" / "ckpt"]
    ranks, out = _start_ranks(procs, tmp_path, "due", nodes, [{POLICY_ENV: policy.to_env()}, {}])
    assert _wait_all(ranks, 45) == [0, 0], _logs(tmp_path, "due")
    due = [json.loads((out / f"due-{r}.json").read_text()) for r in (0, 1)]
    steps = [[step for step, _ in d["saved"]] for d in due]
    assert steps[0] == steps[1] and steps[0], due
    first_at = due[0]["saved"][0][1]
    assert first_at >= 0.5, due  # not before the interval
    # after it, the hold measured (milliseconds) makes Young/Daly's interval far shorter
    assert due[0]["interval"] < 0.5 and due[1]["interval"] == DEFAULT_INTERVAL_SECONDS
    assert len(steps[0]) > 2
