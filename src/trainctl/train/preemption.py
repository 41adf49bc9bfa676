"""Graceful stop on SIGTERM, agreed by all ranks.

    preempt = PreemptionFlag()                 # installs a SIGTERM handler
    for batch in loader:
        ...                                    # one optimizer step
        step += 1
        if preempt.should_stop():              # True on every rank at the same step
            ckpt.save(step, model=model, optimizer=opt, sampler=sampler, epoch=epoch)
            preempt.exit(step)                 # exits with protocol.EXIT_PREEMPTED (85)

Spot interruptions reach the script as SIGTERM (from the trainctl agent, or from torchrun,
which forwards its own SIGTERM to the workers), possibly on one node only. The handler only
sets a local flag; `should_stop()` all-reduces it (MAX) so that every rank stops at the same
step, which is what a consistent emergency checkpoint needs. That costs one tiny all-reduce
per call; with `check_every=N` it communicates only every N-th call (every rank must call
`should_stop()` equally often).
"""

from __future__ import annotations

import signal
from typing import Any, NoReturn

from trainctl import protocol
from trainctl.train.context import TrainContext, _comm_device, _dist_ready, _global_rank, context

__all__ = ["PreemptionFlag", "saves_at_notice"]

# The flags installed in this process: a script with one checkpoints at a reclaim's notice,
# so reclaims do not size its checkpoint interval (trainctl.train.interval).
_installed: set[int] = set()


def saves_at_notice() -> bool:
    """Whether this process has a PreemptionFlag installed."""
    return bool(_installed)


class PreemptionFlag:
    """A SIGTERM flag that all ranks agree on (see the module docstring).

    The handler is installed on creation (`install=False` to defer); `uninstall()` puts
    the previous handlers back. Signal handlers can only be installed from the main thread.
    """

    def __init__(
        self,
        ctx: TrainContext | None = None,
        *,
        check_every: int = 1,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        install: bool = True,
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.ctx = ctx if ctx is not None else context()
        self.check_every = check_every
        self.signals = tuple(signals)
        self._requested = False
        self._agreed = False
        self._calls = 0
        self._previous: dict[int, Any] = {}
        if install:
            self.install()

    def install(self) -> PreemptionFlag:
        if not self._previous:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
            _installed.add(id(self))
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        _installed.discard(id(self))

    def __enter__(self) -> PreemptionFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: Any) -> None:
        self._requested = True  # nothing else: the signal may interrupt anything

    @property
    def requested(self) -> bool:
        """Whether this process got the signal (no communication)."""
        return self._requested

    def request(self) -> None:
        """Ask for a stop from code (e.g. a time budget), as if the signal had come."""
        self._requested = True

    def should_stop(self) -> bool:
        """True on every rank once any rank got the signal (see `check_every`)."""
        if self._agreed:
            return True
        self._calls += 1
        if self._calls % self.check_every:
            return False
        dist = _dist_ready()
        if dist is None:
            stop = self._requested
        else:
            import torch

            flag = torch.tensor([int(self._requested)], dtype=torch.int32)
            flag = flag.to(_comm_device(dist))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        self._agreed = stop
        return stop

    def exit(self, step: int | None = None) -> NoReturn:
        """Stop after the emergency checkpoint: rank 0 sends `preempted`, the process group
        is left behind after a barrier (call it on every rank, as after `should_stop()`), and
        the process exits with protocol.EXIT_PREEMPTED (85)."""
        from trainctl.train import _background
        from trainctl.train.finish import finish

        # The emergency checkpoint is whole (written in the background with async_save, and
        # announced with `checkpoint`) before anyone is told the job may resume from it.
        _background.join_all()
        if _global_rank(self.ctx) == 0:
            protocol.send("preempted", step=step)
        # Every rank is here at the same step (should_stop agreed): barrier, flush, and exit
        # without process-group destructors (they can deadlock or abort; see finish.py).
        finish(protocol.EXIT_PREEMPTED)
