"""A job's billable instance time as recorded in its job.json, from the providers' usage."""

from __future__ import annotations

from trainctl.clock import clock
from trainctl.errors import NotFoundError, UnreadableRecordError
from trainctl.provisioning.base import InstanceUsage
from trainctl.record import InstanceCost, JobStore
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
