"""How a checkpoint's state is laid out, written and read (trainctl.train.checkpoint's
Checkpointer works with these): the step directories and when one is complete, files written
whole (a temporary name, fsync, rename), the RNG states, sharded models through
torch.distributed.checkpoint, and the host-memory copy an async save writes from."""

from __future__ import annotations

import json
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl import protocol
from trainctl.train.context import (
    _dist_ready,
)

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


class CheckpointContentError(RuntimeError):
    """A checkpoint holds objects that a safe (weights_only) load refuses to unpickle."""


def _unsafe_content(exc: BaseException) -> str | None:
    """The global a weights_only load refused ('__main__.X'), if that is what `exc` is."""
    import pickle
    import re

    if not isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" not in str(exc):
        return None
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))  # else not a refusal: a corrupt file
    return found.group(1) if found else None


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


@dataclass
class _StepWrite:
    """One rank's save of one step: where, and the files it wrote (for the fsyncs)."""

    step: int
    epoch: int
    rank: int
    world: int
    step_dir: Path
    local_leader: bool  # local rank 0: prunes the node's old steps, tells the agent
    written: list[Path] = field(default_factory=list)
    sharded: bool = False


_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None))
SHARDED_DIR = "dcp"  # in a step directory: the model's and optimizer's shards


def _has_sharded_parameters(model: Any) -> bool:
    """FSDP (its parameters are DTensors, or the model is an FSDP1 wrapper)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    if isinstance(model, FullyShardedDataParallel):
        return True
    return any(isinstance(p, DTensor) for p in model.parameters())


def _sharded_files(world: int) -> list[str]:
    """The files torch.distributed.checkpoint's file system writer makes for `world` ranks
    (one file a rank, plus the coordinator's metadata)."""
    return [f"{SHARDED_DIR}/.metadata"] + [f"{SHARDED_DIR}/__{r}_0.distcp" for r in range(world)]


def _sharded_content(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _sharded_save(
    model: Any, optimizer: Any, step_dir: Path, dist: Any, group: Any, *, background: bool
) -> Any:
    """The model's and optimizer's shards with torch.distributed.checkpoint (each rank its
    own; resumable on another world size). In line, or (`background`) DCP's async_save:
    the shards are copied now and written in DCP's thread; its future is returned."""
    import torch.distributed.checkpoint as dcp

    content = _sharded_content(model, optimizer)
    target = step_dir / SHARDED_DIR
    target.mkdir(parents=True, exist_ok=True)
    if background and dist is not None:
        return dcp.async_save(content, checkpoint_id=str(target), process_group=group)
    dcp.save(content, checkpoint_id=str(target), no_dist=dist is None)
    return None


def _sharded_load(model: Any, optimizer: Any, source: Path) -> None:
    """Load the shards into `model` (and `optimizer`) whatever the world size that saved
    them: DCP reads the pieces each rank's shards need."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    content = _sharded_content(model, optimizer)
    dcp.load(content, checkpoint_id=str(source), no_dist=not _dist_ready())
    if optimizer is None:
        set_model_state_dict(model, content["model"])
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=content["model"],
            optim_state_dict=content["optimizer"],
        )


@contextmanager
def _copy_threads(local_world_size: int) -> Iterator[None]:
    """The copy is memory-bound and the loop waits for it: it gets this rank's share of the
    node's cores for its few milliseconds, whatever the loop's own thread count (a copy of
    110 MB: 12 ms on one thread, 8 ms on two, on the 2-core test machine)."""
    import torch

    before = torch.get_num_threads()
    share = max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    if share > before:
        torch.set_num_threads(share)
    try:
        yield
    finally:
        if share > before:
            torch.set_num_threads(before)


def _snapshot(value: Any, path: str, buffers: dict[str, Any]) -> Any:
    """A copy of `value` that training can no longer change: tensors copied to host memory
    (pinned from a GPU, waited for before returning), containers rebuilt, other values
    deep-copied once they are known to pickle. TypeError names a value that cannot be.

    `buffers` keeps the host copies from one save to the next, by place in the state: a
    copy into memory already mapped (and pinned) is several times faster than into fresh
    pages. The caller makes sure the last save's writer is done with them."""
    import copy
    import pickle

    import torch

    copies: dict[int, Any] = {}  # a tensor held twice (tied weights) is copied once
    on_gpu = False

    def visit(item: Any, where: str) -> Any:
        nonlocal on_gpu
        if isinstance(item, _IMMUTABLE):
            return item
        if isinstance(item, torch.Tensor):
            if id(item) not in copies:
                tensor = item.detach()
                on_gpu = on_gpu or tensor.is_cuda
                host = buffers.get(where)
                if (
                    host is None
                    or host.size() != tensor.size()
                    or host.stride() != tensor.stride()
                    or host.dtype != tensor.dtype
                ):
                    host = torch.empty_strided(
                        tensor.size(),
                        tensor.stride(),
                        dtype=tensor.dtype,
                        device="cpu",
                        pin_memory=tensor.is_cuda,
                    )
                    buffers[where] = host
                host.copy_(tensor, non_blocking=tensor.is_cuda)
                copies[id(item)] = host
            return copies[id(item)]
        if isinstance(item, dict):
            out = type(item)() if type(item) in (dict, OrderedDict) else {}
            for key, sub in item.items():
                out[key] = visit(sub, f"{where}[{key!r}]")
            metadata = getattr(item, "_metadata", None)  # a state_dict's version info
            if metadata is not None:
                out._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
            return out
        if type(item) in (list, tuple):
            return type(item)(visit(sub, f"{where}[{i}]") for i, sub in enumerate(item))
        try:
            pickle.dumps(item)
        except Exception as exc:
            raise TypeError(
                f"Checkpointer.save: {where} cannot be saved ({type(item).__name__}: {exc}); "
                "a checkpoint holds picklable values only"
            ) from None
        return copy.deepcopy(item)

    result = visit(value, path)
    if on_gpu:
        torch.cuda.synchronize()  # the pinned copies are whole before the loop goes on
    return result
