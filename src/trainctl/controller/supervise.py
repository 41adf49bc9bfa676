"""Following a job from any process that can read its store: what readers are told of its
controller, and taking the job over when that controller is lost."""

from __future__ import annotations

import time
from typing import Any

from trainctl.record.jobstore import JobStore
from trainctl.record.keys import parse_iso
from trainctl.record.models import JobRecord
from trainctl.spec.settings import get_settings
from trainctl.store import Store


def controller_view(jobs: JobStore, record: JobRecord) -> dict[str, Any] | None:
    """What a reader should know of a job's controller: None once the job has ended; else
    whether it is live and, if not, for how long it has been silent. A job that never had a
    lease (its controller not started yet) counts as lost once older than the lease."""
    from trainctl.controller.lease import view_lease

    if record.state.is_terminal():
        return None
    seconds = get_settings().lease_seconds
    view = view_lease(jobs.read_lease(), seconds)
    silent = view.silent_seconds
    if silent is None and view.holder is None:
        age = time.time() - parse_iso(record.created_at)
        silent = age if age > seconds else None
    lost = not view.live and silent is not None
    holder = view.holder or {}
    return {
        "live": view.live,
        "lost": lost,
        "silent_seconds": None if silent is None else round(silent, 1),
        "host": holder.get("host"),
        "pid": holder.get("pid"),
    }


def supervise(
    store: Store,
    name: str,
    *,
    printer: Any = None,
    timeout: float | None = None,
    poll: float = 0.5,
) -> JobRecord:
    """Follow a job to its end from any process that can read its store, printing its logs
    with `printer`. Whenever the job's controller is lost (killed, a closed laptop), take the
    job over: this process becomes its controller, adopting the nodes that still run. When
    several processes try at once the lease lets one win; the others keep following."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.lease import LeaseHeld, lease_is_live
    from trainctl.controller.logs import LogFollower

    jobs = JobStore(store, name)
    follower = LogFollower(store, name, printer) if printer is not None else None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        record = jobs.load()
        if follower is not None:
            follower.drain()
        # The record turns terminal before the teardown (instances, security group, key
        # pair) is done: a waiter returns once the controller lets go of the job, so that
        # "done" never means its resources still exist.
        if record.state.is_terminal() and (not lease_is_live(jobs) or _past(deadline)):
            if follower is not None:
                follower.flush()
            return record
        if record.state.is_terminal():  # its instances and groups are still being deleted
            time.sleep(poll)
            continue
        view = controller_view(jobs, record)
        if view is not None and view["lost"]:
            offsets = follower.line_offsets() if follower is not None else {}
            try:
                record = Controller(store, name, printer=printer, log_offsets=offsets).run()
            except LeaseHeld:
                pass  # another process took it over first: follow that one
            else:
                if record.state.is_terminal():
                    if follower is not None:  # what the controller printed is printed
                        follower.drain()
                    return record
        if _past(deadline):
            raise TimeoutError(f"job {name!r} is still {record.state.value} after {timeout} s")
        time.sleep(poll)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline
