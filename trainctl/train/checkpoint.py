"""Sharded, atomic, resumable checkpoints in the layout the trainctl agent syncs.

    ckpt = Checkpointer(keep=3)                     # SM_CHECKPOINT_DIR, else ./checkpoints
    info = ckpt.restore(model=model, optimizer=opt, sampler=sampler)   # None: fresh start
    step, epoch = (info.step, info.epoch) if info else (0, 0)
    ...
    ckpt.save(step, model=model, optimizer=opt, sampler=sampler, epoch=epoch)

Every rank must call `save` (and `restore`) at the same step: they synchronise with
barriers when a process group is initialised.

On-disk format (the agent depends on it)::

    <checkpoint_dir>/step-<step:09d>/
        state.pt        global rank 0: {"step", "epoch", "model", "optimizer", "scheduler",
                        "scaler", "extra", "world_size"}; "model" is the state_dict of the
                        unwrapped model (no DDP "module." prefix)
        rank-<r>.pt     every rank r: {"rng": {"python", "numpy", "torch", "cuda"},
                        "sampler": sampler.state_dict() or None}
        meta.json       global rank 0, last: {"step", "epoch", "world_size", "files"}

Each file is written to `<name>.tmp` in the same directory and renamed into place, so a name
without `.tmp` is always a whole file to every reader (the agent included). Save order: every
rank writes its files, barrier, rank 0 writes meta.json, barrier; the training loop goes on
from there. Durability is background work: a thread of each rank fsyncs the files it wrote and
their directories, then (local rank 0 of each node) prunes old step directories. The next
`save`, `wait()` and `finish()` join it, and a normal interpreter exit waits for it, so the
loop is blocked only for the serialisation, as with a bare `torch.save` (bench/stall.py
measured fsync + prune in line at 2.3x a `torch.save`). The cost is that after a crash of the
machine itself (power loss, not a killed process) the newest step's files may be torn under a
meta.json; `restore` loads before trusting and falls back to the next older step, and the
store's copy, which the agent uploads on every checkpoint, is the durable one anyway. A step
directory is *complete* when meta.json exists and every file it lists exists. Nodes do not
share a file system: node 0 holds state.pt and meta.json, node k only its ranks' files; the
agent merges them in the store and restores the union on every node before the next attempt,
so completeness is judged at `restore`, never by `save`.

`restore` takes the newest complete step directory that every rank can read; a directory
whose files fail to load (truncated, corrupt) is skipped for the next older complete one.
RNG states (python, numpy, torch, CUDA) are restored last, so call `restore` after building
everything that consumes randomness, right before the training loop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl import protocol
from trainctl.train import _background
from trainctl.train.context import TrainContext, _dist_ready, _global_rank, _world_size, context
from trainctl.train.progress import _report_now

if TYPE_CHECKING:
    import torch

__all__ = [
    "Checkpointer",
    "CheckpointInfo",
    "META_FILE",
    "STATE_FILE",
    "is_complete",
    "rank_file_name",
    "step_dir_name",
    "unwrap_model",
]

STATE_FILE = "state.pt"
META_FILE = "meta.json"
_STEP_DIR = re.compile(r"^step-(\d{9,})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank}.pt"


@dataclass(frozen=True)
class CheckpointInfo:
    """What `Checkpointer.restore` resumed from."""

    step: int
    epoch: int
    extra: Any
    path: Path


def unwrap_model(model: Any) -> Any:
    """The module under DistributedDataParallel / DataParallel / torch.compile wrappers."""
    import torch
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _warn(msg: str) -> None:
    print(f"[trainctl.train] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # pruned meanwhile (a newer save of the same step): nothing to make durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Any) -> None:
    """write(f) into `<path>.tmp`, then rename it to `path` (durability: `_make_durable`)."""
    tmp = path.with_name(path.name + protocol.TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except Exception:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def _atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    _atomic_write(path, lambda f: torch.save(obj, f))


def _atomic_json(obj: Any, path: Path) -> None:
    _atomic_write(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()))


def step_dirs(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every step directory under `directory`, newest first."""
    try:
        entries = list(Path(directory).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def is_complete(step_dir: Path) -> dict[str, Any] | None:
    """meta.json's content if `step_dir` is complete (meta.json and all files it lists)."""
    try:
        meta = json.loads((Path(step_dir) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), list):
        return None
    files = meta["files"]
    if not all(isinstance(name, str) and (Path(step_dir) / name).is_file() for name in files):
        return None
    return meta


# ----------------------------------------------------------------------------- RNG


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _rng_state() -> dict[str, Any]:
    import random

    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import torch

    if state.get("python") is not None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"].cpu())
    np = _numpy()
    if np is not None and state.get("numpy") is not None:
        s = state["numpy"]
        keys = s["keys"].numpy().astype(np.uint32)
        np.random.set_state((s["kind"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"]))
    if state.get("cuda") is not None and torch.cuda.is_available():
        cuda_states = list(state["cuda"])
        for index in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda_states[index].cpu(), index)


# ----------------------------------------------------------------------------- Checkpointer


def _comm_device(dist: Any) -> torch.device:
    import torch

    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Checkpointer:
    """Save and restore training state in `directory` (default: the context's checkpoint_dir).

    `keep`: after each save, local rank 0 of every node deletes the step directories beyond
    the `keep` newest on its node (by step number, never the one just written and never a
    newer one); None keeps everything. Pruning runs in the background with the fsyncs:
    `wait()` for it.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        keep: int | None = 3,
        ctx: TrainContext | None = None,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 (or None to keep everything), got {keep}")
        self.ctx = ctx if ctx is not None else context()
        self.directory = Path(directory) if directory is not None else self.ctx.checkpoint_dir
        self.keep = keep
        self._durability: threading.Thread | None = None

    def wait(self) -> None:
        """Block until the last save's files are on disk and old steps are pruned."""
        thread, self._durability = self._durability, None
        if thread is not None:
            thread.join()
            _background.forget(thread)

    # ------------------------------------------------------------------ save

    def save(
        self,
        step: int,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: Any = None,
        epoch: int = 0,
        extra: Any = None,
    ) -> Path:
        """Write the checkpoint of `step` (all ranks must call it); returns its directory.

        `extra` (rank 0's value) is any picklable object stored in state.pt and handed back
        by `restore` (e.g. running metrics). Rank 0 then reports the step and sends the
        `checkpoint` control message.
        """
        if int(step) != step or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        self.wait()  # the previous save's fsyncs and pruning must not race this one
        dist = _dist_ready()
        rank, world = _global_rank(self.ctx), _world_size(self.ctx)
        step_dir = self.directory / step_dir_name(step)
        step_dir.mkdir(parents=True, exist_ok=True)
        # Saving a step again (after resuming from an older one): incomplete until rewritten.
        (step_dir / META_FILE).unlink(missing_ok=True)

        if rank == 0:
            state = {
                "step": step,
                "epoch": int(epoch),
                "model": unwrap_model(model).state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "extra": extra,
                "world_size": world,
            }
            _atomic_torch_save(state, step_dir / STATE_FILE)
        sampler_state = sampler.state_dict() if sampler is not None else None
        own = {"rng": _rng_state(), "sampler": sampler_state}
        written = [step_dir / rank_file_name(rank)]
        _atomic_torch_save(own, written[0])
        if rank == 0:
            written.append(step_dir / STATE_FILE)

        if dist is not None:
            dist.barrier()  # every rank's files are in place (on its own node)
        if rank == 0:
            files = [STATE_FILE] + [rank_file_name(r) for r in range(world)]
            meta = {"step": step, "epoch": int(epoch), "world_size": world, "files": files}
            _atomic_json(meta, step_dir / META_FILE)
            written.append(step_dir / META_FILE)
        if dist is not None:
            dist.barrier()  # nobody prunes or trains on before meta.json is written
        prune = self.ctx.local_rank == 0
        self._durability = _background.start(
            f"trainctl-checkpoint-{step}", lambda: self._make_durable(step, written, prune)
        )
        if rank == 0:
            _report_now(step)
        if self.ctx.local_rank == 0:
            # Every node's agent uploads its part at once on this message: a node lost
            # moments after a checkpoint then cannot leave it incomplete in the store.
            protocol.send("checkpoint", step=step)
        return step_dir

    def _make_durable(self, step: int, written: list[Path], prune: bool) -> None:
        """fsync this rank's files of `step` and their directories, then prune (background)."""
        for path in written:
            _fsync_file(path)
        if written:
            _fsync_dir(written[0].parent)
        _fsync_dir(self.directory)
        if prune:
            self._prune(step)

    def _prune(self, current: int) -> None:
        if self.keep is None:
            return
        for index, (step, path) in enumerate(step_dirs(self.directory)):
            if index >= self.keep and step < current:
                shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ restore

    def complete(self) -> list[tuple[int, Path, dict[str, Any]]]:
        """(step, directory, meta) of the complete step directories here, newest first."""
        found = []
        for step, path in step_dirs(self.directory):
            meta = is_complete(path)
            if meta is not None:
                found.append((step, path, meta))
        return found

    def latest_complete(self) -> Path | None:
        """The newest complete step directory on this node, or None."""
        found = self.complete()
        return found[0][1] if found else None

    def restore(
        self,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: Any = None,
        map_location: Any = None,
        weights_only: bool = False,
    ) -> CheckpointInfo | None:
        """Load the newest complete checkpoint that all ranks can read; None if there is none.

        All ranks must call it. The model state goes into the unwrapped model (DDP's
        `.module`), then optimizer, scheduler, scaler (those given), this rank's sampler
        position and finally this rank's RNG states. `map_location` applies to state.pt; by
        default it loads on the CPU (so the ranks of a node do not all allocate on the GPU it
        was saved from) and `load_state_dict` copies to the parameters' devices. Rank files
        always load on the CPU. The files are this job's own, so they are
        unpickled fully unless `weights_only=True`. If the world size changed since the
        save, RNG states are not restored and the sampler's position is rescaled.
        """
        dist = _dist_ready()
        rank, world = _global_rank(self.ctx), _world_size(self.ctx)
        candidates = self.complete()
        bound: int | None = None
        while True:
            mine = next((c for c in candidates if bound is None or c[0] <= bound), None)
            step = self._agree(dist, mine[0] if mine else -1)  # newest step all ranks have
            if step < 0:
                return None
            entry = next((c for c in candidates if c[0] == step), None)
            loaded = self._load(entry, rank, world, map_location, weights_only) if entry else None
            if self._agree(dist, 1 if loaded is not None else 0):
                break
            bound = step - 1
        assert loaded is not None and entry is not None
        state, own, saved_world = loaded
        _, path, meta = entry

        unwrap_model(model).load_state_dict(state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler") is not None:
            scaler.load_state_dict(state["scaler"])
        sampler_state = own.get("sampler")
        if sampler is not None and sampler_state is not None:
            if saved_world != world and "consumed" in sampler_state:
                # a per-rank position (ResumableDistributedSampler); a GlobalBatchSampler
                # counts global samples and needs no rescaling
                sampler_state = dict(sampler_state)
                consumed = int(sampler_state.get("consumed", 0)) * saved_world // world
                sampler_state["consumed"] = min(consumed, getattr(sampler, "num_samples", consumed))
            sampler.load_state_dict(sampler_state)
        if saved_world == world:
            _set_rng_state(own.get("rng") or {})
        elif rank == 0:
            _warn(f"world size changed {saved_world} -> {world}: RNG states not restored")

        epoch = int(state.get("epoch", meta.get("epoch", 0)))
        if rank == 0:
            protocol.send("resumed", step=step)
        return CheckpointInfo(step=step, epoch=epoch, extra=state.get("extra"), path=path)

    def _agree(self, dist: Any, value: int) -> int:
        """The minimum of `value` over all ranks (just `value` without a process group)."""
        if dist is None:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.int64, device=_comm_device(dist))
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def _load(
        self,
        entry: tuple[int, Path, dict[str, Any]],
        rank: int,
        world: int,
        map_location: Any,
        weights_only: bool,
    ) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        import torch

        _, path, meta = entry
        try:
            saved_world = int(meta.get("world_size", world))
            # Same world: this rank's own file. Resized world: rank 0's (for the sampler).
            name = rank_file_name(rank if saved_world == world else 0)
            if name not in meta["files"]:
                raise FileNotFoundError(f"{name} is not part of this checkpoint")
            state = torch.load(
                path / STATE_FILE,
                map_location="cpu" if map_location is None else map_location,
                weights_only=weights_only,
            )
            own = torch.load(path / name, map_location="cpu", weights_only=weights_only)
            if not isinstance(state, dict) or "model" not in state or not isinstance(own, dict):
                raise ValueError("unexpected content")
        except Exception as e:
            _warn(f"cannot load checkpoint {path}: {type(e).__name__}: {e}; trying an older one")
            return None
        return state, own, saved_world
