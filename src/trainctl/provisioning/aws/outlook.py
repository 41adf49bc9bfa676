"""Asking EC2 about spot capacity without launching: spot placement scores and price history.

GetSpotPlacementScores rates, from 1 to 10, how likely a spot request for a number of
instances of a type is to succeed now in each availability zone (SingleAvailabilityZone: a
job's nodes go in one, with its placement group). A try back to spot from on-demand costs a
relaunch whether it finds spot or not, so the controller asks first and tries only where the
answer is good: the best zone the job may use scores at least `GOOD_SCORE`, and its latest spot
price (DescribeSpotPriceHistory) is below the on-demand price where that is known (a spot
price at or above it is a market with no room to spare).

The scores are a forecast: AWS says a 10 is "highly likely" to succeed, not certain, and gives
no error rate. A try that finds no spot is counted as a miss and doubles the wait before the
next try, as without an answer (trainctl.controller.recovery). No permission to ask
(`ec2:GetSpotPlacementScores`), or no score for the type, is no answer (None): the controller
then tries as it would have.
"""

from __future__ import annotations

from typing import Any

from trainctl.provisioning.aws.pricing import spot_price

# The placement score (1-10) from which a try back to spot is made. AWS: "a score of 10 means
# that your Spot request is highly likely (but not guaranteed) to succeed"; 7 leaves out the
# pools AWS rates as unlikely or uncertain.
GOOD_SCORE = 7


def placement_scores(ec2: Any, instance_type: str, count: int, region: str) -> dict[str, int]:
    """Each availability zone's (by its name) score for `count` spot instances of the type."""
    scores: dict[str, int] = {}
    pages = ec2.get_paginator("get_spot_placement_scores").paginate(
        InstanceTypes=[instance_type],
        TargetCapacity=count,
        TargetCapacityUnitType="units",
        SingleAvailabilityZone=True,
        RegionNames=[region],
    )
    for page in pages:
        for entry in page.get("SpotPlacementScores", []):
            zone_id = entry.get("AvailabilityZoneId")
            if zone_id and entry.get("Region", region) == region:
                scores[str(zone_id)] = int(entry.get("Score", 0))
    if not scores:
        return {}
    zones = ec2.describe_availability_zones(ZoneIds=sorted(scores))["AvailabilityZones"]
    names = {str(z["ZoneId"]): str(z["ZoneName"]) for z in zones}
    return {names[zid]: score for zid, score in scores.items() if zid in names}


def spot_outlook(
    ec2: Any,
    instance_type: str,
    count: int,
    region: str,
    *,
    zones: list[str] | None = None,
    on_demand_usd_per_hour: float | None = None,
) -> bool | None:
    """Whether a spot request for `count` instances would likely be met now in one of `zones`
    (None: any zone of the region); None where EC2 gives no score, or no answer at all (no
    permission to ask, throttled)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        scores = placement_scores(ec2, instance_type, count, region)
        if zones is not None:
            scores = {zone: score for zone, score in scores.items() if zone in zones}
        if not scores:
            return None
        good = [z for z in sorted(scores, key=scores.get, reverse=True) if scores[z] >= GOOD_SCORE]
        if not good or on_demand_usd_per_hour is None:
            return bool(good)
        for zone in good:  # the best scored first
            price = spot_price(ec2, instance_type, zone)
            if price is None or price < on_demand_usd_per_hour:
                return True
        return False
    except (BotoCoreError, ClientError):
        return None
