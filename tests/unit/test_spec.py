"""JobSpec validation: every bad input fails in build_spec with one line naming the field.

Pure validation, no jobs: a tmp source dir with a train.py is all the filesystem needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainctl.errors import SpecError
from trainctl.estimator import Estimator
from trainctl.spec.build import build_spec
from trainctl.spec.catalog import CATALOG
from trainctl.spec.job import JobSpec
from trainctl.spec.parts import parse_distribution


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    (d / "pkg").mkdir(parents=True)
    (d / "train.py").write_text("print('hi')\n")
    (d / "pkg" / "main.py").write_text("print('hi')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    return d


def _base(src: Path) -> dict[str, Any]:
    return {"entry_point": "train.py", "source_dir": str(src)}


def _spec_error(**fields: Any) -> str:
    with pytest.raises(SpecError) as info:
        build_spec(**fields)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


# --- bad input -----------------------------------------------------------------------------

# (case id, fields over the valid base, the field the message must start with, extra words)
BAD_FIELDS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("entry-point-not-found", {"entry_point": "nope.py"}, "entry_point", ("nope.py",)),
    ("entry-point-dotdot", {"entry_point": "../outside.py"}, "entry_point", ("outside",)),
    ("instance-count-0", {"instance_count": 0}, "instance_count", ()),
    ("instance-count-neg", {"instance_count": -1}, "instance_count", ()),
    ("instance-count-too-big", {"instance_count": 100_000}, "instance_count", ()),
    ("processes-per-host-0", {"processes_per_host": 0}, "processes_per_host", ()),
    ("max-run-0", {"max_run": 0}, "max_run", ()),
    (
        "instance-type-unknown",
        {"instance_type": "p9.mega"},
        "instance_type",
        ("p9.mega", "local", "any EC2 type"),
    ),
    ("hp-object", {"hyperparameters": {"a": object()}}, "hyperparameters", ("a",)),
    ("hp-set", {"hyperparameters": {"a": {1, 2}}}, "hyperparameters", ("a",)),
    ("hp-nan", {"hyperparameters": {"lr": float("nan")}}, "hyperparameters", ("lr",)),
    ("hp-inf", {"hyperparameters": {"lr": float("inf")}}, "hyperparameters", ("lr",)),
    ("hp-nested-nan", {"hyperparameters": {"lr": [float("nan")]}}, "hyperparameters", ("lr",)),
    ("hp-bad-key", {"hyperparameters": {"-x": 1}}, "hyperparameters", ("-x",)),
    ("hp-not-a-dict", {"hyperparameters": [1, 2]}, "hyperparameters", ()),
    (
        "channels-same-variable",
        {"inputs": {"train-a": "file:///tmp", "TRAIN.A": "file:///tmp"}},
        "inputs",
        ("'train-a' and 'TRAIN.A'", "SM_CHANNEL_TRAIN_A"),
    ),
    (
        "distribution-unknown-key",
        {"distribution": {"pytorchddp": {"enabled": True}}},
        "distribution",
        ("pytorchddp", "allowed: mpi, smdistributed, torch_distributed"),
    ),
    (
        "distribution-both",
        {"distribution": {"torch_distributed": {"enabled": True}, "mpi": {"enabled": True}}},
        "distribution",
        ("torch_distributed", "mpi"),
    ),
    (
        "distribution-mpi-unknown-key",
        {"distribution": {"mpi": {"enabled": True, "hosts": 2}}},
        "distribution.mpi",
        ("hosts", "custom_mpi_options"),
    ),
    ("distribution-shorthand", {"distribution": "horovod"}, "distribution", ("horovod",)),
    ("input-ftp", {"inputs": {"train": "ftp://x"}}, "inputs", ("inputs.train", "ftp")),
    ("input-bad-s3", {"inputs": {"train": "s3://"}}, "inputs", ("inputs.train",)),
    ("input-not-a-string", {"inputs": {"train": 1}}, "inputs", ()),
    ("output-path-ftp", {"output_path": "ftp://x"}, "output_path", ("ftp",)),
    ("checkpoint-uri-ftp", {"checkpoint_s3_uri": "ftp://x"}, "checkpoint_s3_uri", ("ftp",)),
    ("job-name-chars", {"job_name": "bad_name!"}, "job_name", ("bad_name!",)),
    ("job-name-leading-hyphen", {"job_name": "-lead"}, "job_name", ("-lead",)),
    ("job-name-trailing-hyphen", {"job_name": "trail-"}, "job_name", ()),
    ("job-name-64", {"job_name": "a" * 64}, "job_name", ("63",)),
    ("job-name-empty", {"job_name": ""}, "job_name", ()),
    ("channel-name", {"inputs": {"bad name": "file:///tmp"}}, "inputs", ("bad name",)),
    ("channel-name-leading-dot", {"inputs": {".x": "file:///tmp"}}, "inputs", (".x",)),
    ("env-name", {"environment": {"1BAD": "x"}}, "environment", ("1BAD",)),
    ("env-value-not-str", {"environment": {"A": 1}}, "environment", ()),
    (
        "metric-no-group",
        {"metric_definitions": [{"Name": "loss", "Regex": r"loss=\d+"}]},
        "metric_definitions",
        ("capture group",),
    ),
    (
        "metric-invalid-regex",
        {"metric_definitions": [{"Name": "loss", "Regex": r"loss=(\d+"}]},
        "metric_definitions",
        ("regular expression",),
    ),
    (
        "metric-unknown-key",
        {"metric_definitions": [{"Name": "loss", "Regex": r"loss=(\S+)", "Unit": "x"}]},
        "metric_definitions",
        ("Unit", "Name", "Regex"),
    ),
    ("image-malformed", {"image_uri": "Not An Image"}, "image_uri", ("Not An Image",)),
    ("checkpoint-local-relative", {"checkpoint_local_path": "ckpt"}, "checkpoint_local_path", ()),
    ("tensorboard-uri-ftp", {"tensorboard_s3_uri": "ftp://x"}, "tensorboard_s3_uri", ("ftp",)),
    ("tensorboard-local-relative", {"tensorboard_local_path": "tb"}, "tensorboard_local_path", ()),
    ("tensorboard-local-system", {"tensorboard_local_path": "/etc"}, "tensorboard_local_path", ()),
    ("profile-one-number", {"profile": "5"}, "profile", ("START:COUNT",)),
    ("profile-zero-steps", {"profile": "5:0"}, "profile", ("COUNT 1-1000",)),
    ("tags-reserved", {"tags": {"trainctl:job": "x"}}, "tags", ("reserved",)),
    ("tags-name", {"tags": {"Name": "x"}}, "tags", ("reserved",)),
    ("tags-long-key", {"tags": {"k" * 129: "x"}}, "tags", ("1-128",)),
    ("tags-not-text", {"tags": {"team": 1}}, "tags", ()),
    ("tags-ampersand", {"tags": {"team": "a & b"}}, "tags", ("S3's tag rule",)),
    ("volume-kms-key-spaces", {"volume_kms_key": "my key"}, "volume_kms_key", ()),
    ("unknown-field", {"foo": 1}, "foo", ("unknown key", "entry_point")),
]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [pytest.param(o, f, w, id=i) for i, o, f, w in BAD_FIELDS],
)
def test_bad_field_is_one_line_naming_the_field(
    src: Path, overrides: dict[str, Any], field: str, words: tuple[str, ...]
) -> None:
    msg = _spec_error(**{**_base(src), **overrides})
    assert msg.startswith(field), msg
    for word in words:
        assert word in msg, (word, msg)


def test_missing_entry_point(src: Path) -> None:
    for value in (None, "", "   "):
        msg = _spec_error(entry_point=value, source_dir=str(src))
        assert msg.startswith("entry_point"), msg
    msg = _spec_error(source_dir=str(src))
    assert msg.startswith("entry_point: is required"), msg


def test_entry_point_must_be_a_string(src: Path) -> None:
    msg = _spec_error(entry_point=3, source_dir=str(src))
    assert msg.startswith("entry_point"), msg


def test_entry_point_not_found_without_source_dir(tmp_path: Path) -> None:
    msg = _spec_error(entry_point=str(tmp_path / "nope.py"))
    assert msg.startswith("entry_point"), msg
    assert "nope.py" in msg


def test_entry_point_absolute_with_source_dir(src: Path) -> None:
    # An absolute path inside source_dir names the same script; outside it is refused.
    assert build_spec(entry_point=str(src / "train.py"), source_dir=str(src)).entry_point == (
        "train.py"
    )
    msg = _spec_error(entry_point=str(src.parent / "outside.py"), source_dir=str(src))
    assert msg.startswith("entry_point"), msg


def test_entry_point_symlink_escaping_source_dir(src: Path) -> None:
    (src / "link.py").symlink_to(src.parent / "outside.py")
    msg = _spec_error(entry_point="link.py", source_dir=str(src))
    assert msg.startswith("entry_point"), msg
    assert "outside" in msg


def test_entry_point_is_a_directory(src: Path) -> None:
    msg = _spec_error(entry_point="pkg", source_dir=str(src))
    assert msg.startswith("entry_point"), msg


@pytest.mark.parametrize("name", ["nonexistent", "train.py"])
def test_source_dir_missing_or_not_a_directory(src: Path, name: str) -> None:
    missing = src / name
    msg = _spec_error(entry_point="train.py", source_dir=str(missing))
    assert msg.startswith("source_dir"), msg
    assert str(missing) in msg


def test_unknown_instance_type_names_the_closest_known_ones(src: Path) -> None:
    msg = _spec_error(**_base(src), instance_type="p4d.24xlarg")
    assert "did you mean p4d.24xlarge" in msg and "'ssh'" in msg and "\n" not in msg
    msg = _spec_error(**_base(src), instance_type="ml.c5.2xlarg")
    assert "did you mean ml.c5.2xlarge" in msg
    assert len(CATALOG) > 1000  # every EC2 type (DescribeInstanceTypes), not a hand table


def test_estimator_raises_spec_error_at_construction(src: Path) -> None:
    with pytest.raises(SpecError) as info:
        Estimator("train.py", str(src), instance_count=0)
    assert str(info.value).startswith("instance_count")
    with pytest.raises(SpecError) as info:
        Estimator("train.py", str(src), distribution={"pytorchddp": {}})
    assert "allowed: mpi, smdistributed, torch_distributed" in str(info.value)
    with pytest.raises(SpecError) as info:
        Estimator("train.py", str(src), hyperparameters={"lr": float("nan")})
    assert str(info.value).startswith("hyperparameters")


def test_spec_error_is_a_value_error(src: Path) -> None:
    with pytest.raises(ValueError):
        build_spec(**_base(src), instance_count=0)


# --- library bugs, kept visible --------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"job_name": "abc\n"}, id="job_name"),
        pytest.param({"inputs": {"train\n": "file:///tmp"}}, id="channel"),
        pytest.param({"environment": {"FOO\n": "x"}}, id="env"),
        pytest.param({"hyperparameters": {"lr\n": 1}}, id="hp-key"),
        pytest.param({"image_uri": "repo/img:tag\n"}, id="image_uri"),
    ],
)
def test_trailing_newline_is_rejected(src: Path, overrides: dict[str, Any]) -> None:
    _spec_error(**{**_base(src), **overrides})


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"entry_point": "no\nfile.py"}, id="entry-no-source-dir"),
        pytest.param({"entry_point": "no\nfile.py", "source_dir": "SRC"}, id="entry-in-src"),
        pytest.param({"entry_point": "train.py", "source_dir": "/no\nwhere"}, id="source_dir"),
    ],
)
def test_error_stays_one_line_with_newline_in_path(src: Path, fields: dict[str, Any]) -> None:
    if fields.get("source_dir") == "SRC":
        fields = {**fields, "source_dir": str(src)}
    _spec_error(**fields)


@pytest.mark.parametrize(
    ("overrides", "prefix"),
    [
        pytest.param({"output_path": "ftp://x"}, "output_path: output_path", id="output_path"),
        pytest.param(
            {"checkpoint_s3_uri": "ftp://x"}, "checkpoint_s3_uri: checkpoint_s3_uri", id="ckpt"
        ),
        pytest.param({"inputs": {"train": "ftp://x"}}, "inputs: inputs.train", id="inputs"),
    ],
)
def test_uri_error_names_the_field_once(src: Path, overrides: dict[str, Any], prefix: str) -> None:
    msg = _spec_error(**{**_base(src), **overrides})
    assert not msg.startswith(prefix), msg


# --- valid input ---------------------------------------------------------------------------


def test_defaults(src: Path) -> None:
    spec = build_spec(**_base(src))
    assert spec.instance_type == "local"
    assert spec.instance_count == 1
    assert spec.processes_per_host is None
    assert spec.hyperparameters == {}
    assert spec.distribution is None
    assert spec.launcher == "python"
    assert spec.inputs == {}
    assert spec.environment == {}
    assert spec.job_name is None
    assert spec.image_uri is None
    assert spec.max_run == 86400
    assert spec.source_dir == str(src.resolve())
    assert spec.entry_point == "train.py"


def test_none_fields_mean_defaults(src: Path) -> None:
    spec = build_spec(
        **_base(src), instance_type=None, instance_count=None, distribution=None, job_name=None
    )
    assert (spec.instance_type, spec.instance_count, spec.distribution) == ("local", 1, None)


def test_source_dir_defaults_to_entry_points_directory(src: Path) -> None:
    spec = build_spec(entry_point=str(src / "pkg" / "main.py"))
    assert spec.source_dir == str((src / "pkg").resolve())
    assert spec.entry_point == "main.py"


def test_relative_entry_point_without_source_dir(src: Path, monkeypatch) -> None:
    monkeypatch.chdir(src)
    spec = build_spec(entry_point="pkg/main.py")
    assert spec.source_dir == str((src / "pkg").resolve())
    assert spec.entry_point == "main.py"


def test_relative_source_dir_is_resolved(src: Path, monkeypatch) -> None:
    monkeypatch.chdir(src.parent)
    spec = build_spec(entry_point="train.py", source_dir="src")
    assert Path(spec.source_dir).is_absolute()
    assert spec.source_dir == str(src.resolve())
    monkeypatch.chdir(src / "pkg")
    spec = build_spec(entry_point="train.py", source_dir="..")
    assert spec.source_dir == str(src.resolve())


def test_entry_point_in_a_subdirectory(src: Path) -> None:
    spec = build_spec(entry_point="pkg/main.py", source_dir=str(src))
    assert spec.entry_point == "pkg/main.py"
    spec = build_spec(entry_point="pkg/../train.py", source_dir=str(src))
    assert spec.entry_point == "pkg/../train.py"


def test_job_name_63_chars_is_valid(src: Path) -> None:
    assert build_spec(**_base(src), job_name="a" * 63).job_name == "a" * 63
    assert build_spec(**_base(src), job_name="a-b--c9").job_name == "a-b--c9"


def test_valid_uris_and_paths(src: Path) -> None:
    spec = build_spec(
        **_base(src),
        inputs={"train": "file:///data", "val.v2": "s3://my-bucket/val", "t-1": "/plain/path"},
        output_path="s3://my-bucket/out",
        checkpoint_s3_uri="file:///tmp/ckpt",
        checkpoint_local_path="/opt/ml/checkpoints",
        environment={"_A": "1", "B2": ""},
        image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/repo/img:v1.2",
        metric_definitions=[{"Name": "loss", "Regex": r"loss=(\S+)"}],
    )
    assert spec.inputs["val.v2"] == "s3://my-bucket/val"
    assert spec.metric_definitions[0].Name == "loss"


def _full_spec(src: Path) -> JobSpec:
    return build_spec(
        **_base(src),
        instance_count=2,
        processes_per_host=4,
        hyperparameters={
            "batch-size": 32,
            "lr": 0.1,
            "flag": True,
            "name": "x y",
            "layers": [1, 2],
            "cfg": {"a": None},
        },
        distribution={"mpi": {"processes_per_host": 2, "custom_mpi_options": "-x FOO"}},
        environment={"FOO": "bar"},
        inputs={"train": "file:///data", "val": "s3://my-bucket/val"},
        output_path="s3://my-bucket/out",
        checkpoint_s3_uri="s3://my-bucket/ckpt",
        checkpoint_local_path="/opt/ml/ckpt",
        max_run=3600,
        job_name="my-job-1",
        metric_definitions=[{"Name": "loss", "Regex": r"loss=(\S+)"}],
    )


def test_round_trip_through_json(src: Path) -> None:
    spec = _full_spec(src)
    text = spec.model_dump_json()
    again = JobSpec.model_validate_json(text)
    assert again == spec
    assert again.launcher == "mpi"
    assert again.distribution.mpi.processes_per_host == 2
    assert json.loads(text)["hyperparameters"]["layers"] == [1, 2]


def test_round_trip_of_defaults(src: Path) -> None:
    spec = build_spec(**_base(src))
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert JobSpec.model_validate(spec.model_dump()) == spec


def test_spec_is_frozen(src: Path) -> None:
    spec = build_spec(**_base(src))
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        spec.instance_count = 3  # type: ignore[misc]


# --- distribution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected", "launcher"),
    [
        ("torch_distributed", {"torch_distributed": {"enabled": True}}, "torchrun"),
        ("torchrun", {"torch_distributed": {"enabled": True}}, "torchrun"),
        ("mpi", {"mpi": {"enabled": True}}, "mpi"),
        ("none", None, "python"),
    ],
)
def test_distribution_shorthand(src: Path, name: str, expected: Any, launcher: str) -> None:
    assert parse_distribution(name) == expected
    assert build_spec(**_base(src), distribution=name).launcher == launcher
    assert build_spec(**_base(src), distribution=expected).launcher == launcher


@pytest.mark.parametrize("name", ["horovod", "", "MPI", "pytorchddp"])
def test_distribution_shorthand_unknown(name: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_distribution(name)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("distribution")
    assert "allowed: torch_distributed, torchrun, mpi, none" in msg


@pytest.mark.parametrize(
    ("distribution", "launcher"),
    [
        ({}, "python"),
        ({"torch_distributed": {}}, "torchrun"),
        ({"torch_distributed": {"enabled": False}}, "python"),
        ({"mpi": {"enabled": False}}, "python"),
        ({"torch_distributed": {"enabled": False}, "mpi": {"enabled": True}}, "mpi"),
        ({"torch_distributed": {"enabled": True}, "mpi": {"enabled": False}}, "torchrun"),
    ],
)
def test_launcher_from_distribution(src: Path, distribution: dict, launcher: str) -> None:
    assert build_spec(**_base(src), distribution=distribution).launcher == launcher


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("box", (None, "box", None)),
        ("alice@box:2222", ("alice", "box", 2222)),
        ("[::1]:22", (None, "::1", 22)),
        ("bob@10.0.0.7", ("bob", "10.0.0.7", None)),
    ],
)
def test_one_parser_reads_user_host_port(text: str, parts: tuple) -> None:
    from trainctl.spec.capacity import parse_ssh_target

    assert tuple(parse_ssh_target(text)) == parts


@pytest.mark.parametrize(
    "text", ["box:0", "box:70000", "-oProxyCommand=x", "a b", "@box", "[zz]:1"]
)
def test_a_bad_ssh_target_is_refused_by_every_door(text: str) -> None:
    from trainctl.spec.capacity import check_proxy_jump, parse_ssh_target
    from trainctl.spec.controller import check_controller

    with pytest.raises(ValueError):
        parse_ssh_target(text)
    with pytest.raises(ValueError):
        check_proxy_jump(f"ok@bastion,{text}")
    with pytest.raises(ValueError):
        check_controller(f"ssh://{text}")
