"""What a job's instances and its nodes' store requests cost (InstanceCost, cost_summary,
cost_text)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class InstanceCost(BaseModel):
    """Billable time of one instance of one attempt (providers that bill: EC2)."""

    model_config = ConfigDict(extra="forbid")

    attempt: int
    rank: int
    instance_id: str
    instance_type: str
    market: str  # spot | on-demand | owned
    zone: str | None = None
    seconds: float
    usd_per_hour: float | None = None  # None: no price known, no cost claimed
    on_demand_usd_per_hour: float | None = None
    # Idle time after the job, kept warm for a next one (keep_alive_period_in_seconds).
    warm: bool = False

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_hour is None else self.seconds / 3600 * self.usd_per_hour

    @property
    def on_demand_usd(self) -> float | None:
        rate = self.on_demand_usd_per_hour
        return None if rate is None else self.seconds / 3600 * rate


# S3 Standard's list prices (us-east-1, https://aws.amazon.com/s3/pricing/, 2026): PUT, COPY,
# POST and LIST $0.005 per 1,000 requests; GET, HEAD and the rest $0.0004 per 1,000.
S3_WRITE_USD, S3_READ_USD = 0.005 / 1000, 0.0004 / 1000


def supervision_usd_per_node_hour(nodes: int) -> float:
    """What one node's own store requests cost an hour at S3's list prices, on the schedule
    of the settings in effect (Settings.control_seconds and friends): its lease reads, its
    log copies (each interval: a log that grows) and its status writes. Not its checkpoint
    and working-directory uploads (what it saves) or the controller's requests (per job)."""
    from trainctl.spec.settings import get_settings

    settings = get_settings()
    reads = 3600 / settings.control_seconds(nodes)
    writes = 3600 / settings.log_ship_seconds(nodes) + 3600 / settings.status_seconds(nodes)
    return reads * S3_READ_USD + writes * S3_WRITE_USD


def cost_summary(
    instances: list[InstanceCost], *, store_uri: str = "", nodes: int = 1
) -> dict[str, Any] | None:
    """The job's cost and its spot savings against on-demand; None if nothing billed. With
    an s3:// store, `store_usd`: its nodes' supervision requests at S3's list prices (an
    estimate from the schedule: supervision_usd_per_node_hour), beside the instances'."""
    if not instances:
        return None
    priced = [i for i in instances if i.usd is not None]
    usd = sum(i.usd or 0.0 for i in priced)
    on_demand = sum(i.on_demand_usd or 0.0 for i in priced if i.on_demand_usd is not None)
    seconds = sum(i.seconds for i in instances)
    store_usd = None
    if store_uri.startswith("s3://"):
        store_usd = round(seconds / 3600 * supervision_usd_per_node_hour(nodes), 6)
    return {
        "usd": round(usd, 4) if priced else None,
        "on_demand_usd": round(on_demand, 4) if priced else None,
        "spot_savings_usd": round(on_demand - usd, 4) if priced else None,
        "instance_seconds": round(seconds, 1),
        "warm_seconds": round(sum(i.seconds for i in instances if i.warm), 1),
        "unpriced_instances": len(instances) - len(priced),
        "store_usd": store_usd,
    }


def cost_text(cost: dict[str, Any] | None) -> str:
    """A job's cost (cost_summary) in words, for `status` and a notebook's view."""
    if cost is None:
        return "none billed (this machine's or your hosts' capacity)"
    hours = cost["instance_seconds"] / 3600
    if cost["usd"] is None:
        return f"{hours:.2f} instance-hours (no price known)"
    text = f"${cost['usd']:.2f} for {hours:.2f} instance-hours"
    if cost.get("warm_seconds"):
        text += f" ({cost['warm_seconds'] / 3600:.2f} of them kept warm after the job)"
    if cost["spot_savings_usd"]:
        text += f"; spot saved ${cost['spot_savings_usd']:.2f} of ${cost['on_demand_usd']:.2f}"
    if cost["unpriced_instances"]:
        text += f" ({cost['unpriced_instances']} instance(s) without a price not counted)"
    if cost.get("store_usd") is not None:
        share = f", {100 * cost['store_usd'] / cost['usd']:.2g} % of that" if cost["usd"] else ""
        text += f"; the nodes' store requests about ${cost['store_usd']:.4f} more{share}"
    return text
