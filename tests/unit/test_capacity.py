"""Capacity fields, resource pools, `trainctl pools`, and the dry run / estimate of a job.

Only offline behaviour here: the EC2 and SSH providers' own requests are tested with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainctl import Estimator
from trainctl.cli import app
from trainctl.cli.app import EXIT_BAD_INPUT
from trainctl.cli.submit import parse_host
from trainctl.errors import SpecError
from trainctl.spec.build import build_spec

POOLS = """
pools:
  gpu:
    provider: aws
    region: us-east-1
    instance_types: [p3.16xlarge, p3.8xlarge]
    use_spot_instances: true
    on_demand_fallback: true
    subnets: [subnet-0123456789abcdef0, subnet-0123456789abcdef1]
    instance_profile: trainctl-node
    max_instances: 4
    keep_alive_period_in_seconds: 900
  lab:
    provider: ssh
    hosts:
      - {address: 127.0.0.2, user: root, gpus: 2}
      - {address: 127.0.0.3, port: 2222}
"""


@pytest.fixture
def cap_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOLS)
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    monkeypatch.delenv("TRAINCTL_STORE", raising=False)
    return home


@pytest.fixture
def script(tmp_path: Path) -> str:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    return str(src / "train.py")


def _error(**fields: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        build_spec(**fields)
    return info.value


@pytest.mark.timeout(30)
def test_pool_fills_the_capacity_fields_and_the_job_overrides_them(cap_home, script) -> None:
    spec = build_spec(entry_point=script, pool="gpu", instance_count=2)
    assert spec.provider == "aws"
    assert spec.instance_types == ["p3.16xlarge", "p3.8xlarge"]
    assert (spec.region, spec.use_spot_instances, spec.on_demand_fallback) == (
        "us-east-1",
        True,
        True,
    )
    assert spec.subnets == ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
    assert spec.instance_profile == "trainctl-node" and spec.pool == "gpu"
    assert spec.keep_alive_period_in_seconds == 900
    no_warm = build_spec(entry_point=script, pool="gpu", keep_alive_period_in_seconds=0)
    assert no_warm.keep_alive_period_in_seconds == 0
    # The job's own values win over the pool's.
    mine = build_spec(entry_point=script, pool="gpu", instance_type="g5.xlarge", region="us-west-2")
    assert (mine.instance_type, mine.region) == ("g5.xlarge", "us-west-2")
    lab = build_spec(entry_point=script, pool="lab", instance_count=2)
    assert lab.provider == "ssh" and [h.address for h in lab.hosts] == ["127.0.0.2", "127.0.0.3"]
    assert lab.hosts[1].port == 2222 and lab.hosts[0].gpus == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"pool": "nope"}, "pool", "'nope' not found; configured pools: gpu, lab"),
        ({"pool": "gpu", "instance_count": 5}, "instance_count", "max_instances (4)"),
        ({"pool": "lab", "instance_count": 3}, "instance_count", "only 2 host(s)"),
        ({"use_spot_instances": True}, "use_spot_instances", "EC2 instance types only"),
        ({"instance_type": "local", "subnets": ["subnet-0123456789abcdef0"]}, "subnets", "EC2"),
        ({"instance_type": "p3.2xlarge", "subnets": ["subnet-1"]}, "subnets", "not a subnet"),
        ({"instance_type": "p3.2xlarge", "region": "mars-1"}, "region", "AWS region"),
        ({"instance_type": "p3.2xlarge", "image_id": "ubuntu"}, "image_id", "AMI id"),
        (
            {"instance_type": "p3.2xlarge", "security_group_ids": ["default"]},
            "security_group_ids",
            "security group",
        ),
        (
            {"instance_type": "p3.2xlarge", "fallback_instance_types": ["local"]},
            "fallback_instance_types",
            "not an EC2 instance type",
        ),
        (
            {"instance_type": "p3.2xlarge", "on_demand_fallback": True},
            "on_demand_fallback",
            "use_spot_instances",
        ),
        ({"instance_type": "ssh"}, "hosts", "needs a list of hosts"),
        ({"hosts": [{"address": "127.0.0.2"}]}, "hosts", "only for instance_type 'ssh'"),
        (
            {"instance_type": "ssh", "hosts": [{"address": "127.0.0.2", "pasword": "x"}]},
            "hosts.0.pasword",
            "unknown key",
        ),
        ({"instance_type": "p3.2xlarge", "volume_size": 4}, "volume_size", "greater than"),
    ],
)
def test_bad_capacity_input_is_one_clear_error(cap_home, script, fields, field, text) -> None:
    err = _error(entry_point=script, **fields)
    assert err.field == field, str(err)
    assert text in str(err) and "\n" not in str(err)


@pytest.mark.timeout(30)
def test_a_typo_in_a_pool_fails_when_the_settings_load(tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("pools:\n  p:\n    provider: aws\n    regoin: x\n")
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    result = CliRunner().invoke(app, ["pools"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "error: pools.p.regoin: unknown setting (in " in result.output


@pytest.mark.timeout(30)
def test_pools_command_lists_the_configured_pools(cap_home) -> None:
    result = CliRunner().invoke(app, ["pools", "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert sorted(data) == ["gpu", "lab"]
    assert data["gpu"]["instance_types"] == ["p3.16xlarge", "p3.8xlarge"]
    assert data["lab"]["hosts"][1] == {
        "address": "127.0.0.3",
        "port": 2222,
        "user": None,
        "key_file": None,
        "gpus": 0,
        "python": "python3",
        "host_key": None,
        "proxy_jump": None,
    }
    table = CliRunner().invoke(app, ["pools"], env={"COLUMNS": "200"})
    assert table.exit_code == 0
    assert "spot (on-demand fallback)" in table.output and "2 host(s)" in table.output


def test_parse_host() -> None:
    assert parse_host("ubuntu@10.0.0.5:2222", "~/k") == {
        "address": "10.0.0.5",
        "user": "ubuntu",
        "port": 2222,
        "key_file": str(Path("~/k").expanduser()),
    }
    assert parse_host("gpu1", None) == {"address": "gpu1"}
    assert parse_host("[::1]:22", None) == {"address": "::1", "port": 22}
    with pytest.raises(SpecError):
        parse_host("a:b:c@:x", None)


@pytest.mark.timeout(60)
def test_local_dry_run_plans_every_node_and_changes_nothing(cap_home, tmp_path) -> None:
    src = tmp_path / "job"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    est = Estimator(
        "train.py",
        source_dir=str(src),
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={"lr": 0.1},
        environment={"WANDB_API_KEY": "s3cr3t-value", "MODE": "fast"},
        job_name="plan-me",
    )
    plan = est.fit(dry_run=True)
    text = json.dumps(plan)
    assert "s3cr3t-value" not in text
    assert plan["job"] == "plan-me" and plan["provider"] == "local"
    source, *creates = plan["requests"]
    assert (source["service"], source["operation"]) == ("store", "PutFile")
    assert source["params"]["files"] == 1 and len(source["params"]["sha256"]) == 64
    assert [r["operation"] for r in creates] == ["CreateNode", "CreateNode"]
    assert [n["rank"] for n in plan["nodes"]] == [0, 1]
    for node in plan["nodes"]:
        rank = node["rank"]
        # a local node's SM_HOSTS name is a loopback address of its own (numeric: no
        # /etc/hosts entry needed); all of them reach this machine
        assert node["host"] == f"127.0.1.{rank + 1}" and node["address"] == "127.0.0.1"
        assert node["agent"][1:] == [
            "-m",
            "trainctl.node.agent",
            "--store",
            f"file://{cap_home / 'store'}",
            "--job",
            "plan-me",
            "--attempt",
            "1",
            "--rank",
            str(rank),
        ]
        cmd = node["command"]
        assert cmd[1:3] == ["-m", "trainctl.launcher.torchrun_main"]
        assert cmd[cmd.index("--node-rank") + 1] == str(rank)
        assert cmd[-3:] == ["train.py", "--lr", "0.1"]
        env = node["env"]
        assert env["WANDB_API_KEY"] == "<redacted>" and env["MODE"] == "fast"
        assert env["SM_CURRENT_HOST"] == f"127.0.1.{rank + 1}" and env["SM_HOST_COUNT"] == "2"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
    # Nothing was made: no job record, no uploaded source, no node directory.
    assert not (cap_home / "store" / "jobs").exists()
    assert not (cap_home / "store" / "sources").exists()
    assert not (cap_home / "nodes").exists()


@pytest.mark.timeout(60)
def test_cli_dry_run_and_estimate(cap_home, script) -> None:
    result = CliRunner().invoke(app, ["submit", script, "--dry-run", "-o", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["provider"] == "local" and len(plan["nodes"]) == 1
    result = CliRunner().invoke(app, ["submit", script, "--estimate", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["estimate"]["usd_per_hour"] is None  # own machine
    bad = CliRunner().invoke(app, ["submit", script, "--pool", "nope", "--dry-run"])
    assert bad.exit_code == EXIT_BAD_INPUT
    assert not (cap_home / "store" / "jobs").exists()


def test_cost_summary_counts_spot_savings_and_unpriced_instances(monkeypatch) -> None:
    from trainctl.record.costs import InstanceCost, cost_summary, cost_text

    spot = dict(instance_type="p3.2xlarge", market="spot", seconds=3600.0)
    instances = [
        InstanceCost(
            attempt=1,
            rank=0,
            instance_id="i-1",
            usd_per_hour=1.0,
            **spot,
            on_demand_usd_per_hour=3.06,
        ),
        InstanceCost(
            attempt=2,
            rank=0,
            instance_id="i-2",
            usd_per_hour=1.5,
            **{**spot, "seconds": 1800.0},
            on_demand_usd_per_hour=3.06,
        ),
        InstanceCost(attempt=2, rank=1, instance_id="i-3", usd_per_hour=None, **spot),
    ]
    cost = cost_summary(instances)
    assert cost == {
        "usd": 1.75,
        "on_demand_usd": 4.59,
        "spot_savings_usd": 2.84,
        "instance_seconds": 9000.0,
        "unpriced_instances": 1,
        "warm_seconds": 0,
        "store_usd": None,  # a file:// store costs no requests
    }
    assert cost_text(cost) == (
        "$1.75 for 2.50 instance-hours; spot saved $2.84 of $4.59 "
        "(1 instance(s) without a price not counted)"
    )
    # An S3 store: the nodes' supervision requests at S3's list prices, beside the instances
    # (the settings' defaults: 360 lease reads and 540 log and status writes a node-hour)
    for name in ("CONTROL_POLL_SECONDS", "LOG_SYNC_SECONDS"):
        monkeypatch.delenv(f"TRAINCTL_{name}", raising=False)
    on_s3 = cost_summary(instances, store_uri="s3://bucket/store", nodes=2)
    per_node_hour = 360 * 0.0004 / 1000 + 540 * 0.005 / 1000
    assert on_s3["store_usd"] == pytest.approx(2.5 * per_node_hour, rel=1e-3)
    assert cost_text(on_s3).endswith(
        f"; the nodes' store requests about ${2.5 * per_node_hour:.4f} more, 0.41 % of that"
    )
    assert cost_summary([]) is None
    assert cost_text(None).startswith("none billed")  # local or SSH capacity


@pytest.mark.timeout(30)
def test_ec2_job_names_a_missing_instance_profile_before_any_call(cap_home, script, monkeypatch):
    # No credentials and no endpoint: a call would fail differently (or hang on the network).
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINCTL_STORE", "s3://bucket/prefix")
    args = ["submit", script, "--instance-type", "g5.xlarge", "--region", "us-east-1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "error: instance_profile: " in result.output
    monkeypatch.delenv("TRAINCTL_STORE")
    result = CliRunner().invoke(app, [*args, "--instance-profile", "p", "--dry-run"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "error: TRAINCTL_STORE: " in result.output and "s3://" in result.output
