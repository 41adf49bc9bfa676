"""Every job field reaches the job through every door: the Estimator's keywords, the
`trainctl submit` options, the job file's keys and the SageMaker shim's mapping are all made
from JobSpec's declarations (trainctl.spec.fields), and these tests fail if one is missed."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import click
import pytest
import typer

from tests.helpers import FIXTURES
from trainctl.cli.app import app
from trainctl.estimator import Estimator
from trainctl.sagemaker._compat import PASSED, SAGEMAKER_ARGUMENTS, SIGNATURE
from trainctl.spec.door import Door
from trainctl.spec.fields import job_fields
from trainctl.spec.job import JobSpec

FIELDS = job_fields()


def _submit_command() -> click.Command:
    group = typer.main.get_command(app)
    return group.commands["submit"]  # type: ignore[attr-defined]


def test_every_jobspec_field_declares_one_door() -> None:
    assert [f.name for f in FIELDS] == list(JobSpec.model_fields)
    for field in FIELDS:
        assert isinstance(field.door, Door)
        assert field.door.help.strip(), field.name


def test_the_estimator_takes_every_field_by_its_name() -> None:
    params = inspect.signature(Estimator.__init__).parameters
    for field in FIELDS:
        assert field.name in params, field.name
    with pytest.raises(TypeError, match="did you mean 'instance_count'"):
        Estimator("train.py", instance_counts=2)


def test_submit_has_one_option_per_field_named_after_it() -> None:
    options = {
        opt: param
        for param in _submit_command().params
        for opt in param.opts + param.secondary_opts
    }
    visible = {p.name for p in _submit_command().params if not getattr(p, "hidden", False)}
    for field in FIELDS:
        if field.door.cli == "argument":
            continue
        assert field.flag in options, field.flag
        assert options[field.flag].name == field.name
        assert field.name in visible
        for old in field.door.old_flags:
            for spelling in old.split("/"):
                assert getattr(options[spelling], "hidden", False), spelling


def test_sagemaker_passes_every_field_it_shares_by_name() -> None:
    for field in FIELDS:
        stance = field.door.sagemaker
        if stance == "same":
            assert field.name in SAGEMAKER_ARGUMENTS, field.name
            assert field.name in PASSED or field.name in SIGNATURE, field.name
        elif stance is not None:
            assert stance.startswith("mapped: "), (field.name, stance)
        else:
            assert field.name not in SAGEMAKER_ARGUMENTS, (
                f"{field.name} is SageMaker's argument too: say how the shim maps it"
            )


# One value per field kind, given through the CLI and through the Estimator: the same spec.
CLI_AND_ESTIMATOR = [
    (["--instance-count", "2"], {"instance_count": 2}),
    (["--max-run", "60"], {"max_run": 60}),
    (
        ["-p", "epochs=3", "--hyperparameters", "lr=0.1"],
        {"hyperparameters": {"epochs": 3, "lr": 0.1}},
    ),
    (["-e", "A=1"], {"environment": {"A": "1"}}),
    (["--faults", "kill:0@5", "--faults", "notice:0@9"], {"faults": ["kill:0@5", "notice:0@9"]}),
    (["--workdir-ignore", "*.tmp"], {"workdir_ignore": ["*.tmp"]}),
    (
        ["--distribution", "torch_distributed"],
        {"distribution": {"torch_distributed": {"enabled": True}}},
    ),
    (
        ["--metric-definitions", "loss=loss: ([0-9.]+)"],
        {"metric_definitions": [{"Name": "loss", "Regex": "loss: ([0-9.]+)"}]},
    ),
    # a provider plug-in's options (plugins/trainctl-slurm): its own flags, or the field
    (
        ["--instance-type", "slurm", "--slurm-partition", "gpu", "--slurm-gpus-per-node", "4"],
        {"instance_type": "slurm", "slurm": {"partition": "gpu", "gpus_per_node": 4}},
    ),
    (
        ["--instance-type", "slurm", "--provider-options", 'slurm={"qos": "low"}'],
        {"instance_type": "slurm", "provider_options": {"slurm": {"qos": "low"}}},
    ),
    (
        ["-e", "TOKEN_X=t0ken", "--secret-env", "TOKEN_X"],
        {"environment": {"TOKEN_X": "t0ken"}, "secret_env": ["TOKEN_X"]},
    ),
]


@pytest.mark.parametrize(("argv", "fields"), CLI_AND_ESTIMATOR)
def test_a_field_given_at_either_door_makes_the_same_spec(
    argv: list[str], fields: dict, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TRAINCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    result, spec = _submitted(monkeypatch, ["train.py", "--source-dir", str(tmp_path), *argv])
    assert result.exit_code == 0, result.output
    from_estimator = Estimator("train.py", str(tmp_path), **fields).spec
    assert spec == from_estimator


def test_an_old_flag_still_works_with_one_deprecation_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    argv = ["train.py", "--source-dir", str(tmp_path), "--inject-fault", "kill:0@5", "--on-demand"]
    result, spec = _submitted(monkeypatch, argv)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "warning: --inject-fault is deprecated; use --faults",
        "warning: --on-demand is deprecated; use --no-use-spot-instances",
    ]
    assert spec.faults == ["kill:0@5"] and spec.use_spot_instances is False


def _submitted(monkeypatch, argv: list[str]):
    """`trainctl submit ARGV` up to its spec (nothing recorded): (result, JobSpec)."""
    from typer.testing import CliRunner

    from trainctl.spec import build

    real = build.build_spec
    seen = {}

    def capture(**fields):
        seen["spec"] = real(**fields)
        raise SystemExit(0)

    monkeypatch.setattr(build, "build_spec", capture)
    result = CliRunner().invoke(app, ["submit", *argv])
    return result, seen.get("spec")


def _base_type(annotation: Any) -> Any:
    """A field's type without its Annotated metadata (the door, constraints)."""
    import typing

    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def test_a_capacity_request_is_a_view_of_job_fields() -> None:
    """A provider's request declares no field of its own but those of one call (PER_CALL,
    set by the controller, named unlike any job field): each other is a JobSpec field of the
    same name and type, the provider blocks' too (a property where JobSpec computes it)."""
    import typing

    from trainctl.spec.job import JobSpec
    from trainctl.spec.request import BLOCKS, CapacityRequest

    hints = typing.get_type_hints(JobSpec, include_extras=False)
    views = [CapacityRequest, *BLOCKS.values()]
    for view in views:
        own = typing.get_type_hints(view)
        for name in view.model_fields:
            if name in BLOCKS:
                continue
            if name in CapacityRequest.PER_CALL:
                assert name not in JobSpec.model_fields, f"{name} means one thing, not two"
                continue
            assert name in JobSpec.model_fields, f"{view.__name__}.{name} is no job field"
            assert _base_type(own[name]) == _base_type(hints[name]), (
                f"{view.__name__}.{name}: {own[name]} vs {hints[name]}"
            )


def test_a_capacity_request_carries_the_spec_and_resizes_without_touching_it() -> None:
    from trainctl.spec.build import build_spec
    from trainctl.spec.request import CapacityRequest

    spec = build_spec(
        entry_point="probe.py",
        source_dir=str(FIXTURES / "probe"),
        instance_type="p3.2xlarge",
        fallback_instance_types=["g5.xlarge"],
        instance_count=4,
        min_instance_count=2,
        use_spot_instances=True,
        subnets=["subnet-0123456789abcdef0"],
        volume_size=50,
        instance_profile="trainer",
        output_path="s3://bucket/out",
    )
    request = CapacityRequest.of(spec)
    assert request.instance_types == ["p3.2xlarge", "g5.xlarge"]
    assert (request.instance_count, request.use_spot_instances) == (4, True)
    assert request.aws.subnets == ["subnet-0123456789abcdef0"]
    assert request.aws.root_volume_gb == 50 == spec.root_volume_gb
    assert request.aws.instance_profile == "trainer"
    assert request.output_path == "s3://bucket/out"
    smaller = request.with_count(2).retrying_for(0.4)
    assert (smaller.instance_count, smaller.retry_for) == (2, 1)
    assert request.retry_for == spec.max_wait  # a call retries for the job's budget at most
    assert request.instance_count == spec.instance_count == 4  # the job keeps its full size
    # nothing of the job's script, hyperparameters or secrets reaches a provider
    dumped = request.model_dump()
    for private in ("entry_point", "hyperparameters", "environment", "secret_env"):
        assert private not in dumped


def test_provider_options_may_come_as_a_block() -> None:
    """`aws: {...}` and `ssh: {...}` (a job file's grouping, as SkyPilot's YAML has it) are
    the flat fields; a key outside the block, or one given twice, is one line naming it."""
    from trainctl.errors import SpecError
    from trainctl.spec.build import build_spec

    common = {"entry_point": "probe.py", "source_dir": str(FIXTURES / "probe")}
    grouped = build_spec(
        **common,
        instance_type="p3.2xlarge",
        aws={"subnets": ["subnet-0123456789abcdef0"], "instance_profile": "trainer"},
    )
    flat = build_spec(
        **common,
        instance_type="p3.2xlarge",
        subnets=["subnet-0123456789abcdef0"],
        instance_profile="trainer",
    )
    assert grouped == flat
    assert grouped.aws.subnets == ["subnet-0123456789abcdef0"]
    hosts = build_spec(
        **common, instance_type="ssh", ssh={"hosts": [{"address": "127.0.0.1", "port": 2222}]}
    )
    assert hosts.ssh.hosts[0].port == 2222 and hosts.hosts == hosts.ssh.hosts
    with pytest.raises(SpecError, match=r"^aws\.region: is not an aws option; allowed: image_id"):
        build_spec(**common, instance_type="p3.2xlarge", aws={"region": "us-east-1"})
    with pytest.raises(SpecError, match=r"^aws\.subnets: is also given as subnets"):
        build_spec(**common, aws={"subnets": ["subnet-1"]}, subnets=["subnet-1"])
    with pytest.raises(SpecError, match=r"^ssh: must be a mapping of ssh options, got list"):
        build_spec(**common, ssh=["127.0.0.1"])
