"""Asking EC2 about spot before a try (trainctl.provisioning.aws.outlook): the placement
scores and spot prices asked as botocore's model says (Stubber checks every request and
answer against it), and what each answer makes of a try."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from trainctl.provisioning.aws.outlook import GOOD_SCORE, spot_outlook

REGION = "us-east-1"
ZONES = {"use1-az1": "us-east-1a", "use1-az2": "us-east-1b"}


def _ec2(scores: dict[str, int] | None, prices: dict[str, float] | None = None) -> Any:
    """An EC2 client whose answers are stubbed: each zone id's placement score (None: the
    account may not ask), then each zone's spot price, in the order asked."""
    import boto3
    from botocore.stub import ANY, Stubber

    client = boto3.client(
        "ec2", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s"
    )
    stub = Stubber(client)
    asked = {
        "InstanceTypes": ["p3.2xlarge"],
        "TargetCapacity": 16,
        "TargetCapacityUnitType": "units",
        "SingleAvailabilityZone": True,
        "RegionNames": [REGION],
    }
    if scores is None:
        stub.add_client_error(
            "get_spot_placement_scores", "UnauthorizedOperation", "not allowed", 403, asked
        )
    else:
        rows = [{"Region": REGION, "AvailabilityZoneId": z, "Score": n} for z, n in scores.items()]
        stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": rows}, asked)
        if rows:
            zones = [{"ZoneId": z, "ZoneName": ZONES[z]} for z in sorted(scores)]
            stub.add_response(
                "describe_availability_zones",
                {"AvailabilityZones": zones},
                {"ZoneIds": sorted(scores)},
            )
    for zone, price in (prices or {}).items():
        entry = {
            "AvailabilityZone": zone,
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": str(price),
            "Timestamp": datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc),
        }
        stub.add_response(
            "describe_spot_price_history",
            {"SpotPriceHistory": [entry]},
            {
                "InstanceTypes": ["p3.2xlarge"],
                "ProductDescriptions": ["Linux/UNIX"],
                "StartTime": ANY,
                "AvailabilityZone": zone,
            },
        )
    stub.activate()
    client.stub = stub  # type: ignore[attr-defined]
    return client


def _ask(ec2: Any, **kwargs: Any) -> bool | None:
    answer = spot_outlook(ec2, "p3.2xlarge", 16, REGION, **kwargs)
    ec2.stub.assert_no_pending_responses()  # every call the stub expected was made
    return answer


def test_a_good_score_is_room_and_a_poor_one_is_none() -> None:
    assert _ask(_ec2({"use1-az1": GOOD_SCORE, "use1-az2": 2})) is True
    assert _ask(_ec2({"use1-az1": GOOD_SCORE - 1, "use1-az2": 3})) is False


def test_the_spot_price_of_a_good_zone_must_be_below_on_demand() -> None:
    # az2 scores best, but its spot price has reached on-demand's: az1 still has room
    ec2 = _ec2({"use1-az1": 8, "use1-az2": 9}, {"us-east-1b": 3.06, "us-east-1a": 0.97})
    assert _ask(ec2, on_demand_usd_per_hour=3.06) is True
    ec2 = _ec2({"use1-az1": 9}, {"us-east-1a": 3.10})
    assert _ask(ec2, on_demand_usd_per_hour=3.06) is False


def test_only_the_jobs_zones_count() -> None:
    ec2 = _ec2({"use1-az1": 2, "use1-az2": 10})
    assert _ask(ec2, zones=["us-east-1a"]) is False


@pytest.mark.parametrize("scores", [None, {}])
def test_no_permission_or_no_score_is_no_answer(scores: dict[str, int] | None) -> None:
    assert _ask(_ec2(scores)) is None


def test_the_ec2_provider_asks_for_the_jobs_type_count_and_zones(monkeypatch, tmp_path) -> None:
    from trainctl.provisioning.aws.provider import AwsProvider
    from trainctl.provisioning.base import SpotOutlook
    from trainctl.spec.job import JobSpec
    from trainctl.spec.request import CapacityRequest

    (tmp_path / "train.py").write_text("pass\n")
    spec = JobSpec(
        entry_point="train.py", source_dir=str(tmp_path), instance_type="p3.2xlarge",
        instance_count=16, use_spot_instances=True,
    )  # fmt: skip
    provider = AwsProvider(REGION)
    assert isinstance(provider, SpotOutlook)
    # us-east-1: the catalog's on-demand price (3.06) is known, so the spot price is asked too
    ec2 = _ec2({"use1-az1": 9, "use1-az2": 4}, {"us-east-1a": 1.2})
    monkeypatch.setattr(provider, "client", lambda service, region: ec2)
    assert provider.spot_outlook(CapacityRequest.of(spec), "j") is True
    ec2.stub.assert_no_pending_responses()
