"""The controller's lease: jobs/<job>/lease.json, renewed while a controller runs the job, so
other processes can tell a live controller from a dead one, and so that exactly one process
controls a job.

Every write of the lease is a compare and swap on the store (`Store.put_if`: S3's
If-None-Match/If-Match, a locked compare for file://): a controller takes a missing or stale
lease only if nobody wrote it since it looked, and renews it only while it is still the one
it wrote. Two clients that race to take over a job whose controller died: one wins, the other
gets LeaseHeld. A controller whose renewal finds someone else's lease has been taken over
(it was too slow, or thought dead): `lost` is set and it stops acting on the job.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from trainctl.clock import clock
from trainctl.errors import NotFoundError, TrainctlError
from trainctl.store import Store


class LeaseHeld(TrainctlError):
    pass


@dataclass(frozen=True)
class LeaseView:
    """What a reader knows of a job's controller."""

    holder: dict[str, Any] | None  # host, pid, started, renewed_at (None: no lease written)
    live: bool
    silent_seconds: float | None  # since the last renewal (None: never renewed)


def view_lease(lease: dict[str, Any] | None, seconds: float) -> LeaseView:
    """Whether the lease's holder is alive: renewed within `seconds`, not released, and (on
    this host) its process still exists, so a controller killed here is known dead at once."""
    try:
        renewed = float(lease["renewed_at"]) if lease else None
    except (KeyError, TypeError, ValueError):  # not a lease trainctl wrote: nobody holds it
        renewed = None
    if renewed is None or math.isnan(renewed):
        return LeaseView(lease, False, None)
    if "released_at" in lease:  # its controller let go of the job: nobody holds it now
        return LeaseView(lease, False, max(0.0, clock().time() - renewed))
    silent = max(0.0, clock().time() - renewed)
    if silent > seconds:
        return LeaseView(lease, False, silent)
    if same_machine(lease):
        from trainctl.procs import alive

        try:
            if not alive(int(lease.get("pid", 0))):  # gone, or a zombie nobody reaped yet
                return LeaseView(lease, False, silent)
        except (TypeError, ValueError, OverflowError):
            pass
    return LeaseView(lease, True, silent)


def lease_is_live(jobs: Any) -> bool:
    """Whether a controller holds the job's lease now (`jobs`: its JobStore): it runs the
    job, or is still tearing it down (the record turns terminal first)."""
    from trainctl.spec.settings import get_settings

    return view_lease(jobs.read_lease(), get_settings().lease_seconds).live


def boot_id() -> str:
    """This machine's boot: host names repeat across machines (two "ubuntu"s), boot ids
    don't. Empty where the kernel has none to give."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def same_machine(lease: dict[str, Any]) -> bool:
    """Whether the lease's holder runs on this machine (then its pid can be checked)."""
    if lease.get("host") != socket.gethostname():
        return False
    theirs, ours = lease.get("boot_id"), boot_id()
    return not (theirs and ours) or theirs == ours


class Lease:
    """Takes and renews a lease object for this process (see the module docstring): a job's
    jobs/<job>/lease.json, or a controller service's controllers/<id>/lease.json.
    `what` names the leased thing in errors ("job 'x'")."""

    def __init__(self, store: Store, key: str, seconds: float, what: str) -> None:
        self.store, self.key, self.what = store, key, what
        self.seconds = seconds
        self.holder: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "boot_id": boot_id(),
            "started": clock().time(),
        }
        self.lost = threading.Event()  # another process took the job over
        self._version: str | None = None
        self._writing = threading.Lock()  # a renewal and a publish() never race their versions
        self._stop = clock().event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)

    def _payload(self) -> bytes:
        return json.dumps({**self.holder, "renewed_at": clock().time()}).encode()

    def acquire(self) -> None:
        """Take the lease if nobody holds it (missing, released or stale); else LeaseHeld."""
        current: dict[str, Any] | None = None
        try:
            data, version = self.store.get_versioned(self.key)
        except NotFoundError:
            version = None
        else:
            try:
                current = json.loads(data)
            except ValueError:  # unreadable: stale; the compare still guards the write
                pass
        view = view_lease(current, self.seconds)
        ours = current and (current.get("host"), current.get("pid")) == (
            self.holder["host"],
            self.holder["pid"],
        )
        if view.live and not ours:
            assert current is not None
            raise LeaseHeld(
                f"{self.what} is held by pid {current.get('pid')} on {current.get('host')}"
            )
        written = self.store.put_if(self.key, self._payload(), version=version)
        if written is None:
            raise LeaseHeld(f"{self.what} was just taken by another process")
        self._version = written
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self._write()
            except Exception:  # a missed renewal is survivable; the next one retries
                continue
            if self.lost.is_set():
                return

    def _write(self) -> None:
        with self._writing:
            if self.lost.is_set() or self._version is None:
                return
            written = self.store.put_if(self.key, self._payload(), version=self._version)
            if written is None:  # someone took the job over: stop acting on it
                self.lost.set()
                return
            self._version = written

    def publish(self, **fields: Any) -> None:
        """Put `fields` in the lease now and in every renewal after: what its readers (the
        job's nodes, which read it every control_poll_seconds) are to learn. A write that
        fails now goes with the next renewal."""
        with self._writing:
            self.holder.update(fields)
        try:
            self._write()
        except Exception:
            pass

    def release(self) -> None:
        """Mark the lease released (readers and nodes see no controller), if still ours."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.lost.is_set() or self._version is None:
            return
        released = json.dumps({**self.holder, "released_at": clock().time()}).encode()
        try:
            self.store.put_if(self.key, released, version=self._version)
        except Exception:
            pass
