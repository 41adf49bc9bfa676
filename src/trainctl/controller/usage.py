"""A job's billable instance time as recorded in its job.json, from the providers' usage."""

from __future__ import annotations

from collections.abc import Callable

from trainctl.clock import clock
from trainctl.errors import NotFoundError, UnreadableRecordError
from trainctl.provisioning.base import Billing, InstanceUsage, Provider, WarmStart
from trainctl.record.costs import InstanceCost
from trainctl.record.jobstore import JobStore
from trainctl.record.models import JobRecord
from trainctl.store import Store


def instance_costs(usage: list[InstanceUsage], now: float | None = None) -> list[InstanceCost]:
    from trainctl.spec.catalog import CATALOG

    now = clock().time() if now is None else now
    return [
        InstanceCost(
            attempt=u.attempt,
            rank=u.rank,
            instance_id=u.instance_id,
            instance_type=u.instance_type,
            market=u.market,
            zone=u.zone,
            seconds=round(max(0.0, (u.ended or now) - u.started), 1),
            usd_per_hour=u.usd_per_hour,
            on_demand_usd_per_hour=(
                CATALOG[u.instance_type].on_demand_usd_per_hour
                if u.instance_type in CATALOG
                else None
            ),
            warm=u.warm,
        )
        for u in usage
    ]


def merge_costs(recorded: list[InstanceCost], fresh: list[InstanceCost]) -> list[InstanceCost]:
    """`fresh` rows replace recorded ones of the same instance (and kind); others stay."""
    rows = {(c.instance_id, c.warm): c for c in recorded}
    rows.update({(c.instance_id, c.warm): c for c in fresh})
    return sorted(rows.values(), key=lambda c: (c.warm, c.attempt, c.rank, c.instance_id))


def record_idle(store: Store, job: str, idle: list[InstanceUsage]) -> bool:
    """Add the warm time of instances `job` left behind to its cost; False if the job is not
    in this store (it was submitted with another one) or its record cannot be read (what
    released the instances goes on to the next)."""
    if not idle:
        return True
    jobs = JobStore(store, job)
    try:
        record = jobs.load()
    except (NotFoundError, UnreadableRecordError):
        return False
    record.instances = merge_costs(record.instances, instance_costs(idle))
    jobs.save(record)
    return True


def record_usage(
    provider: Provider, jobs: JobStore, record: JobRecord, info: Callable[[str], None]
) -> None:
    """Billable instance time of every attempt of `record` so far, from the provider (EC2),
    into the record; rows already recorded for instances the provider no longer counts as
    the job's (kept warm, then claimed by another job) stay as they were."""
    if not isinstance(provider, Billing):
        return  # owned machines: no instance time to bill
    try:
        usage = provider.usage(record.name)
    except Exception as exc:  # cost is information; a failed lookup must not fail a job
        info(f"could not read instance usage for the cost: {exc}")
        return
    if not usage:
        return
    record.instances = merge_costs(record.instances, instance_costs(usage))
    jobs.save(record)


def note_warm_start(
    jobs: JobStore, attempt: int, warm: WarmStart, info: Callable[[str], None]
) -> None:
    """An attempt that started on instances another job left warm: its event, its line, and
    the wait added to the leaving job's cost (record_idle)."""
    jobs.event(
        "warm_start",
        attempt=attempt,
        pool=warm.pool,
        from_job=warm.from_job,
        instances=warm.instance_ids,
    )
    info(
        f"attempt {attempt}: on {len(warm.instance_ids)} warm instance(s) left by job "
        f"{warm.from_job} (no new capacity launched)"
    )
    try:  # the wait is the leaving job's cost
        record_idle(jobs.store, warm.from_job, warm.idle)
    except Exception as exc:
        info(f"could not add the warm time to job {warm.from_job}'s cost: {exc}")
