"""The EC2 provider's requests, built without any AWS call: the dry run, field by field.

The dry run uses the same builders provision does (tests/unit/test_aws_provider.py checks that
the requests really sent equal these, placeholders filled in).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainctl.errors import SpecError
from trainctl.provisioning import get_provider
from trainctl.provisioning.aws import AwsProvider
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.pricing import on_demand_price
from trainctl.provisioning.aws.provider import parse_override
from trainctl.spec.build import build_spec
from trainctl.spec.catalog import CATALOG
from trainctl.spec.request import CapacityRequest

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SUBNET_A = "subnet-0123456789abcdef0"
SUBNET_B = "subnet-0123456789abcdef1"
AMI = "ami-0123456789abcdef0"
METADATA = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"}
SPOT_OPTIONS = {
    "MarketType": "spot",
    "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
}
POOL = f"""
pools:
  gpu-spot:
    provider: aws
    region: us-west-2
    instance_types: [g5.12xlarge, g5.48xlarge]
    use_spot_instances: true
    on_demand_fallback: true
    subnets: [{SUBNET_A}, {SUBNET_B}]
    image_id: {AMI}
    instance_profile: arn:aws:iam::123456789012:instance-profile/teams/trainctl-node
    volume_size: 500
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TRAINCTL_HOME, a fixed SSH CIDR, and credentials that must never show."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL)
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    monkeypatch.setenv("TRAINCTL_AWS_SSH_CIDR", "203.0.113.7/32")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLESESSIONTOKEN")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    return src


def plan(src: Path, job: str = "demo", **fields: Any) -> list[dict[str, Any]]:
    spec = build_spec(entry_point="train.py", source_dir=str(src), **fields)
    requests = get_provider(spec.instance_type).dry_run(CapacityRequest.of(spec), job, 1)
    text = json.dumps(requests)  # JSON as the CLI prints it; no secret in it
    assert SECRET not in text and ACCESS_KEY not in text and "SESSIONTOKEN" not in text
    return requests


def ops(requests: list[dict[str, Any]]) -> list[str]:
    return [r["operation"] for r in requests]


def tags(ctx_job: str, name: str, owner: str = "<name in the caller identity ARN>") -> list:
    return [
        {"Key": "trainctl:job", "Value": ctx_job},
        {"Key": "trainctl:attempt", "Value": "1"},
        {"Key": "trainctl:owner", "Value": owner},
        {"Key": "Name", "Value": name},
    ]


@pytest.mark.timeout(30)
def test_spot_p3_16xlarge_x4(env: Path) -> None:
    requests = plan(
        env,
        instance_type="p3.16xlarge",
        instance_count=4,
        use_spot_instances=True,
        region="us-east-1",
        instance_profile="trainctl-node",
    )
    assert ops(requests) == [
        "CreateSecurityGroup",
        "AuthorizeSecurityGroupIngress",
        "CreatePlacementGroup",
        "ImportKeyPair",
        "RunInstances",
        "CreateTags",
        "CreateTags",
        "CreateTags",
        "CreateTags",
    ]
    assert all(r["service"] == "ec2" and r["region"] == "us-east-1" for r in requests)
    group, ingress, placement, key, run, *rank_tags = requests
    assert group["params"] == {
        "GroupName": "trainctl-demo",
        "Description": "trainctl job demo: all traffic between its nodes, SSH from the submitter",
        "VpcId": "<VpcId of the default VPC>",
        "TagSpecifications": [
            {"ResourceType": "security-group", "Tags": tags("demo", "trainctl-demo")}
        ],
    }
    sg = "<security-group-id>"
    assert ingress["params"]["GroupId"] == sg
    assert ingress["params"]["IpPermissions"] == [
        {
            "IpProtocol": "-1",
            "UserIdGroupPairs": [
                {"GroupId": sg, "Description": "all traffic between the job's nodes"}
            ],
        },
        {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [
                {"CidrIp": "203.0.113.7/32", "Description": "SSH from the trainctl submitter"}
            ],
        },
    ]
    assert placement["params"] == {
        "GroupName": "trainctl-demo",
        "Strategy": "cluster",
        "TagSpecifications": [
            {"ResourceType": "placement-group", "Tags": tags("demo", "trainctl-demo")}
        ],
    }
    home = Path(str(env.parent / "home"))
    assert key["params"] == {
        "KeyName": "trainctl-demo",
        "PublicKeyMaterial": f"<public key of {home / 'ssh' / 'id_ed25519'}>",
        "TagSpecifications": [{"ResourceType": "key-pair", "Tags": tags("demo", "trainctl-demo")}],
    }
    assert not (home / "ssh").exists(), "a dry run creates no key"

    params = run["params"]
    assert run["when"] == "first"
    ssm = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04"
    assert params["ImageId"] == f"<AMI id in SSM parameter {ssm}/latest/ami-id>"
    assert params["InstanceType"] == "p3.16xlarge"
    assert (params["MinCount"], params["MaxCount"]) == (4, 4)
    assert params["ClientToken"].startswith("<ClientToken")  # the subnet is found at launch
    assert params["KeyName"] == "trainctl-demo"
    assert params["IamInstanceProfile"] == {"Name": "trainctl-node"}
    assert params["MetadataOptions"] == METADATA
    assert params["BlockDeviceMappings"] == [
        {
            "DeviceName": f"<RootDeviceName of {params['ImageId']}>",
            "Ebs": {
                "VolumeSize": 200,
                "VolumeType": "gp3",
                "Encrypted": True,
                "DeleteOnTermination": True,
            },
        }
    ]
    assert params["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert params["InstanceMarketOptions"] == SPOT_OPTIONS  # no MaxPrice: up to on-demand
    assert params["SubnetId"] == rq.DEFAULT_SUBNET_PLACEHOLDER
    assert params["SecurityGroupIds"] == [sg]
    assert params["Placement"] == {"GroupName": "trainctl-demo"}
    assert "NetworkInterfaces" not in params  # p3.16xlarge has no EFA
    instance_tags = tags("demo", "trainctl-demo-1")
    assert params["TagSpecifications"] == [
        {"ResourceType": kind, "Tags": instance_tags}
        for kind in ("instance", "volume", "network-interface", "spot-instances-request")
    ]
    user_data = params["UserData"]
    assert user_data.startswith("#!/bin/bash\n")
    assert "chown ubuntu: /opt/ml /opt/trainctl" in user_data
    assert "python3" in user_data
    for word in ("AWS_", "SECRET", "TOKEN", "PASSWORD"):
        assert word not in user_data
    assert [t["params"] for t in rank_tags] == [
        {
            "Resources": [f"<instance id of rank {r}>"],
            "Tags": [
                {"Key": "trainctl:rank", "Value": str(r)},
                {"Key": "Name", "Value": f"trainctl-demo-1-algo-{r + 1}"},
            ],
        }
        for r in range(4)
    ]


@pytest.mark.timeout(30)
def test_on_demand_p4d_x2_has_four_efa_interfaces_and_a_placement_group(env: Path) -> None:
    requests = plan(
        env,
        instance_type="p4d.24xlarge",
        instance_count=2,
        region="us-east-1",
        subnets=[SUBNET_A],
        image_id=AMI,
        instance_profile="trainctl-node",
        volume_size=1000,
    )
    assert ops(requests)[:5] == [
        "CreateSecurityGroup",
        "AuthorizeSecurityGroupIngress",
        "CreatePlacementGroup",
        "ImportKeyPair",
        "RunInstances",
    ]
    assert requests[0]["params"]["VpcId"] == f"<VpcId of {SUBNET_A}>"
    runs = [r for r in requests if r["operation"] == "RunInstances"]
    assert len(runs) == 1
    params = runs[0]["params"]
    assert params["ImageId"] == AMI
    assert params["BlockDeviceMappings"][0]["DeviceName"] == f"<RootDeviceName of {AMI}>"
    assert params["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 1000
    assert "InstanceMarketOptions" not in params
    # EFA: groups and subnet live in each interface, never at the top level
    assert "SubnetId" not in params and "SecurityGroupIds" not in params
    assert params["NetworkInterfaces"] == [
        {
            "NetworkCardIndex": card,
            "DeviceIndex": 0 if card == 0 else 1,
            "InterfaceType": "efa",
            "SubnetId": SUBNET_A,
            "Groups": ["<security-group-id>"],
            "DeleteOnTermination": True,
        }
        for card in range(4)
    ]
    assert params["Placement"] == {"GroupName": "trainctl-demo"}
    assert [t["ResourceType"] for t in params["TagSpecifications"]] == [
        "instance",
        "volume",
        "network-interface",
    ]
    assert params["ClientToken"] == rq.client_token(
        "demo", 1, rq.LaunchChoice(rq.ON_DEMAND, "p4d.24xlarge", SUBNET_A), 1
    )
    cluster = get_provider("p4d.24xlarge").planned_cluster(
        CapacityRequest.of(
            build_spec(
                entry_point="train.py",
                source_dir=str(env),
                instance_type="p4d.24xlarge",
                instance_count=2,
                instance_profile="trainctl-node",
            )
        ),
        "demo",
        1,
    )
    assert cluster.processes_per_host == 8
    assert cluster.network_env == {
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "FI_PROVIDER": "efa",
        "RDMAV_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }


@pytest.mark.timeout(30)
def test_single_g5_node_with_own_security_group_needs_no_group_of_its_own(env: Path) -> None:
    requests = plan(
        env,
        instance_type="g5.xlarge",
        region="eu-west-1",
        subnets=[SUBNET_A],
        security_group_ids=["sg-0123456789abcdef0"],
        image_id="resolve:ssm:/my/team/ami",
        instance_profile="trainctl-node",
    )
    # no security group (the user's), no placement group (one node)
    assert ops(requests) == ["ImportKeyPair", "RunInstances", "CreateTags"]
    params = requests[1]["params"]
    assert requests[1]["region"] == "eu-west-1"
    assert params["ImageId"] == "<AMI id in SSM parameter /my/team/ami>"
    assert params["SubnetId"] == SUBNET_A
    assert params["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
    assert "Placement" not in params
    assert "NetworkInterfaces" not in params
    assert (params["MinCount"], params["MaxCount"]) == (1, 1)


@pytest.mark.timeout(30)
def test_pool_with_two_subnets_and_two_types_shows_the_fallback_order(env: Path) -> None:
    requests = plan(env, pool="gpu-spot", instance_count=2)
    runs = [r for r in requests if r["operation"] == "RunInstances"]
    order = [
        (
            "spot" if "InstanceMarketOptions" in r["params"] else "on-demand",
            r["params"]["InstanceType"],
            r["params"].get("SubnetId") or r["params"]["NetworkInterfaces"][0]["SubnetId"],
        )
        for r in runs
    ]
    assert order == [
        (market, instance_type, subnet)
        for market in ("spot", "on-demand")
        for instance_type in ("g5.12xlarge", "g5.48xlarge")
        for subnet in (SUBNET_A, SUBNET_B)
    ]
    assert [r["when"] for r in runs] == ["first"] + [
        "after a capacity error of the request before"
    ] * 7
    assert len({r["params"]["ClientToken"] for r in runs}) == 8
    for run in runs:
        params = run["params"]
        assert run["region"] == "us-west-2"
        assert params["IamInstanceProfile"] == {
            "Arn": "arn:aws:iam::123456789012:instance-profile/teams/trainctl-node"
        }
        assert params["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
        # g5.12xlarge and g5.48xlarge have one EFA interface each
        assert [i["InterfaceType"] for i in params["NetworkInterfaces"]] == ["efa"]
        assert params["NetworkInterfaces"][0]["DeviceIndex"] == 0
        assert params["Placement"] == {"GroupName": "trainctl-demo"}


@pytest.mark.timeout(30)
def test_dry_run_refuses_bad_input_before_anything(env: Path, monkeypatch) -> None:
    with pytest.raises(SpecError) as info:
        plan(env, instance_type="g5.xlarge", region="us-east-1")
    assert info.value.field == "instance_profile"
    with pytest.raises(SpecError) as info:
        plan(env, instance_type="g5.xlarge", instance_profile="p")  # no region anywhere
    assert info.value.field == "region"
    monkeypatch.setenv("TRAINCTL_AWS_SSH_CIDR", "203.0.113.7/33")
    with pytest.raises(SpecError) as info:
        plan(env, instance_type="g5.xlarge", region="us-east-1", instance_profile="p")
    assert info.value.field == "aws_ssh_cidr"
    assert "\n" not in str(info.value)


@pytest.mark.timeout(30)
def test_dry_run_without_ssh_cidr_says_where_the_address_comes_from(env: Path, monkeypatch) -> None:
    monkeypatch.delenv("TRAINCTL_AWS_SSH_CIDR")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    requests = plan(env, instance_type="g5.xlarge", instance_profile="p")
    ingress = requests[1]["params"]["IpPermissions"][1]
    assert ingress["IpRanges"][0]["CidrIp"] == "<this machine's public IPv4 address>/32"
    assert requests[1]["region"] == "us-east-2"


@pytest.mark.timeout(10)
def test_launch_choices_order_and_markets(env: Path) -> None:
    def choices(**fields: Any) -> list[tuple[str, str, str]]:
        spec = build_spec(
            entry_point="train.py",
            source_dir=str(env),
            instance_type="g5.xlarge",
            instance_profile="p",
            **fields,
        )
        return [
            (c.market, c.instance_type, c.subnet)
            for c in rq.launch_choices(CapacityRequest.of(spec), ["s1", "s2"])
        ]

    assert choices() == [("on-demand", "g5.xlarge", "s1"), ("on-demand", "g5.xlarge", "s2")]
    assert choices(use_spot_instances=True, fallback_instance_types=["g5.2xlarge"]) == [
        ("spot", "g5.xlarge", "s1"),
        ("spot", "g5.xlarge", "s2"),
        ("spot", "g5.2xlarge", "s1"),
        ("spot", "g5.2xlarge", "s2"),
    ]
    assert choices(use_spot_instances=True, on_demand_fallback=True)[2:] == [
        ("on-demand", "g5.xlarge", "s1"),
        ("on-demand", "g5.xlarge", "s2"),
    ]


@pytest.mark.timeout(10)
def test_client_token_is_stable_per_choice_and_new_per_round() -> None:
    choice = rq.LaunchChoice(rq.SPOT, "g5.xlarge", SUBNET_A)
    token = rq.client_token("job", 1, choice, 1)
    assert token == rq.client_token("job", 1, choice, 1)
    assert len(token) <= 64 and token.isascii()
    others = {
        rq.client_token("job", 1, choice, 2),
        rq.client_token("job", 2, choice, 1),
        rq.client_token("job", 1, rq.LaunchChoice(rq.ON_DEMAND, "g5.xlarge", SUBNET_A), 1),
        rq.client_token("job", 1, rq.LaunchChoice(rq.SPOT, "g5.xlarge", SUBNET_B), 1),
    }
    assert token not in others and len(others) == 4


@pytest.mark.timeout(10)
def test_network_env_per_instance_type() -> None:
    assert rq.network_env("g5.xlarge") == {"NCCL_SOCKET_IFNAME": "^lo,docker"}
    p3dn = rq.network_env("p3dn.24xlarge")
    assert p3dn["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in p3dn
    assert rq.network_env("p5.48xlarge")["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert rq.network_env("p4de.24xlarge")["FI_EFA_USE_DEVICE_RDMA"] == "1"


@pytest.mark.timeout(10)
def test_catalog_has_the_ec2_gpu_types() -> None:
    efa = {
        "p3.2xlarge": 0,
        "p3.8xlarge": 0,
        "p3.16xlarge": 0,
        "p3dn.24xlarge": 1,
        "p4d.24xlarge": 4,
        "p4de.24xlarge": 4,
        "p5.48xlarge": 32,
        "g5.xlarge": 0,
        "g5.2xlarge": 0,
        "g5.4xlarge": 0,
        "g5.8xlarge": 1,
        "g5.12xlarge": 1,
        "g5.16xlarge": 1,
        "g5.24xlarge": 1,
        "g5.48xlarge": 1,
    }
    for name, interfaces in efa.items():
        entry = CATALOG[name]
        assert entry.provider == "aws"
        assert entry.efa_interfaces == interfaces, name
        assert entry.gpus >= 1 and entry.gpu_memory_gib >= 16 and entry.vcpus >= 4
        assert entry.on_demand_usd_per_hour > 0
    assert CATALOG["p5.48xlarge"].gpus == 8 and CATALOG["p4de.24xlarge"].gpu_memory_gib == 640
    assert on_demand_price("g5.xlarge", "us-east-1") == CATALOG["g5.xlarge"].on_demand_usd_per_hour
    assert on_demand_price("g5.xlarge", "eu-west-1") is None  # list prices are us-east-1's


@pytest.mark.timeout(10)
def test_small_helpers() -> None:
    assert rq.instance_profile_name("arn:aws:iam::1:instance-profile/a/b/node") == "node"
    assert rq.instance_profile_name("node") == "node"
    assert rq.instance_profile("arn:aws:iam::1:instance-profile/node") == {
        "Arn": "arn:aws:iam::1:instance-profile/node"
    }
    assert parse_override("127.0.0.2:2222") == ("127.0.0.2", 2222)
    assert parse_override("127.0.0.2") == ("127.0.0.2", 22)
    assert parse_override("[::1]:2200") == ("::1", 2200)
    assert isinstance(get_provider("g5.xlarge"), AwsProvider)
