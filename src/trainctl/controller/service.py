"""A controller service: one process supervising every job assigned to it, on a host that is
not the submitter's (an SSH host, trainctl's EC2 controller instance), so a job outlives the
laptop that submitted it.

    python -m trainctl.controller serve --store URI --id ID [--idle-seconds S]

Store layout (the store is the only channel between clients and the service):

    controllers/<id>/lease.json        the service's lease (a compare-and-swap one, as a job's)
    controllers/<id>/jobs/<job>        an assignment: the service runs that job's controller

Each assigned job gets a `Controller` in a thread of its own, exactly the controller a
laptop would run (it takes the job's lease, adopts live nodes after a takeover, relaunches);
if another process holds the job's lease, the service follows the job and takes it over
should that controller be lost. An assignment is deleted when its job has ended. With no job
for `idle_seconds`, the service releases its lease and exits, after running its `on_idle`
action (an EC2 controller terminates its own instance).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from trainctl.record.jobstore import JobStore
from trainctl.record.keys import now_iso
from trainctl.spec.settings import get_settings
from trainctl.store import Store

SERVICE_POLL_SECONDS = 1.0


class ServiceKeys:
    def __init__(self, service_id: str) -> None:
        self.id = service_id
        self.prefix = f"controllers/{service_id}"
        self.lease = f"{self.prefix}/lease.json"
        self.jobs = f"{self.prefix}/jobs/"

    def assignment(self, job: str) -> str:
        return f"{self.jobs}{job}"


def assign(store: Store, service_id: str, job: str, **details: Any) -> None:
    """Ask the service `service_id` to run `job`'s controller."""
    body = {"job": job, "assigned_at": now_iso(), **details}
    store.put_text(ServiceKeys(service_id).assignment(job), json.dumps(body))


def assigned_jobs(store: Store, service_id: str) -> list[str]:
    prefix = ServiceKeys(service_id).jobs
    names = (info.key[len(prefix) :] for info in store.list(prefix))
    return [name for name in names if name and "/" not in name]


def read_service_lease(store: Store, service_id: str) -> dict[str, Any] | None:
    from trainctl.errors import NotFoundError

    try:
        return dict(json.loads(store.get_text(ServiceKeys(service_id).lease)))
    except (NotFoundError, ValueError):
        return None


def service_is_live(store: Store, service_id: str) -> bool:
    from trainctl.controller.lease import view_lease

    return view_lease(read_service_lease(store, service_id), get_settings().lease_seconds).live


class ControllerService:
    def __init__(
        self,
        store: Store,
        service_id: str,
        *,
        idle_seconds: float,
        on_idle: Callable[[], None] | None = None,
        log: Any = None,
        holder: dict[str, Any] | None = None,
    ) -> None:
        """`holder`: extra fields of the service's lease (an EC2 controller's instance id)."""
        self.store = store
        self.keys = ServiceKeys(service_id)
        self.idle_seconds = idle_seconds
        self.on_idle = on_idle
        self.log = log or sys.stdout
        self.holder = holder or {}
        self.running: dict[str, threading.Thread] = {}
        self.finished: list[str] = []
        self._stop = threading.Event()

    def say(self, message: str) -> None:
        print(f"{now_iso()} {message}", file=self.log, flush=True)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Serve until idle (0), or until another service holds the lease (0: it serves)."""
        from trainctl.controller.lease import Lease, LeaseHeld

        lease = Lease(
            self.store,
            self.keys.lease,
            get_settings().lease_seconds,
            f"controller service {self.keys.id!r}",
        )
        lease.holder.update(self.holder)
        try:
            lease.acquire()
        except LeaseHeld as exc:
            self.say(f"not serving: {exc}")
            return 0
        self.say(f"serving {self.store.uri} as {self.keys.id} on {socket.gethostname()}")
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set() and not lease.lost.is_set():
                assigned = assigned_jobs(self.store, self.keys.id)
                for job in assigned:
                    if job not in self.running:
                        self._start(job)
                for job, thread in list(self.running.items()):
                    if not thread.is_alive():
                        del self.running[job]
                        self.finished.append(job)
                        self.store.delete(self.keys.assignment(job))
                        self.say(f"job {job}: done")
                if self.running or assigned:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.idle_seconds:
                    self.say(f"idle for {self.idle_seconds:.0f} s: exiting")
                    break
                self._stop.wait(SERVICE_POLL_SECONDS)
        finally:
            lease.release()
        if self.on_idle is not None and not self._stop.is_set():
            self.on_idle()
        return 0

    def _start(self, job: str) -> None:
        thread = threading.Thread(target=self._run_job, args=(job,), name=f"job-{job}", daemon=True)
        self.running[job] = thread
        self.say(f"job {job}: controlling")
        thread.start()

    def _run_job(self, job: str) -> None:
        """The job's controller; if another process controls it, follow it (and take it over
        should that one be lost) until the job ends."""
        from trainctl.controller.controller import Controller
        from trainctl.controller.lease import LeaseHeld
        from trainctl.controller.supervise import supervise
        from trainctl.errors import NotFoundError

        try:
            try:
                record = Controller(self.store, job).run()
            except LeaseHeld:
                record = supervise(self.store, job)
            while not record.state.is_terminal():  # lost its lease to another controller
                record = supervise(self.store, job)
            self.say(f"job {job}: {record.state.value}")
        except NotFoundError:
            self.say(f"job {job}: no such job in {self.store.uri}; assignment dropped")
        except Exception as exc:  # one job's error must not end the others' controller
            self.say(f"job {job}: controller error: {type(exc).__name__}: {exc}")


def job_service(jobs: JobStore) -> str | None:
    """The service a job was assigned to (from its record's spec), or None for a local one."""
    from trainctl.spec.controller import controller_target

    record = jobs.load()
    target = controller_target(record.spec.controller)
    return target.service_id if target.remote else None
