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
        dcp/            sharded models (FSDP: parameters are DTensors, or `sharded=True`):
                        the model's and optimizer's shards, written by every rank with
                        torch.distributed.checkpoint (`__<r>_0.distcp`, and rank 0's
                        `.metadata`); state.pt's "model" and "optimizer" are then None and
                        its "sharded" names the directory. `restore` reads them back on any
                        world size (DCP reshards), so a job can resume on fewer or more nodes.

Each file is written to `<name>.tmp` in the same directory and renamed into place, so a name
without `.tmp` is always a whole file to every reader (the agent included). Save order: every
rank writes its files, the ranks agree that all did, rank 0 writes meta.json, barrier. By
default (`async_save`) that whole sequence runs in a background thread of each rank on a copy
of the state taken in host memory, and the loop is blocked only for the copy; with
`async_save=False` the loop waits for the writes, as with a bare `torch.save`. Durability is
background work either way: the thread fsyncs the files it wrote and their directories, then
(local rank 0 of each node) prunes old step directories. The next `save`, `wait()` and
`finish()` join it, and a normal interpreter exit waits for it (bench/stall.py measured
fsync + prune in line at 2.3x a `torch.save`). The cost is that after a crash of the
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

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from trainctl import protocol
from trainctl.train import _background, diagnosis, interval
from trainctl.train.context import (
    TrainContext,
    _comm_device,
    _dist_ready,
    _global_rank,
    _world_size,
    context,
)
from trainctl.train.preemption import saves_at_notice
from trainctl.train.report import _report_now
from trainctl.train.state_io import (
    META_FILE,
    SHARDED_DIR,
    STATE_FILE,
    CheckpointContentError,
    CheckpointInfo,
    _atomic_json,
    _atomic_torch_save,
    _copy_threads,
    _fsync_dir,
    _fsync_file,
    _has_sharded_parameters,
    _rng_state,
    _set_rng_state,
    _sharded_files,
    _sharded_load,
    _sharded_save,
    _snapshot,
    _StepWrite,
    _unsafe_content,
    _warn,
    is_complete,
    rank_file_name,
    step_dir_name,
    step_dirs,
    unwrap_model,
)

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


def _global_state(
    step: int,
    epoch: int,
    world: int,
    sharded: bool,
    extra: Any,
    *,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    scaler: Any,
) -> dict[str, Any]:
    """Rank 0's state.pt: the model and optimizer (None where DCP writes them sharded), the
    scheduler, the scaler, the step, the user's `extra`."""
    return {
        "step": step,
        "epoch": int(epoch),
        "model": None if sharded else unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None and not sharded else None,
        "sharded": SHARDED_DIR if sharded else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "extra": extra,
        "world_size": world,
    }


class Checkpointer:
    """Save and restore training state in `directory` (default: the context's checkpoint_dir).

    `keep`: after each save, local rank 0 of every node deletes the step directories beyond
    the `keep` newest on its node (by step number, never the one just written and never a
    newer one); None keeps everything. Pruning runs in the background with the fsyncs:
    `wait()` for it.

    `async_save` (default on; off with False or TRAINCTL_ASYNC_CHECKPOINT=0): `save` blocks
    the loop only for a copy of the state in host memory (pinned buffers from a GPU); the
    serialisation, the writes, meta.json, the fsyncs and the agent's upload happen in a
    background thread of each rank, which agree through a gloo group of their own. At most
    one save is in flight: a `save` while the previous one is still being written waits for
    it first (so saving more often than a write takes turns the stall back into a write).
    `finish()` and a normal exit wait for the last one, so the emergency checkpoint of a
    preemption is whole before the process ends. A value in the state that cannot be pickled
    is refused by `save` itself (TypeError naming it), before anything is written.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        keep: int | None = 3,
        ctx: TrainContext | None = None,
        *,
        async_save: bool | None = None,
        sharded: bool | None = None,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 (or None to keep everything), got {keep}")
        self.ctx = ctx if ctx is not None else context()
        self.directory = Path(directory) if directory is not None else self.ctx.checkpoint_dir
        self.keep = keep
        if async_save is None:
            async_save = os.environ.get("TRAINCTL_ASYNC_CHECKPOINT", "1") not in ("0", "false")
        self.async_save = bool(async_save)
        self.sharded = sharded  # None: when the model's parameters are sharded (FSDP)
        self._durability: threading.Thread | None = None
        self._failure: BaseException | None = None  # of the last background write
        self._group: Any = None  # the gloo group of the background writers
        self._buffers: dict[str, Any] = {}  # host copies of the state, reused (async_save)
        # What due() keeps the interval by: the controller's policy, this process's saves.
        self._policy = interval.CheckpointPolicy.from_env()
        self._last_save = time.monotonic()
        self._saves = 0
        self._held_seconds = 0.0  # the loop's, over every save
        self._write_seconds = 0.0  # the last save's background write

    def interval_seconds(self) -> float:
        """The interval `due()` keeps: Young/Daly's (trainctl.train.interval) for the job's
        rate of interruptions that lose work, which the controller passes at each attempt's
        start, and this process's own saves (their mean hold on the loop; a save is never due
        before the last one is written); reclaims count only without a PreemptionFlag. Outside
        trainctl, every 30 minutes."""
        if self._policy is None:
            return interval.DEFAULT_INTERVAL_SECONDS
        return self._policy.interval_seconds(
            self._held_seconds / self._saves if self._saves else None,
            saves_at_notice=saves_at_notice(),
            write_seconds=self._write_seconds,
        )

    def due(self) -> bool:
        """Whether to save now: `interval_seconds()` have passed since the last save (or since
        this Checkpointer was made). Rank 0 decides and every rank gets its answer (one tiny
        broadcast a call), so all ranks save at the same step::

            if ckpt.due():
                ckpt.save(step, model=model, optimizer=opt)
        """
        rank = _global_rank(self.ctx)
        want = rank == 0 and time.monotonic() - self._last_save >= self.interval_seconds()
        dist = _dist_ready()
        if dist is None:
            return want
        import torch

        flag = torch.tensor([int(want)], dtype=torch.int32, device=_comm_device(dist))
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _saved(self, held: float) -> None:
        """A save held the loop `held` seconds (its write may go on in the background)."""
        self._saves += 1
        self._held_seconds += held
        self._last_save = time.monotonic()
        diagnosis.checkpoint_saved(held)
        if _global_rank(self.ctx) == 0:  # the job's checkpoint stalls (record.goodput)
            protocol.send("checkpoint_stall", seconds=round(held, 4))

    def wait(self) -> None:
        """Block until the last save is written (async), on disk and old steps are pruned;
        re-raises what made an asynchronous write fail."""
        thread, self._durability = self._durability, None
        if thread is not None:
            thread.join()
            _background.forget(thread)
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"the last checkpoint could not be written: {failure}") from failure

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
        `checkpoint` control message (from the background writer once the step is whole,
        with async_save).
        """
        if int(step) != step or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        began = time.perf_counter()
        self.wait()  # one save in flight at most; its fsyncs and pruning must not race this
        dist = _dist_ready()
        rank, world = _global_rank(self.ctx), _world_size(self.ctx)
        step_dir = self.directory / step_dir_name(step)
        sharded = self._sharded(model)
        state: dict[str, Any] | None = None
        if rank == 0:
            parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
            state = _global_state(step, epoch, world, sharded, extra, scaler=scaler, **parts)
        own = {
            "rng": _rng_state(),
            "sampler": sampler.state_dict() if sampler is not None else None,
        }
        write = _StepWrite(
            step, int(epoch), rank, world, step_dir, self.ctx.local_rank == 0, sharded=sharded
        )
        if not self.async_save:
            if sharded:
                _sharded_save(model, optimizer, step_dir, dist, None, background=False)
            self._save_in_line(write, state, own, dist, began)
            return step_dir
        # The loop goes on once the state is copied: the copy is what gets written.
        with _copy_threads(self.ctx.local_world_size):
            if state is not None:
                state = _snapshot(state, "the checkpoint state", self._buffers)
            own = _snapshot(own, "the rank state", self._buffers)
        group = self._writers_group(dist, world)
        # Sharded state: DCP's own asynchronous save copies each rank's shards now and writes
        # them in a thread of its own, through the writers' group.
        pending = (
            _sharded_save(model, optimizer, step_dir, dist, group, background=True)
            if sharded
            else None
        )
        if rank == 0:
            _report_now(step)

        def background() -> None:
            writing = time.perf_counter()
            try:
                if pending is not None:
                    pending.result()
                self._write(write, state, own, dist, group)
                self._make_durable(write)
            except BaseException as exc:
                self._failure = exc
                raise
            self._write_seconds = time.perf_counter() - writing
            diagnosis.checkpoint_written(self._write_seconds)

        self._durability = _background.start(f"trainctl-checkpoint-{step}", background)
        self._saved(time.perf_counter() - began)
        return step_dir

    def _save_in_line(
        self, write: _StepWrite, state: Any, own: dict[str, Any], dist: Any, began: float
    ) -> None:
        """`save` with async_save=False: the loop waits for the writes (durability is still
        background work)."""
        self._write(write, state, own, dist, None)
        self._durability = _background.start(
            f"trainctl-checkpoint-{write.step}", lambda: self._make_durable(write)
        )
        if write.rank == 0:
            _report_now(write.step)
        held = time.perf_counter() - began
        self._saved(held)
        self._write_seconds = held
        diagnosis.checkpoint_written(held)

    def _sharded(self, model: Any) -> bool:
        if self.sharded is not None:
            return self.sharded
        return _has_sharded_parameters(model)

    def _writers_group(self, dist: Any, world: int) -> Any:
        """A gloo group for the background writers' agreement (collectives on the training
        group from another thread would race the loop's own); made on the first save, which
        every rank calls at the same step."""
        if dist is None or world == 1:
            return None
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _write(
        self, write: _StepWrite, state: Any, own: dict[str, Any], dist: Any, group: Any
    ) -> None:
        """Every rank's files, then (once every rank wrote its own) rank 0's meta.json; the
        `checkpoint` message once the step is whole. `group`: the process group the ranks
        agree through (the training group in line, the writers' group in the background)."""
        step_dir = write.step_dir
        ok = 1
        error: BaseException | None = None
        try:
            step_dir.mkdir(parents=True, exist_ok=True)
            # Saving a step again (after resuming from an older one): incomplete until rewritten.
            (step_dir / META_FILE).unlink(missing_ok=True)
            if state is not None:
                _atomic_torch_save(state, step_dir / STATE_FILE)
                write.written.append(step_dir / STATE_FILE)
            _atomic_torch_save(own, step_dir / rank_file_name(write.rank))
            write.written.append(step_dir / rank_file_name(write.rank))
        except BaseException as exc:  # still agree with the others, then fail
            ok, error = 0, exc
        if dist is not None:
            ok = self._agree_all(dist, group, ok)  # every rank's files are in place (or not)
        if error is not None:
            raise error
        if not ok:
            raise RuntimeError(f"another rank could not write its part of step {write.step}")
        if write.rank == 0:
            files = [STATE_FILE] + [rank_file_name(r) for r in range(write.world)]
            if write.sharded:
                files += _sharded_files(write.world)
            meta = {"step": write.step, "epoch": write.epoch, "world_size": write.world}
            _atomic_json({**meta, "files": files}, step_dir / META_FILE)
            write.written.append(step_dir / META_FILE)
        if dist is not None:
            dist.barrier(group=group)  # nobody prunes or trains on before meta.json is written
        if write.local_leader:
            # Every node's agent uploads its part at once on this message: a node lost
            # moments after a checkpoint then cannot leave it incomplete in the store.
            protocol.send("checkpoint", step=write.step)

    def _agree_all(self, dist: Any, group: Any, ok: int) -> int:
        import torch

        device = torch.device("cpu") if group is not None else _comm_device(dist)
        flag = torch.tensor([ok], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return int(flag.item())

    def _make_durable(self, write: _StepWrite) -> None:
        """fsync this rank's files of the step and their directories, then prune."""
        for path in write.written:
            _fsync_file(path)
        if write.written:
            _fsync_dir(write.step_dir)
        _fsync_dir(self.directory)
        if write.local_leader:
            self._prune(write.step)

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
        weights_only: bool = True,
    ) -> CheckpointInfo | None:
        """Load the newest complete checkpoint that all ranks can read; None if there is none.

        All ranks must call it. The model state goes into the unwrapped model (DDP's
        `.module`), then optimizer, scheduler, scaler (those given), this rank's sampler
        position and finally this rank's RNG states. `map_location` applies to state.pt; by
        default it loads on the CPU (so the ranks of a node do not all allocate on the GPU it
        was saved from) and `load_state_dict` copies to the parameters' devices. Rank files
        always load on the CPU. The files come from the store, which others may write: they
        load with `weights_only=True` (tensors, numbers, strings and containers: all that
        `save` writes itself), so a planted file cannot run code here. An `extra` of your own
        classes needs `weights_only=False` (or `torch.serialization.add_safe_globals`). If
        the world size changed since the save, RNG states are not restored and the
        sampler's position is rescaled.
        """
        self.wait()  # a save of this process still being written
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

        if state.get("sharded"):
            _sharded_load(model, optimizer, path / str(state["sharded"]))
        else:
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
            if state.get("sharded") and not (path / str(state["sharded"])).is_dir():
                raise FileNotFoundError(f"{state['sharded']}/ is not part of this checkpoint")
        except Exception as e:
            if weights_only and (refused := _unsafe_content(e)):
                raise CheckpointContentError(
                    f"checkpoint {path} holds {refused}, which a safe load (weights_only=True) "
                    "does not unpickle; if you trust it (an `extra` of your own classes), "
                    "call restore(..., weights_only=False)"
                ) from None
            _warn(f"cannot load checkpoint {path}: {type(e).__name__}: {e}; trying an older one")
            return None
        return state, own, saved_world
