"""The controller's lease: jobs/<job>/lease.json, renewed while a controller runs the job, so
other processes can tell a live controller from a dead one."""

from __future__ import annotations

import os
import socket
import threading
import time

from trainctl.errors import TrainctlError
from trainctl.record import JobStore


class LeaseHeld(TrainctlError):
    pass


class Lease:
    """Renews jobs/<job>/lease.json so other processes can tell a live controller."""

    def __init__(self, jobs: JobStore, seconds: float) -> None:
        self.jobs = jobs
        self.seconds = seconds
        self.holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)

    def acquire(self) -> None:
        current = self.jobs.read_lease()
        if current and time.time() - float(current.get("renewed_at", 0)) < self.seconds:
            if (current.get("host"), current.get("pid")) != (
                self.holder["host"],
                self.holder["pid"],
            ):
                raise LeaseHeld(
                    f"job {self.jobs.name!r} is controlled by pid {current.get('pid')} on "
                    f"{current.get('host')}"
                )
        self.jobs.write_lease(self.holder)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.jobs.write_lease(self.holder)
            except Exception:  # a missed renewal is survivable; the next one retries
                pass

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.jobs.release_lease()
        except Exception:
            pass
