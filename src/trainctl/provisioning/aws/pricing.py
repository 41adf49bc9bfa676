"""What EC2 capacity costs: list prices from the catalog, spot prices from EC2 itself.

The catalog holds us-east-1 on-demand list prices only; elsewhere the on-demand price is
unknown (None) rather than guessed. Spot prices come from DescribeSpotPriceHistory, the
latest price for the type in the AZ.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trainctl.spec.catalog import CATALOG

CATALOG_PRICE_REGION = "us-east-1"
LINUX = "Linux/UNIX"


def on_demand_price(instance_type: str, region: str) -> float | None:
    """USD/hour on demand; None outside us-east-1 (the catalog has no other region)."""
    if region != CATALOG_PRICE_REGION:
        return None
    price = CATALOG[instance_type].on_demand_usd_per_hour if instance_type in CATALOG else 0.0
    return price or None


def spot_price(ec2: Any, instance_type: str, zone: str | None = None) -> float | None:
    """The latest spot price (USD/hour) of the type in `zone`, or the lowest of the region."""
    kwargs: dict[str, Any] = {
        "InstanceTypes": [instance_type],
        "ProductDescriptions": [LINUX],
        "StartTime": datetime.now(timezone.utc),
    }
    if zone:
        kwargs["AvailabilityZone"] = zone
    latest: dict[str, tuple[datetime, float]] = {}
    for page in ec2.get_paginator("describe_spot_price_history").paginate(**kwargs):
        for entry in page.get("SpotPriceHistory", []):
            if entry.get("InstanceType") != instance_type:
                continue
            if not str(entry.get("ProductDescription", "")).startswith(LINUX):
                continue
            az = str(entry.get("AvailabilityZone", ""))
            stamp = entry["Timestamp"]
            if az not in latest or stamp > latest[az][0]:
                latest[az] = (stamp, float(entry["SpotPrice"]))
    if zone:
        return latest[zone][1] if zone in latest else None
    return min((price for _, price in latest.values()), default=None)
