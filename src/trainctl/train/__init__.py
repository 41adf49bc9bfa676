"""trainctl.train: helpers for training scripts that survive preemption bit-exactly.

Import it from the script that trainctl (or a bare torchrun, or plain python) runs. It has no
cloud dependencies and imports torch only when a function needs it.

A resumable DDP loop::

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from trainctl.train import (Checkpointer, PreemptionFlag, ResumableDistributedSampler,
                                init_distributed, report_step)

    ctx = init_distributed()                     # gloo on CPU, nccl on CUDA, if world > 1
    preempt = PreemptionFlag(ctx)                # SIGTERM -> graceful stop
    torch.manual_seed(seed)
    model = build_model().to(ctx.device)
    ddp = DDP(model) if ctx.is_distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sampler = ResumableDistributedSampler(train_set, seed=seed)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)

    ckpt = Checkpointer(keep=3)                  # ctx.checkpoint_dir (SM_CHECKPOINT_DIR)
    info = ckpt.restore(model=ddp, optimizer=opt, sampler=sampler)   # RNG restored last
    step, start_epoch = (info.step, info.epoch) if info else (0, 0)

    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)                 # keeps the position in a resumed epoch
        for xb, yb in loader:
            ...                                  # forward, backward, opt.step()
            step += 1
            sampler.advance(len(yb))
            report_step(step)
            if preempt.should_stop():            # agreed by all ranks
                ckpt.save(step, model=ddp, optimizer=opt, sampler=sampler, epoch=epoch)
                preempt.exit(step)               # exit code 85: "preempted, resume me"
            if step % 100 == 0:
                ckpt.save(step, model=ddp, optimizer=opt, sampler=sampler, epoch=epoch)
    if ctx.is_chief:
        torch.save(model.state_dict(), ctx.model_dir / "model.pt")
    finish()                                     # barrier, flush, exit (see finish.py)

What is where:

- `context()` / `init_distributed()` / `TrainContext`: ranks, device, SM_* directories,
  channels and hyperparameters (trainctl.train.context).
- `Checkpointer` / `CheckpointInfo`: atomic sharded checkpoints in the layout the trainctl
  agent syncs: `step-<step:09d>/{state.pt, rank-<r>.pt, meta.json}`
  (trainctl.train.checkpoint); `due()` says when to save, at Young/Daly's interval for the
  job's interruptions (trainctl.train.interval).
- `ResumableDistributedSampler`: torch's DistributedSampler order plus exact mid-epoch
  resume (trainctl.train.sampler).
- `PreemptionFlag`: SIGTERM flag all-reduced across ranks, emergency exit with code 85
  (trainctl.train.preemption).
- `report_step`: throttled progress messages for the controller (trainctl.train.report).
- `batches`: a loader's batches, timed for `trainctl diagnose` (which can also substitute
  synthetic data through it) and for the job's goodput, whose data loading it measures
  (trainctl.train.diagnosis).
- `finish`: end the process without process-group destructors, which can deadlock at exit
  with gloo (trainctl.train.finish).
- `per_worker_batch`, `scaled_lr`, `warmup_lr`, `linear_warmup_scheduler`: large-batch
  training (trainctl.train.scaling).
- `GlobalBatchSampler`: a fixed global batch over any world size, for elastic jobs
  (trainctl.train.elastic).
- `AdaptiveBatch`: the batch size of most goodput from the gradient noise scale, the
  learning rate scaled by AdaScale's gain (trainctl.train.adaptive).

For bit-identical resumes also call `torch.use_deterministic_algorithms(True)` on CUDA, build the
model, optimizer and loader exactly as in a fresh run, and give the DataLoader its own
`generator` so that creating an iterator does not draw from the global RNG.
"""

from __future__ import annotations

from trainctl.train.adaptive import AdaptiveBatch
from trainctl.train.checkpoint import Checkpointer, CheckpointInfo, unwrap_model
from trainctl.train.context import TrainContext, context, init_distributed
from trainctl.train.diagnosis import batches
from trainctl.train.elastic import GlobalBatchSampler
from trainctl.train.finish import finish
from trainctl.train.preemption import PreemptionFlag
from trainctl.train.report import report_step
from trainctl.train.sampler import ResumableDistributedSampler
from trainctl.train.scaling import (
    linear_warmup_scheduler,
    per_worker_batch,
    scaled_lr,
    warmup_lr,
)

__all__ = [
    "AdaptiveBatch",
    "CheckpointInfo",
    "Checkpointer",
    "GlobalBatchSampler",
    "PreemptionFlag",
    "ResumableDistributedSampler",
    "TrainContext",
    "batches",
    "context",
    "finish",
    "init_distributed",
    "linear_warmup_scheduler",
    "per_worker_batch",
    "report_step",
    "scaled_lr",
    "unwrap_model",
    "warmup_lr",
]
