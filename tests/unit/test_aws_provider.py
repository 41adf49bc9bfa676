"""The EC2 provider against moto's in-process AWS (`mock_aws`): real boto3 calls throughout.

What moto lacks is filled in here, visibly:
- placement groups (moto 5 has no CreatePlacementGroup/Describe/Delete): `PlacementGroups`
  answers those three operations from a dict, through botocore's `before-call` hook;
- capacity errors: a `provide-client-params` hook raises the real ClientError codes for
  chosen (market, type, subnet) launches;
- a spot reclaim's StateReason: set on moto's own instance object after terminating it.
Every request the provider sends is recorded (a session-wide `provide-client-params` hook),
so tests assert what was asked, in order, not only what moto kept.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trainctl.errors import SpecError
from trainctl.provisioning.aws import AwsProvider
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.capacity import Backoff, CapacityError
from trainctl.provisioning.aws.clients import AwsError
from trainctl.provisioning.aws.keys import ensure_key
from trainctl.spec.build import build_spec
from trainctl.spec.job import JobSpec
from trainctl.spec.request import CapacityRequest


def _require(module: str) -> Any:
    """Import a test dependency; under CI a missing one fails, locally it skips."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')", allow_module_level=True)


boto3 = _require("boto3")
moto = _require("moto")

import botocore.session  # noqa: E402
from botocore.awsrequest import AWSResponse  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

REGION = "us-east-1"
# One of moto's built-in images (Ubuntu, x86_64, root /dev/sda1), present in every region;
# naming it saves describing moto's thousand-odd images in each test.
IMAGE = "ami-1e749f67"
CIDR = "203.0.113.7/32"
PROFILE = "trainctl-node"
MUTATING_PREFIXES = ("Create", "Run", "Import", "Authorize", "Delete", "Terminate", "Put")


_LOADER: list[Any] = []


def _shared_loader(core: Any) -> Any:
    """One botocore data loader for every session of these tests: each new session would
    parse the EC2 service model (megabytes of JSON) again."""
    if not _LOADER:
        _LOADER.append(core.get_component("data_loader"))
    return _LOADER[0]


# -- test doubles -----------------------------------------------------------------------------


@dataclass
class Call:
    service: str
    operation: str
    params: dict[str, Any]
    region: str


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)

    def record(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        self.calls.append(
            Call(
                model.service_model.service_name,
                model.name,
                copy.deepcopy(params),
                str(context.get("client_region")),
            )
        )

    def ops(self, service: str = "ec2") -> list[str]:
        return [c.operation for c in self.calls if c.service == service]

    def mutating(self) -> list[Call]:
        return [c for c in self.calls if c.operation.startswith(MUTATING_PREFIXES)]

    def of(self, operation: str) -> list[Call]:
        return [c for c in self.calls if c.operation == operation]


def _client_error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@dataclass
class PlacementGroups:
    """CreatePlacementGroup / DescribePlacementGroups / DeletePlacementGroup, which moto lacks."""

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def install(self, events: Any) -> None:
        for op in ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"):
            events.register(f"provide-client-params.ec2.{op}", self._keep_params)
            events.register(f"before-call.ec2.{op}", getattr(self, f"_{op}"))

    @staticmethod
    def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["placement_group_params"] = dict(params)

    @staticmethod
    def _ok(parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("https://ec2.fake", 200, {}, None), parsed

    def _CreatePlacementGroup(self, context: dict[str, Any], **_: Any) -> Any:
        params = context["placement_group_params"]
        name = params["GroupName"]
        if name in self.groups:
            raise _client_error("InvalidPlacementGroup.Duplicate", name, "CreatePlacementGroup")
        tags = [t for spec in params.get("TagSpecifications", []) for t in spec["Tags"]]
        group = {"GroupName": name, "Strategy": params["Strategy"], "State": "available"}
        self.groups[name] = {**group, "Tags": tags}
        return self._ok({"PlacementGroup": self.groups[name]})

    def _DescribePlacementGroups(self, context: dict[str, Any], **_: Any) -> Any:
        params = context["placement_group_params"]
        found = list(self.groups.values())
        for name in params.get("GroupNames", []):
            if name not in self.groups:
                raise _client_error(
                    "InvalidPlacementGroup.Unknown", f"{name} unknown", "DescribePlacementGroups"
                )
        if params.get("GroupNames"):
            found = [g for g in found if g["GroupName"] in params["GroupNames"]]
        for flt in params.get("Filters", []):
            key, values = flt["Name"], flt["Values"]
            if key == "tag-key":
                found = [g for g in found if any(t["Key"] in values for t in g["Tags"])]
            elif key.startswith("tag:"):
                found = [
                    g
                    for g in found
                    if any(t["Key"] == key[4:] and t["Value"] in values for t in g["Tags"])
                ]
        return self._ok({"PlacementGroups": copy.deepcopy(found)})

    def _DeletePlacementGroup(self, context: dict[str, Any], **_: Any) -> Any:
        name = context["placement_group_params"]["GroupName"]
        if self.groups.pop(name, None) is None:
            raise _client_error("InvalidPlacementGroup.Unknown", name, "DeletePlacementGroup")
        return self._ok({})


@dataclass
class Capacity:
    """Raises capacity errors for chosen launches: {(market, type, subnet): code}."""

    failing: dict[tuple[str, str, str], str] = field(default_factory=dict)
    fail_all: str | None = None
    fail_first: int = 0  # this many launches fail whatever they ask for
    launches: list[tuple[str, str, str]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)

    def install(self, events: Any) -> None:
        events.register("provide-client-params.ec2.RunInstances", self._run)

    def _run(self, params: dict[str, Any], **_: Any) -> None:
        market = "spot" if "InstanceMarketOptions" in params else "on-demand"
        subnet = params.get("SubnetId") or params["NetworkInterfaces"][0]["SubnetId"]
        key = (market, params["InstanceType"], subnet)
        self.launches.append(key)
        self.tokens.append(params["ClientToken"])
        code = self.fail_all or self.failing.get(key)
        if len(self.launches) <= self.fail_first:
            code = "InsufficientInstanceCapacity"
        if code:
            raise _client_error(
                code, f"We currently do not have sufficient {key[1]} capacity", "RunInstances"
            )


@dataclass
class FakeClock:
    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Aws:
    """moto's AWS with the doubles above, and helpers to make specs and providers."""

    src: Path
    recorder: Recorder
    placement: PlacementGroups
    capacity: Capacity
    clock: FakeClock
    hooks: list[tuple[str, Callable[..., Any]]]
    plain: dict[tuple[str, str], Any] = field(default_factory=dict)
    placement_api: bool = True  # False: placement-group calls reach moto, which lacks them

    def session(self, region: str) -> Any:
        core = botocore.session.get_session()
        core.register_component("data_loader", _shared_loader(core))
        session = boto3.session.Session(botocore_session=core, region_name=region)
        session.events.register("provide-client-params", self.recorder.record)
        if self.placement_api:
            self.placement.install(session.events)
        self.capacity.install(session.events)
        for event, handler in self.hooks:
            session.events.register(event, handler)
        return session

    def provider(self, region: str | None = None) -> AwsProvider:
        def no_checkip() -> str:
            raise AssertionError("tests never ask checkip.amazonaws.com")

        return AwsProvider(
            region,
            session_factory=self.session,
            sleep=self.clock.sleep,
            clock=self.clock.clock,
            poll_seconds=1.0,
            backoff=Backoff(initial=10.0, maximum=40.0),
            public_address=no_checkip,
        )

    def client(self, service: str, region: str = REGION) -> Any:
        """A plain client (no hooks) to look at moto's state; one per service and region."""
        key = (service, region)
        if key not in self.plain:
            core = botocore.session.get_session()
            core.register_component("data_loader", _shared_loader(core))
            session = boto3.session.Session(botocore_session=core, region_name=region)
            self.plain[key] = session.client(service)
        return self.plain[key]

    def spec(self, **fields: Any) -> JobSpec:
        fields.setdefault("instance_type", "g5.xlarge")
        fields.setdefault("instance_profile", PROFILE)
        fields.setdefault("region", REGION)
        fields.setdefault("image_id", IMAGE)
        return build_spec(entry_point="train.py", source_dir=str(self.src), **fields)

    def default_subnets(self, region: str = REGION) -> list[dict[str, Any]]:
        subnets = self.client("ec2", region).describe_subnets(
            Filters=[{"Name": "default-for-az", "Values": ["true"]}]
        )["Subnets"]
        return sorted(subnets, key=lambda s: s["AvailabilityZone"])


@pytest.fixture
def aws(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    """Fake credentials only moto accepts, no profile or endpoint from the machine, moto on."""
    for name in list(os.environ):
        if name.startswith("AWS_ENDPOINT_URL") or name in (
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "AWS_REGION",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("TRAINCTL_AWS_SSH_CIDR", CIDR)
    monkeypatch.setenv("TRAINCTL_AWS_BOOT_TIMEOUT_SECONDS", "60")
    monkeypatch.setenv("TRAINCTL_AWS_CLEANUP_TIMEOUT_SECONDS", "60")
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    with moto.mock_aws():
        iam = boto3.client("iam")
        iam.create_role(RoleName="trainctl-node", AssumeRolePolicyDocument="{}")
        iam.create_instance_profile(InstanceProfileName=PROFILE)
        iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName="trainctl-node")
        yield Aws(src, Recorder(), PlacementGroups(), Capacity(), FakeClock(), [])


def tagged(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def job_instances(ec2: Any, job: str, live_only: bool = True) -> list[dict[str, Any]]:
    filters = [{"Name": "tag:trainctl:job", "Values": [job]}]
    if live_only:
        filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def job_resources(aws: Aws, job: str) -> dict[str, list[Any]]:
    """Every resource tagged with the job, by kind (what terminate must leave empty)."""
    ec2 = aws.client("ec2")
    by_tag = [{"Name": "tag:trainctl:job", "Values": [job]}]
    return {
        "instances": [i["InstanceId"] for i in job_instances(ec2, job)],
        "security-groups": [
            g["GroupId"] for g in ec2.describe_security_groups(Filters=by_tag)["SecurityGroups"]
        ],
        "key-pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=by_tag)["KeyPairs"]],
        "volumes": [
            v["VolumeId"]
            for v in ec2.describe_volumes(Filters=by_tag)["Volumes"]
            if v["State"] != "deleted"
        ],
        "placement-groups": [
            g["GroupName"]
            for g in aws.placement.groups.values()
            if tagged(g)["trainctl:job"] == job
        ],
    }


def substitute(value: Any, mapping: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    if isinstance(value, str) and value in mapping:
        return mapping[value]
    return value


# -- provision ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_provision_p4d_pair_sends_exactly_the_dry_run_and_tags_everything(aws: Aws) -> None:
    subnet = aws.default_subnets()[0]
    spec = aws.spec(instance_type="p4d.24xlarge", instance_count=2, subnets=[subnet["SubnetId"]])
    provider = aws.provider()
    planned = provider.dry_run(CapacityRequest.of(spec), "pair", 1)
    cluster = provider.provision(CapacityRequest.of(spec), "pair", 1)

    ec2 = aws.client("ec2")
    instances = sorted(job_instances(ec2, "pair"), key=lambda i: i["AmiLaunchIndex"])
    assert len(instances) == 2
    for rank, instance in enumerate(instances):
        assert tagged(instance) == {
            "trainctl:job": "pair",
            "trainctl:attempt": "1",
            "trainctl:owner": "moto",  # the name in moto's caller identity ARN (user/moto)
            "trainctl:rank": str(rank),
            "Name": f"trainctl-pair-1-algo-{rank + 1}",
        }
        options = instance["MetadataOptions"]
        assert (options["HttpTokens"], options["HttpPutResponseHopLimit"]) == ("required", 2)
        assert options["HttpEndpoint"] == "enabled"
        assert "InstanceLifecycle" not in instance  # on-demand
        assert instance["KeyName"] == "trainctl-pair"
        assert instance["Placement"]["AvailabilityZone"] == subnet["AvailabilityZone"]
        shutdown = ec2.describe_instance_attribute(
            InstanceId=instance["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        user_data = ec2.describe_instance_attribute(
            InstanceId=instance["InstanceId"], Attribute="userData"
        )["UserData"]["Value"]
        assert base64.b64decode(user_data).decode() == rq.user_data("ubuntu")
    # moto associates the profile with the first instance of a launch only (the request
    # asks it for all: see the dry-run comparison below)
    assert instances[0]["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{PROFILE}")
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:trainctl:job", "Values": ["pair"]}])
    assert [(v["VolumeType"], v["Encrypted"], v["Size"]) for v in volumes["Volumes"]] == [
        ("gp3", True, 200)
    ] * 2

    group = ec2.describe_security_groups(
        Filters=[{"Name": "tag:trainctl:job", "Values": ["pair"]}]
    )["SecurityGroups"]
    assert len(group) == 1 and group[0]["VpcId"] == subnet["VpcId"]
    rules = {(r["IpProtocol"], r.get("FromPort")): r for r in group[0]["IpPermissions"]}
    assert [p["GroupId"] for p in rules[("-1", None)]["UserIdGroupPairs"]] == [group[0]["GroupId"]]
    assert [r["CidrIp"] for r in rules[("tcp", 22)]["IpRanges"]] == [CIDR]
    assert len(rules) == 2  # nothing else is open
    key_pairs = ec2.describe_key_pairs(KeyNames=["trainctl-pair"])["KeyPairs"]
    assert tagged(key_pairs[0])["trainctl:job"] == "pair"
    assert aws.placement.groups["trainctl-pair"]["Strategy"] == "cluster"

    assert cluster.instance_type == "p4d.24xlarge"
    assert [n.address for n in cluster.nodes] == [i["PrivateIpAddress"] for i in instances]
    # plain processes: SM_HOSTS names are the private addresses (algo-N needs /etc/hosts)
    assert [n.host for n in cluster.nodes] == [n.address for n in cluster.nodes]
    assert {n.root for n in cluster.nodes} == {"/"}
    assert cluster.processes_per_host == 8
    assert cluster.network_env["FI_PROVIDER"] == "efa"

    # What was sent is the dry run with its placeholders filled in, in the same order.
    real = {
        "<security-group-id>": group[0]["GroupId"],
        f"<VpcId of {subnet['SubnetId']}>": subnet["VpcId"],
        "<name in the caller identity ARN>": "moto",
        f"<RootDeviceName of {spec.image_id}>": ec2.describe_images(ImageIds=[spec.image_id])[
            "Images"
        ][0]["RootDeviceName"],
        f"<public key of {aws.src.parent / 'home' / 'ssh' / 'id_ed25519'}>": ensure_key().encode(),
        **{rq.instance_id_placeholder(r): i["InstanceId"] for r, i in enumerate(instances)},
    }
    sent = [(c.operation, c.params) for c in aws.recorder.mutating()]
    expected = [(p["operation"], substitute(p["params"], real)) for p in planned]
    assert sent == expected


@pytest.mark.timeout(60)
def test_the_catalog_is_ec2s_describe_instance_types_and_its_cache(aws: Aws) -> None:
    """Every type DescribeInstanceTypes lists (moto answers it), kept in HOME's cache over
    the shipped snapshot: a type the snapshot lacks becomes known; the preflight keeps the
    job's types' rows; prices come from the named table, none where it has none."""
    from trainctl.provisioning.aws.clients import Clients
    from trainctl.provisioning.aws.preflight import refresh_instance_types
    from trainctl.spec.catalog import CATALOG, check_instance_type, find_types
    from trainctl.spec.ec2types import cache_path, prices, snapshot_source

    assert "DescribeInstanceTypes" in snapshot_source()
    assert prices()[1].startswith("AWS EC2 On-Demand Pricing")
    c5 = check_instance_type("c5.2xlarge")
    assert (c5.vcpus, c5.memory_gib, c5.gpus, c5.on_demand_usd_per_hour) == (8, 16, 0, 0.34)
    p4d = CATALOG["p4d.24xlarge"]
    assert (p4d.gpus, p4d.gpu_name, p4d.efa_interfaces) == (8, "A100", 4)
    assert CATALOG["p5.4xlarge"].on_demand_usd_per_hour == 0.0  # no price known, not a guess
    assert "x9.large" not in CATALOG
    count, region = refresh_instance_types(REGION, Clients(aws.session))
    assert count > 1000 and region == REGION
    rows = json.loads(cache_path().read_text())
    assert rows["source"].startswith(f"DescribeInstanceTypes in {REGION}")
    rows["types"]["x9.large"] = [2, 4096, 0, 0, "", 0, "Up to 5 Gigabit"]  # newer than us
    cache_path().write_text(json.dumps(rows))
    CATALOG.reload()
    assert check_instance_type("x9.large").vcpus == 2
    assert [t.name for t in find_types("ml.x9.*")] == ["x9.large"]
    cache_path().unlink()
    CATALOG.reload()
    aws.provider().preflight(CapacityRequest.of(aws.spec(instance_type="g5.xlarge")))
    assert list(json.loads(cache_path().read_text())["types"]) == ["g5.xlarge"]
    cache_path().unlink()
    CATALOG.reload()


@pytest.mark.timeout(60)
def test_outputs_are_encrypted_with_the_jobs_kms_key_and_tagged(aws: Aws) -> None:
    """SageMaker's output_kms_key and tags: the job's model and output data (every way the
    store writes them) are SSE-KMS with that key and carry the job's tags; everything else
    keeps S3's own keys."""
    from trainctl.record.locations import output_store
    from trainctl.record.models import JobRecord
    from trainctl.store import open_store

    s3 = aws.client("s3")
    s3.create_bucket(Bucket="out-bucket")
    key = aws.client("kms").create_key(Description="outputs")["KeyMetadata"]["Arn"]
    spec = aws.spec(
        instance_type="g5.xlarge",
        output_path="s3://out-bucket/models",
        output_kms_key=key,
        tags={"team": "vision", "cost center": "42 + more"},
    )
    # (the fields output_store reads)
    record = JobRecord.model_construct(name="enc", spec=spec, store_uri="s3://out-bucket/store")
    out = output_store(record)
    model = aws.src / "model.tar.gz"
    model.write_bytes(b"weights" * 100)
    out.put_file("model.tar.gz", model)
    out.put_files([("model/a.bin", model)])
    out.child("data").put_bytes("report.txt", b"done")
    for name in ("model.tar.gz", "model/a.bin", "data/report.txt"):
        head = s3.head_object(Bucket="out-bucket", Key=f"models/enc/output/{name}")
        assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key), name
        tagging = s3.get_object_tagging(Bucket="out-bucket", Key=f"models/enc/output/{name}")
        assert {t["Key"]: t["Value"] for t in tagging["TagSet"]} == {
            "team": "vision",
            "cost center": "42 + more",
        }
    open_store("s3://out-bucket/store").put_bytes("other", b"x")
    assert (
        s3.head_object(Bucket="out-bucket", Key="store/other")["ServerSideEncryption"] == "AES256"
    )


@pytest.mark.timeout(60)
def test_the_jobs_tags_and_kms_key_reach_its_instances_and_volumes(aws: Aws) -> None:
    """SageMaker's tags and volume_kms_key (honoured through the shim): beside trainctl's own
    tags, on every instance and volume; the root volumes encrypted with the key given."""
    kms = aws.client("kms")
    key = kms.create_key(Description="trainctl test")["KeyMetadata"]["Arn"]
    spec = aws.spec(
        instance_type="g5.xlarge", tags={"team": "vision", "cost-center": "42"}, volume_kms_key=key
    )
    aws.provider().provision(CapacityRequest.of(spec), "tagged", 1)
    ec2 = aws.client("ec2")
    (instance,) = job_instances(ec2, "tagged")
    assert {"team": "vision", "cost-center": "42", "trainctl:job": "tagged"}.items() <= tagged(
        instance
    ).items()
    by_job = [{"Name": "tag:trainctl:job", "Values": ["tagged"]}]
    (volume,) = ec2.describe_volumes(Filters=by_job)["Volumes"]
    assert tagged(volume)["team"] == "vision"
    assert (volume["Encrypted"], volume["KmsKeyId"]) == (True, key)


@pytest.mark.timeout(60)
def test_spot_single_node_market_usage_and_spot_reclaim(aws: Aws) -> None:
    spec = aws.spec(use_spot_instances=True)
    provider = aws.provider()
    cluster = provider.provision(CapacityRequest.of(spec), "solo", 1)
    ec2 = aws.client("ec2")
    (instance,) = job_instances(ec2, "solo")
    assert instance["InstanceLifecycle"] == "spot"
    assert "CreatePlacementGroup" not in aws.recorder.ops()  # one node: no placement group
    run = aws.recorder.of("RunInstances")[0].params
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "MaxPrice" not in run["InstanceMarketOptions"]["SpotOptions"]
    assert run["SubnetId"] == aws.default_subnets()[0]["SubnetId"]  # first AZ's default subnet
    assert cluster.processes_per_host == 1

    (usage,) = provider.usage("solo")
    assert (usage.market, usage.rank, usage.attempt) == ("spot", 0, 1)
    assert usage.instance_id == instance["InstanceId"] and usage.ended is None
    assert usage.usd_per_hour == pytest.approx(0.00001)  # moto's spot price history
    assert usage.zone == instance["Placement"]["AvailabilityZone"]

    assert provider.lost_nodes(cluster) == {}
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    reclaimed = moto.ec2.models.ec2_backends["123456789012"][REGION].get_instance(
        instance["InstanceId"]
    )
    reclaimed.state_reason = moto.ec2.models.instances.StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )
    assert provider.lost_nodes(cluster) == {0: "spot reclaim"}
    (usage,) = provider.usage("solo")
    assert usage.ended is not None and usage.ended >= usage.started


@pytest.mark.timeout(60)
def test_lost_nodes_kill_node_and_a_fresh_process(aws: Aws) -> None:
    spec = aws.spec(instance_count=3)
    provider = aws.provider()
    cluster = provider.provision(CapacityRequest.of(spec), "trio", 1)
    provider.kill_node(cluster, 1)
    lost = provider.lost_nodes(cluster)
    assert list(lost) == [1]
    assert lost[1].startswith("instance i-") and "terminated" in lost[1]
    assert "User initiated" in lost[1]
    # A provider that did not provision (another process) finds the same by tag.
    assert aws.provider().lost_nodes(cluster) == lost
    fresh = aws.provider()
    alive = {tagged(i)["trainctl:rank"]: i for i in job_instances(aws.client("ec2"), "trio")}
    assert fresh.ssh_target(cluster, 2).address == alive["2"]["PublicIpAddress"]
    with pytest.raises(AwsError):
        fresh.ssh_target(cluster, 1)


@pytest.mark.timeout(60)
def test_provision_again_reuses_what_exists(aws: Aws) -> None:
    spec = aws.spec(instance_count=2)
    first = aws.provider().provision(CapacityRequest.of(spec), "again", 1)
    before = job_resources(aws, "again")
    second = aws.provider().provision(
        CapacityRequest.of(spec), "again", 1
    )  # e.g. a controller that restarted
    assert second == first
    assert job_resources(aws, "again") == before
    assert aws.recorder.ops().count("RunInstances") == 1
    assert aws.recorder.ops().count("CreateSecurityGroup") == 1
    assert aws.recorder.ops().count("ImportKeyPair") == 1
    assert aws.recorder.ops().count("CreatePlacementGroup") == 1


@pytest.mark.timeout(60)
def test_terminate_removes_every_resource_of_the_job_and_only_those(aws: Aws) -> None:
    provider = aws.provider()
    provider.provision(CapacityRequest.of(aws.spec(instance_count=2)), "gone", 1)
    provider.provision(CapacityRequest.of(aws.spec()), "other", 1)
    assert all(job_resources(aws, "gone").values())
    # attempt 2 (after a relaunch) also goes
    provider.provision(
        CapacityRequest.of(
            aws.spec(instance_count=2, subnets=[aws.default_subnets()[1]["SubnetId"]])
        ),
        "gone",
        2,
    )
    provider.terminate("gone", grace=0)
    assert job_resources(aws, "gone") == {
        "instances": [],
        "security-groups": [],
        "key-pairs": [],
        "volumes": [],
        "placement-groups": [],
    }
    ended = job_instances(aws.client("ec2"), "gone", live_only=False)
    assert len(ended) == 4 and {i["State"]["Name"] for i in ended} == {"terminated"}
    other = job_resources(aws, "other")
    assert other.pop("placement-groups") == []  # one node: it never had one
    assert all(other.values()), "another job's resources stay"
    aws.provider().terminate("gone", grace=0)  # idempotent, and from a fresh process
    aws.provider().terminate("never-existed", grace=0)
    aws.provider().terminate("other", grace=0)
    assert not any(job_resources(aws, "other").values())


@pytest.mark.timeout(60)
def test_terminate_retries_the_security_group_until_its_instances_are_gone(aws: Aws) -> None:
    provider = aws.provider()
    provider.provision(CapacityRequest.of(aws.spec()), "busy", 1)
    refusals = []

    def in_use(params: dict[str, Any], **_: Any) -> None:
        if len(refusals) < 2:  # as EC2 does while the instance's interfaces still exist
            refusals.append(params["GroupId"])
            raise _client_error(
                "DependencyViolation", "resource has a dependent object", "DeleteSecurityGroup"
            )

    aws.hooks.append(("provide-client-params.ec2.DeleteSecurityGroup", in_use))
    fresh = aws.provider()
    fresh.terminate("busy", grace=0)
    assert len(refusals) == 2
    assert aws.clock.sleeps[-2:] == [1.0, 1.0]
    assert not any(job_resources(aws, "busy").values())


@pytest.mark.timeout(60)
def test_without_cluster_placement_groups_none_is_asked_for(aws: Aws, monkeypatch) -> None:
    """The setting that lets trainctl run against endpoints with no placement groups (moto
    server in the end-to-end test) and trade latency for capacity."""
    monkeypatch.setenv("TRAINCTL_AWS_CLUSTER_PLACEMENT_GROUP", "false")
    aws.placement_api = False  # any placement-group call now fails in moto
    provider = aws.provider()
    spec = aws.spec(instance_count=2)
    assert "CreatePlacementGroup" not in [
        r["operation"] for r in provider.dry_run(CapacityRequest.of(spec), "flat", 1)
    ]
    provider.provision(CapacityRequest.of(spec), "flat", 1)
    assert "Placement" not in aws.recorder.of("RunInstances")[0].params
    assert provider.find_leftovers(REGION, lambda job: False) != []
    provider.terminate("flat", grace=0)
    assert not any("PlacementGroup" in op for op in aws.recorder.ops())
    assert not any(job_resources(aws, "flat").values())


# -- capacity ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_capacity_falls_back_over_subnets_then_types_then_on_demand(aws: Aws) -> None:
    s1, s2 = (s["SubnetId"] for s in aws.default_subnets()[:2])
    spec = aws.spec(
        instance_type="g5.12xlarge",
        fallback_instance_types=["g5.24xlarge"],
        instance_count=2,
        use_spot_instances=True,
        on_demand_fallback=True,
        subnets=[s1, s2],
    )
    for t in ("g5.12xlarge", "g5.24xlarge"):
        for s in (s1, s2):
            aws.capacity.failing[("spot", t, s)] = "InsufficientInstanceCapacity"
    aws.capacity.failing[("spot", "g5.24xlarge", s2)] = "SpotMaxPriceTooLow"
    aws.capacity.failing[("on-demand", "g5.12xlarge", s1)] = "InsufficientInstanceCapacity"
    cluster = aws.provider().provision(CapacityRequest.of(spec), "fall", 1)
    assert aws.capacity.launches == [
        ("spot", "g5.12xlarge", s1),
        ("spot", "g5.12xlarge", s2),
        ("spot", "g5.24xlarge", s1),
        ("spot", "g5.24xlarge", s2),
        ("on-demand", "g5.12xlarge", s1),
        ("on-demand", "g5.12xlarge", s2),
    ]
    assert aws.clock.sleeps == []  # all in the first round
    instances = job_instances(aws.client("ec2"), "fall")
    assert {i["SubnetId"] for i in instances} == {s2}
    assert {i["InstanceType"] for i in instances} == {"g5.12xlarge"}
    assert cluster.instance_type == "g5.12xlarge" and cluster.processes_per_host == 4
    assert cluster.market == "on-demand"  # the fallback: the controller tries spot again later
    aws.capacity.failing.clear()
    spot = aws.provider().provision(CapacityRequest.of(spec), "back", 1)
    assert spot.market == "spot"


@pytest.mark.timeout(60)
def test_capacity_retries_in_rounds_with_backoff(aws: Aws) -> None:
    s1, s2 = (s["SubnetId"] for s in aws.default_subnets()[:2])
    aws.capacity.fail_first = 3  # round 1 (two subnets) and the first of round 2
    aws.provider().provision(
        CapacityRequest.of(aws.spec(subnets=[s1, s2], max_wait=3600)), "rounds", 1
    )
    assert aws.capacity.launches == [("on-demand", "g5.xlarge", s) for s in (s1, s2, s1, s2)]
    assert aws.clock.sleeps[0] == 10.0  # the backoff after round 1
    assert len(set(aws.capacity.tokens)) == 4  # a later round is a new request, not a replay


@pytest.mark.timeout(60)
def test_capacity_gives_up_at_max_wait_saying_what_was_tried(aws: Aws) -> None:
    s1, s2 = (s["SubnetId"] for s in aws.default_subnets()[:2])
    spec = aws.spec(
        use_spot_instances=True,
        subnets=[s1, s2],
        max_wait=100,
        fallback_instance_types=["g5.2xlarge"],
    )
    aws.capacity.fail_all = "InsufficientInstanceCapacity"
    with pytest.raises(CapacityError) as info:
        aws.provider().provision(CapacityRequest.of(spec), "starved", 1)
    # rounds at t=0, 10, 30, 70; the next backoff (40 s) would pass 100 s (the job's max_wait)
    assert aws.clock.sleeps == [10.0, 20.0, 40.0]
    assert len(aws.capacity.launches) == 4 * 4
    message = str(info.value)
    assert "\n" not in message
    assert "4 round(s)" in message and "retrying for 100 s" in message
    for t in ("g5.xlarge", "g5.2xlarge"):
        for s in (s1, s2):
            assert f"{t} spot in {s} (InsufficientInstanceCapacity)" in message
    assert job_instances(aws.client("ec2"), "starved") == []


@pytest.mark.timeout(60)
def test_a_launch_error_that_is_not_about_capacity_stops_at_once(aws: Aws) -> None:
    aws.capacity.fail_all = "InvalidParameterCombination"
    with pytest.raises(Exception) as info:
        aws.provider().provision(CapacityRequest.of(aws.spec()), "bad", 1)
    assert "InvalidParameterCombination" in str(info.value)
    assert len(aws.capacity.launches) == 1 and aws.clock.sleeps == []


@pytest.mark.timeout(60)
def test_nodes_that_die_while_booting_count_as_no_capacity_there(aws: Aws) -> None:
    s1, s2 = (s["SubnetId"] for s in aws.default_subnets()[:2])
    reclaimed: list[str] = []

    def reclaim_first_launch(parsed: dict[str, Any], **_: Any) -> None:
        if not reclaimed:  # EC2 takes the spot capacity back before the nodes run
            reclaimed.extend(i["InstanceId"] for i in parsed["Instances"])
            aws.client("ec2").terminate_instances(InstanceIds=reclaimed)

    aws.hooks.append(("after-call.ec2.RunInstances", reclaim_first_launch))
    cluster = aws.provider().provision(
        CapacityRequest.of(aws.spec(instance_count=2, use_spot_instances=True, subnets=[s1, s2])),
        "flaky",
        1,
    )
    assert aws.capacity.launches == [("spot", "g5.xlarge", s1), ("spot", "g5.xlarge", s2)]
    running = job_instances(aws.client("ec2"), "flaky")
    assert {i["SubnetId"] for i in running} == {s2} and len(running) == 2
    assert not {i["InstanceId"] for i in running} & set(reclaimed)
    assert [n.address for n in cluster.nodes] == [
        i["PrivateIpAddress"] for i in sorted(running, key=lambda i: i["AmiLaunchIndex"])
    ]


@pytest.mark.timeout(60)
def test_nodes_that_never_run_are_ended_at_the_boot_timeout(aws: Aws) -> None:
    def stuck_pending(parsed: dict[str, Any], **_: Any) -> None:
        for reservation in parsed.get("Reservations", []):
            for instance in reservation["Instances"]:
                instance["State"] = {"Code": 0, "Name": "pending"}

    aws.hooks.append(("after-call.ec2.DescribeInstances", stuck_pending))
    with pytest.raises(AwsError) as info:
        aws.provider().provision(CapacityRequest.of(aws.spec(instance_count=2)), "stuck", 1)
    assert "timed out after 60 s waiting for the nodes to run" in str(info.value)
    assert 55 <= aws.clock.now <= 61  # polled on the fake clock, every poll_seconds
    assert job_instances(aws.client("ec2"), "stuck") == []  # all or nothing


@pytest.mark.timeout(60)
def test_provision_again_after_losing_a_node_relaunches_all_with_a_new_token(aws: Aws) -> None:
    spec = aws.spec(instance_count=2)
    first = aws.provider().provision(CapacityRequest.of(spec), "partial", 1)
    lost = job_instances(aws.client("ec2"), "partial")[0]["InstanceId"]
    aws.client("ec2").terminate_instances(InstanceIds=[lost])
    second = aws.provider().provision(CapacityRequest.of(spec), "partial", 1)
    assert [n.address for n in second.nodes] != [n.address for n in first.nodes]
    running = job_instances(aws.client("ec2"), "partial")
    assert len(running) == 2 and lost not in {i["InstanceId"] for i in running}
    assert len(aws.capacity.tokens) == 2 and len(set(aws.capacity.tokens)) == 2


# -- preflight ----------------------------------------------------------------------------------


def preflight_error(aws: Aws, spec: JobSpec) -> SpecError:
    with pytest.raises(SpecError) as info:
        aws.provider().preflight(CapacityRequest.of(spec))
    error = info.value
    assert "\n" not in str(error)
    assert aws.recorder.mutating() == [], "preflight only reads"
    return error


@pytest.mark.timeout(60)
def test_preflight_passes_a_good_spec_with_reads_only(aws: Aws) -> None:
    spec = aws.spec(instance_type="p4d.24xlarge", fallback_instance_types=["g5.48xlarge"])
    aws.provider().preflight(CapacityRequest.of(spec))
    assert aws.recorder.mutating() == []
    assert {"GetCallerIdentity", "GetInstanceProfile", "DescribeImages"} <= {
        c.operation for c in aws.recorder.calls
    }


@pytest.mark.timeout(60)
def test_preflight_instance_type_not_in_region(aws: Aws) -> None:
    spec = aws.spec(instance_type="p4de.24xlarge", region="eu-west-1")
    error = preflight_error(aws, spec)
    assert error.field == "instance_type"
    assert "p4de.24xlarge is not offered in eu-west-1" in str(error)
    spec = aws.spec(
        instance_type="p4d.24xlarge",
        fallback_instance_types=["p4de.24xlarge"],
        region="eu-west-1",
    )
    assert preflight_error(aws, spec).field == "fallback_instance_types"


@pytest.mark.timeout(60)
def test_preflight_instance_profile_missing_or_unknown(aws: Aws) -> None:
    spec = aws.spec()
    spec = spec.model_copy(update={"instance_profile": None})
    assert preflight_error(aws, spec).field == "instance_profile"
    error = preflight_error(aws, aws.spec(instance_profile="no-such-profile"))
    assert error.field == "instance_profile" and "no-such-profile" in str(error)
    arn = "arn:aws:iam::123456789012:instance-profile/nope"
    assert preflight_error(aws, aws.spec(instance_profile=arn)).field == "instance_profile"
    aws.provider().preflight(
        CapacityRequest.of(
            aws.spec(instance_profile=f"arn:aws:iam::123456789012:instance-profile/{PROFILE}")
        )
    )


@pytest.mark.timeout(60)
def test_preflight_subnet_of_another_region(aws: Aws) -> None:
    west_subnet = aws.default_subnets("us-west-2")[0]["SubnetId"]
    error = preflight_error(aws, aws.spec(subnets=[west_subnet]))
    assert error.field == "subnets" and west_subnet in str(error) and REGION in str(error)
    vpc = aws.client("ec2").create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    other = aws.client("ec2").create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]
    aws.recorder.calls.clear()
    mixed = [aws.default_subnets()[0]["SubnetId"], other["SubnetId"]]
    error = preflight_error(aws, aws.spec(subnets=mixed))
    assert error.field == "subnets" and "one VPC" in str(error)


@pytest.mark.timeout(60)
def test_preflight_image_not_found(aws: Aws) -> None:
    error = preflight_error(aws, aws.spec(image_id="ami-0123456789abcdef0"))
    assert error.field == "image_id" and "ami-0123456789abcdef0" in str(error)
    error = preflight_error(aws, aws.spec(image_id="resolve:ssm:/trainctl-test/no-such-ami"))
    assert error.field == "image_id" and "/trainctl-test/no-such-ami" in str(error)
    aws.client("ssm").put_parameter(Name="/trainctl-test/ami", Value=IMAGE, Type="String")
    aws.provider().preflight(
        CapacityRequest.of(aws.spec(image_id="resolve:ssm:/trainctl-test/ami"))
    )


@pytest.mark.timeout(60)
def test_preflight_unknown_region(aws: Aws) -> None:
    error = preflight_error(aws, aws.spec(region="zz-nowhere-9"))
    assert error.field == "region" and "zz-nowhere-9" in str(error)


@pytest.mark.timeout(60)
def test_preflight_rejected_credentials_never_echo_the_key(aws: Aws, monkeypatch) -> None:
    key_id, secret = "AKIAZZZZZZZZZZZZZZZZ", "s3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    spec = aws.spec()
    for code in ("InvalidClientTokenId", "ExpiredToken"):

        def reject(code: str = code, **_: Any) -> None:
            # Real STS messages name no key; this one does, to prove it is scrubbed anyway.
            raise _client_error(
                code, f"The security token {key_id} / {secret} is invalid.", "GetCallerIdentity"
            )

        aws.hooks[:] = [("provide-client-params.sts.GetCallerIdentity", reject)]
        error = preflight_error(aws, spec)
        assert error.field == "credentials" and code in str(error)
        assert key_id not in str(error) and secret not in str(error)


@pytest.mark.timeout(60)
def test_preflight_without_credentials(aws: Aws, monkeypatch) -> None:
    spec = aws.spec()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    error = preflight_error(aws, spec)
    assert error.field == "credentials" and "no AWS credentials" in str(error)


@pytest.mark.timeout(60)
def test_preflight_failure_creates_nothing(aws: Aws) -> None:
    """The submit path: preflight first, and on an error nothing exists in the account."""
    spec = aws.spec(instance_profile="no-such-profile", instance_count=2)
    preflight_error(aws, spec)
    ec2 = aws.client("ec2")
    assert ec2.describe_instances()["Reservations"] == []
    assert ec2.describe_key_pairs()["KeyPairs"] == []
    groups = ec2.describe_security_groups()["SecurityGroups"]
    assert {g["GroupName"] for g in groups} == {"default"}
    assert aws.placement.groups == {}
    assert not (aws.src.parent / "home" / "ssh").exists()


# -- gc, cost, SSH ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_find_and_delete_leftovers_of_jobs_that_are_over(aws: Aws) -> None:
    provider = aws.provider()
    provider.provision(CapacityRequest.of(aws.spec(instance_count=2)), "done-job", 1)
    provider.provision(CapacityRequest.of(aws.spec()), "live-job", 1)
    asked: list[str] = []

    def is_live(job: str) -> bool:
        asked.append(job)
        return job == "live-job"

    leftovers = provider.find_leftovers(REGION, is_live)
    assert sorted(asked) == ["done-job", "live-job"]  # once per job
    assert {item["job"] for item in leftovers} == {"done-job"}
    kinds = [item["kind"] for item in leftovers]
    assert kinds == ["instance", "instance", "security-group", "placement-group", "key-pair"]
    assert all(item["region"] == REGION and item["attempt"] == "1" for item in leftovers)
    assert provider.delete_leftovers(REGION, leftovers) == []
    assert provider.find_leftovers(REGION, is_live) == []
    assert not any(job_resources(aws, "done-job").values())
    live = job_resources(aws, "live-job")
    assert live.pop("placement-groups") == []  # one node: it never had one
    assert all(live.values())


@pytest.mark.timeout(60)
def test_an_unreadable_record_keeps_its_resources_and_stops_no_cleanup(
    aws: Aws, tmp_path: Path
) -> None:
    """A job whose record cannot be read may be running: its resources are not leftovers,
    and the bad record does not stop gc judging the other jobs."""
    from trainctl.controller.submit import job_is_live
    from trainctl.record.jobstore import JobStore
    from trainctl.record.keys import JobKeys
    from trainctl.record.models import JobRecord
    from trainctl.state import JobState
    from trainctl.store import open_store

    store = open_store(tmp_path.as_uri())
    store.put_text(JobKeys("corrupt-job").record, '{"name": "corrupt-job", "state": ')
    when = "2026-11-29T00:00:00Z"
    fields = dict(store_uri=store.uri, source_uri=store.uri, source_sha256="0" * 64, owner="u")
    fields |= dict(trainctl_version="0", created_at=when, updated_at=when)
    done = JobRecord(name="done-job", state=JobState.COMPLETED, spec=aws.spec(), **fields)
    JobStore(store, "done-job").save(done)
    provider = aws.provider()
    provider.provision(CapacityRequest.of(aws.spec()), "corrupt-job", 1)
    provider.provision(CapacityRequest.of(aws.spec()), "done-job", 1)
    assert job_is_live(store, "corrupt-job") is True
    leftovers = provider.find_leftovers(REGION, lambda job: job_is_live(store, job))
    assert {item["job"] for item in leftovers} == {"done-job"}
    assert len(job_resources(aws, "corrupt-job")["instances"]) == 1
    # Warm time left by a job whose record cannot be read is not added to it (nor does it
    # stop a release of several pools); the readable job's cost takes it.
    from trainctl.controller.usage import record_idle
    from trainctl.provisioning.base import InstanceUsage

    idle = [InstanceUsage(1, 0, "i-1", "g5.xlarge", "on-demand", None, 0.0, 3600.0, 1.0, True)]
    assert record_idle(store, "corrupt-job", idle) is False
    assert record_idle(store, "done-job", idle) is True
    assert [c.instance_id for c in JobStore(store, "done-job").load().instances] == ["i-1"]


@pytest.mark.timeout(60)
def test_hourly_cost(aws: Aws) -> None:
    provider = aws.provider()
    on_demand = provider.hourly_cost(
        CapacityRequest.of(aws.spec(instance_type="p4d.24xlarge", instance_count=2))
    )
    assert on_demand == pytest.approx(2 * 32.7726)
    assert provider.hourly_cost(CapacityRequest.of(aws.spec(region="eu-west-1"))) is None
    spot = provider.hourly_cost(
        CapacityRequest.of(aws.spec(use_spot_instances=True, instance_count=4))
    )
    assert spot == pytest.approx(4 * 0.00001)
    subnets = [s["SubnetId"] for s in aws.default_subnets()[:2]]
    spot = provider.hourly_cost(
        CapacityRequest.of(aws.spec(use_spot_instances=True, subnets=subnets))
    )
    assert spot == pytest.approx(0.00001)


@pytest.mark.timeout(60)
def test_ssh_target_and_the_loopback_override(aws: Aws, monkeypatch) -> None:
    provider = aws.provider()
    cluster = provider.provision(CapacityRequest.of(aws.spec(instance_count=2)), "ssh", 1)
    instances = sorted(job_instances(aws.client("ec2"), "ssh"), key=lambda i: i["AmiLaunchIndex"])
    target = provider.ssh_target(cluster, 1)
    assert target.address == instances[1]["PublicIpAddress"] and target.port == 22
    assert target.user == "ubuntu" and target.python == "/opt/pytorch/bin/python"
    assert target.key_file == str(aws.src.parent / "home" / "ssh" / "id_ed25519")
    assert target.gpus == 1
    assert provider.node_runner(cluster, 0).python == "/opt/pytorch/bin/python"

    monkeypatch.setenv("TRAINCTL_SSH_ADDRESS_OVERRIDE", '["127.0.0.2:2201", "127.0.0.3:2202"]')
    target = provider.ssh_target(cluster, 1)
    assert (target.address, target.port) == ("127.0.0.3", 2202)
    assert target.gpus == 0  # a stand-in host has no GPU of its own
    again = aws.provider().provision(CapacityRequest.of(aws.spec(instance_count=2)), "ssh", 1)
    assert [n.address for n in again.nodes] == ["127.0.0.2", "127.0.0.3"]
    assert again.network_env["GLOO_SOCKET_IFNAME"] == "lo"
    # the stand-ins share this machine: each node gets its own layout root, not /opt/ml
    nodes = aws.src.parent / "home" / "nodes"
    assert [n.root for n in again.nodes] == [
        str(nodes / "ssh" / "attempt-1" / f"node-{r}") for r in range(2)
    ]
    assert all(Path(n.root).is_dir() for n in again.nodes)
    assert {n.root for n in cluster.nodes} == {"/"}  # real instances (no override)

    runner = provider.node_runner(again, 0)
    host = runner.target() if callable(runner.target) else runner.target
    assert (host.address, host.port, runner.rank) == ("127.0.0.2", 2201, 0)
    # Never halt a stand-in host (it is the machine the tests run on).
    # nor check it for the instance type's GPUs (it has none of its own)
    # botocore's instance-profile fetch gets 5 tries of 5 s, not 1 of 1 s (a busy node missed it)
    assert runner.agent_env == {
        "TRAINCTL_IMDS": "1",
        "TRAINCTL_GPU_HEALTH_CHECK": "0",
        "AWS_METADATA_SERVICE_TIMEOUT": "5",
        "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "5",
    }
    assert runner.wait_for_marker is False  # stand-in hosts run no user data
    assert runner.retry_auth is True  # a new instance may not have its key in place yet
    assert runner.known_hosts == provider.known_hosts("ssh")
    provider.terminate("ssh", grace=0)
    assert not nodes.exists(), "terminate removes the stand-in node roots"


@pytest.mark.timeout(30)
def test_local_ssh_key_is_private_and_stable(aws: Aws) -> None:
    path = aws.src.parent / "home" / "ssh" / "id_ed25519"
    line = ensure_key(path)
    assert line.startswith("ssh-ed25519 ") and line.endswith(" trainctl")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ensure_key(path) == line
    assert (path.parent / "id_ed25519.pub").read_text().strip() == line
    assert "PRIVATE KEY" not in line


@pytest.mark.timeout(30)
def test_more_workers_than_the_instance_has_gpus_is_one_line(aws: Aws) -> None:
    """NCCL needs a GPU per worker: refused before any call, naming the type's GPUs."""
    provider = aws.provider()
    uri = "s3://bucket/store"
    provider.check_offline(aws.spec(instance_type="p3.8xlarge", processes_per_host=4), uri)
    with pytest.raises(SpecError) as raised:
        provider.check_offline(aws.spec(processes_per_host=2), uri)
    assert str(raised.value) == (
        "processes_per_host: 2 workers per node but g5.xlarge has 1 GPU(s): at most 1 "
        "(NCCL needs a GPU each)"
    )


def _quotas(answers: list[tuple[str, float | None]]) -> Any:
    """A Service Quotas client whose answers are stubbed (botocore checks each request and
    answer against the API's model): (quota code asked, vCPUs; None: AccessDenied)."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client(
        "service-quotas", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s"
    )
    stub = Stubber(client)
    for code, value in answers:
        asked = {"ServiceCode": "ec2", "QuotaCode": code}
        if value is None:
            stub.add_client_error("get_service_quota", "AccessDeniedException", "no", 400, asked)
        else:
            quota = {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}
            stub.add_response("get_service_quota", {"Quota": quota}, asked)
    stub.activate()
    return client


def test_a_job_over_the_accounts_vcpu_quota_is_one_line_before_launch(aws) -> None:
    from trainctl.provisioning.aws.preflight import check_vcpu_quota, quota_class

    assert [quota_class(t) for t in ("p4d.24xlarge", "g5.xlarge", "c5.2xlarge", "inf2.xlarge")] == [
        "p", "g", "standard", None,
    ]  # fmt: skip
    over = CapacityRequest.of(aws.spec(instance_type="p3.2xlarge", instance_count=2048))
    with pytest.raises(SpecError) as refused:
        check_vcpu_quota(_quotas([("L-417A185B", 384.0)]), over, REGION)
    assert str(refused.value).startswith(
        "instance_count: 2048 x p3.2xlarge is 16,384 vCPUs; the account's quota for Running "
        f"On-Demand P instances in {REGION} is 384 vCPUs (Service Quotas L-417A185B)"
    )
    within = CapacityRequest.of(aws.spec(instance_type="p3.2xlarge", instance_count=48))
    check_vcpu_quota(_quotas([("L-417A185B", 384.0)]), within, REGION)
    spot = CapacityRequest.of(
        aws.spec(instance_type="g5.xlarge", instance_count=1024, use_spot_instances=True)
    )
    with pytest.raises(SpecError, match="All G and VT Spot Instance Requests"):
        check_vcpu_quota(_quotas([("L-3819A6DF", 64.0)]), spot, REGION)
    # not allowed to read quotas: left to EC2's own answer at launch
    check_vcpu_quota(_quotas([("L-417A185B", None)]), over, REGION)
