"""Where a training process stands: its ranks, device, directories and hyperparameters.

    from trainctl.train import init_distributed

    ctx = init_distributed()          # process group up (if world_size > 1), device set
    model.to(ctx.device)
    if ctx.is_chief:
        torch.save(model.state_dict(), ctx.model_dir / "model.pt")

`context()` only reads the environment, so it gives the same answer under trainctl (SM_*
variables plus torchrun's RANK/LOCAL_RANK/WORLD_SIZE), under a bare torchrun (no SM_*:
directories default to ./model, ./checkpoints and ./output in the working directory) and in a
plain single process (rank 0 of 1).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["TrainContext", "context", "init_distributed"]


@dataclass(frozen=True)
class TrainContext:
    """The identity and environment of one training process (see `context()`)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    device: torch.device | None = None
    model_dir: Path = field(default_factory=lambda: Path.cwd() / "model")
    checkpoint_dir: Path = field(default_factory=lambda: Path.cwd() / "checkpoints")
    output_data_dir: Path = field(default_factory=lambda: Path.cwd() / "output")
    channels: dict[str, Path] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """Global rank 0: the process that writes the model, metrics and shared state."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _int_env(env: dict[str, str] | os._Environ[str], *names: str, default: int) -> int:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def _env_suffix(name: str) -> str:
    # Same rule as trainctl.spec.job.env_suffix (not imported: a training script loads no
    # trainctl code beyond trainctl.train).
    return re.sub(r"[^A-Z0-9_]", "_", name.upper())


def _channels(env: dict[str, str] | os._Environ[str]) -> dict[str, Path]:
    channels: dict[str, Path] = {}
    try:
        names = json.loads(env.get("SM_CHANNELS") or "[]")
    except json.JSONDecodeError:
        names = []
    input_dir = env.get("SM_INPUT_DIR")
    for name in names if isinstance(names, list) else []:
        value = env.get(f"SM_CHANNEL_{_env_suffix(str(name))}")
        if value:
            channels[str(name)] = Path(value)
        elif input_dir:
            channels[str(name)] = Path(input_dir) / "data" / str(name)
    # Channels given only as SM_CHANNEL_<NAME> (hand-written environments): lower-cased names.
    known = {_env_suffix(name) for name in channels}
    for key, value in env.items():
        if key.startswith("SM_CHANNEL_") and value:
            suffix = key[len("SM_CHANNEL_") :]
            if suffix not in known:
                channels[suffix.lower()] = Path(value)
    return channels


def _hyperparameters(env: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    try:
        hps = json.loads(env.get("SM_HPS") or "{}")
    except json.JSONDecodeError:
        return {}
    return hps if isinstance(hps, dict) else {}


def _default_device(local_rank: int) -> torch.device:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def context(env: dict[str, str] | None = None) -> TrainContext:
    """This process's `TrainContext`, read from the environment (or `env` if given).

    Ranks come from torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK;
    the node rank from SM_CURRENT_HOST_RANK when trainctl set it. Directories come from
    SM_MODEL_DIR, SM_CHECKPOINT_DIR and SM_OUTPUT_DATA_DIR, defaulting to ./model,
    ./checkpoints and ./output (made absolute). Channels are SM_CHANNELS with their
    SM_CHANNEL_<NAME> paths; hyperparameters are the SM_HPS JSON object (or {}).
    `device` is cuda:<local_rank> when CUDA is available, else cpu (this imports torch).
    """
    env = os.environ if env is None else env
    world_size = _int_env(env, "WORLD_SIZE", default=1)
    rank = _int_env(env, "RANK", default=0)
    local_rank = _int_env(env, "LOCAL_RANK", default=0)
    local_world_size = _int_env(env, "LOCAL_WORLD_SIZE", default=1 if world_size == 1 else 0)
    if local_world_size <= 0:  # RANK/WORLD_SIZE set by hand without LOCAL_WORLD_SIZE
        local_world_size = world_size
    node_rank = _int_env(
        env, "SM_CURRENT_HOST_RANK", "GROUP_RANK", default=rank // max(local_world_size, 1)
    )
    cwd = Path.cwd()
    return TrainContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        device=_default_device(local_rank),
        model_dir=Path(env.get("SM_MODEL_DIR") or cwd / "model"),
        checkpoint_dir=Path(env.get("SM_CHECKPOINT_DIR") or cwd / "checkpoints"),
        output_data_dir=Path(env.get("SM_OUTPUT_DATA_DIR") or cwd / "output"),
        channels=_channels(env),
        hyperparameters=_hyperparameters(env),
    )


def init_distributed(backend: str | None = None, **kwargs: Any) -> TrainContext:
    """Set the CUDA device and start the default process group; return `context()`.

    The process group is started only when WORLD_SIZE > 1 and none is initialised yet, with
    `backend` or else nccl on CUDA and gloo on CPU. MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE
    come from torchrun (env:// rendezvous). Extra keyword arguments (e.g. `timeout`) go to
    `torch.distributed.init_process_group`. Safe to call more than once.
    """
    import torch

    ctx = context()
    assert ctx.device is not None
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if ctx.world_size > 1:
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this build of torch")
        if not dist.is_initialized():
            if backend is None:
                backend = "nccl" if ctx.device.type == "cuda" else "gloo"
            if ctx.device.type == "cuda" and "device_id" not in kwargs:
                kwargs["device_id"] = ctx.device
            dist.init_process_group(backend=backend, **kwargs)
    return ctx


def _comm_device(dist: Any) -> torch.device:
    """Where a collective's tensor lives: the GPU under NCCL, else the CPU."""
    import torch

    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _dist_ready() -> Any:
    """torch.distributed if a process group is up, else None (never imports torch itself)."""
    import sys

    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _global_rank(ctx: TrainContext | None = None) -> int:
    dist = _dist_ready()
    if dist is not None:
        return dist.get_rank()
    if ctx is not None:
        return ctx.rank
    return _int_env(os.environ, "RANK", default=0)


def _world_size(ctx: TrainContext | None = None) -> int:
    dist = _dist_ready()
    if dist is not None:
        return dist.get_world_size()
    if ctx is not None:
        return ctx.world_size
    return _int_env(os.environ, "WORLD_SIZE", default=1)
