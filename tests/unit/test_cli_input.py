"""`trainctl submit` on bad input: exit 2, one `error: ` line naming the field, no job created.

No job is ever started here: bad input stops before the store is touched, and the positive
cases replace `create_job` with a stub that captures the validated spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainctl.cli import app
from trainctl.cli.app import EXIT_BAD_INPUT, parse_pairs
from trainctl.cli.submit import load_job_file
from trainctl.errors import SpecError
from trainctl.spec.job import JobSpec


def _stderr(result: Any) -> str:
    try:
        return result.stderr
    except ValueError:  # click < 8.2 without a separate stderr: it is mixed into output
        return result.output


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


def _assert_no_job(home: Path) -> None:
    store = home / "store"
    for sub in ("jobs", "sources"):
        d = store / sub
        assert not d.exists() or not any(d.iterdir()), f"{d} was written"


def _assert_bad_input(result: Any, home: Path, *fields: str) -> str:
    err = _stderr(result)
    assert result.exit_code == EXIT_BAD_INPUT == 2, (result.exit_code, err, result.exception)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: "), line
    for field in fields:
        assert field in line, (field, line)
    assert "Traceback" not in result.output
    _assert_no_job(home)
    return line


# --- bad input -----------------------------------------------------------------------------


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# (case id, argv after 'submit' built from (tmp_path, src), words the error line must contain)
BAD_ARGS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("no-entry-point", lambda t, s: [], ("entry_point",)),
    ("no-entry-point-detach", lambda t, s: ["--detach"], ("entry_point",)),
    (
        "missing-source-dir",
        lambda t, s: ["train.py", "--source-dir", str(t / "nope")],
        ("source_dir",),
    ),
    (
        "entry-point-not-found",
        lambda t, s: ["nope.py", "--source-dir", str(s)],
        ("entry_point", "nope.py"),
    ),
    (
        "entry-point-not-found-no-source-dir",
        lambda t, s: [str(t / "nope.py")],
        ("entry_point",),
    ),
    (
        "entry-point-outside-source-dir",
        lambda t, s: ["../outside.py", "--source-dir", str(s)],
        ("entry_point",),
    ),
    (
        "entry-point-absolute-with-source-dir",
        lambda t, s: [str(t / "outside.py"), "--source-dir", str(s)],
        ("entry_point",),
    ),
    (
        "instance-count-0",
        lambda t, s: ["src/train.py", "--instance-count", "0"],
        ("instance_count",),
    ),
    (
        "instance-type-unknown",
        lambda t, s: ["src/train.py", "--instance-type", "p9.mega"],
        ("instance_type", "p9.mega", "local"),
    ),
    (
        "ec2-with-a-local-store",
        lambda t, s: ["src/train.py", "--instance-type", "p3.2xlarge", "--region", "us-east-1"],
        ("TRAINCTL_STORE", "not reachable from EC2 nodes"),
    ),
    ("hp-no-equals", lambda t, s: ["src/train.py", "-p", "epochs"], ("-p", "epochs")),
    ("hp-empty-key", lambda t, s: ["src/train.py", "-p", "=3"], ("-p",)),
    ("hp-nan", lambda t, s: ["src/train.py", "-p", "lr=NaN"], ("hyperparameters", "lr")),
    ("input-no-equals", lambda t, s: ["src/train.py", "--inputs", "train"], ("--inputs",)),
    ("input-empty-key", lambda t, s: ["src/train.py", "--inputs", "=file:///x"], ("--inputs",)),
    (
        "env-no-equals",
        lambda t, s: ["src/train.py", "--environment", "FOO"],
        ("--environment", "FOO"),
    ),
    (
        "env-bad-name",
        lambda t, s: ["src/train.py", "--environment", "1BAD=x"],
        ("environment", "1BAD"),
    ),
    (
        "input-ftp",
        lambda t, s: ["src/train.py", "--inputs", "train=ftp://x"],
        ("inputs", "ftp"),
    ),
    (
        "input-does-not-exist",
        lambda t, s: ["src/train.py", "--inputs", "train=file:///does/not/exist"],
        ("inputs.train", "/does/not/exist"),
    ),
    (
        "input-bad-channel",
        lambda t, s: ["src/train.py", "--inputs", "bad name=file:///tmp"],
        ("inputs", "bad name"),
    ),
    (
        "output-path-ftp",
        lambda t, s: ["src/train.py", "--output-path", "ftp://x"],
        ("output_path",),
    ),
    (
        "checkpoint-uri-ftp",
        lambda t, s: ["src/train.py", "--checkpoint-s3-uri", "ftp://x"],
        ("checkpoint_s3_uri",),
    ),
    (
        "checkpoint-local-relative",
        lambda t, s: ["src/train.py", "--checkpoint-local-path", "ckpt"],
        ("checkpoint_local_path",),
    ),
    ("max-run-0", lambda t, s: ["src/train.py", "--max-run", "0"], ("max_run",)),
    ("file-missing", lambda t, s: ["-f", str(t / "missing.yaml")], ("-f", "missing.yaml")),
    ("file-is-a-directory", lambda t, s: ["-f", str(t)], ("-f",)),
    (
        "file-invalid-yaml",
        lambda t, s: ["-f", _write(t / "bad.yaml", "entry_point: [train.py,\n")],
        ("-f", "YAML"),
    ),
    (
        "file-yaml-list",
        lambda t, s: ["-f", _write(t / "list.yaml", "- train.py\n- src\n")],
        ("-f", "mapping"),
    ),
    (
        "file-yaml-scalar",
        lambda t, s: ["-f", _write(t / "scalar.yaml", "train.py\n")],
        ("-f",),
    ),
    (
        "file-unknown-key",
        lambda t, s: ["-f", _write(t / "foo.yaml", "entry_point: src/train.py\nfoo: 1\n")],
        ("foo", "unknown key", "entry_point"),
    ),
    (
        "file-bad-distribution",
        lambda t, s: [
            "-f",
            _write(t / "d.yaml", "entry_point: src/train.py\ndistribution: {horovod: {}}\n"),
        ],
        ("distribution", "horovod", "allowed: mpi, smdistributed, torch_distributed"),
    ),
    (
        "file-hyperparameters-not-a-mapping",
        lambda t, s: [
            "-f",
            _write(t / "h.yaml", "entry_point: src/train.py\nhyperparameters: 3\n"),
        ],
        ("hyperparameters",),
    ),
    (
        "file-empty-needs-entry-point",
        lambda t, s: ["-f", _write(t / "empty.yaml", "")],
        ("entry_point",),
    ),
    (
        "job-name",
        lambda t, s: ["src/train.py", "--job-name", "bad_name!"],
        ("job_name", "bad_name!"),
    ),
    (
        "distribution-unknown",
        lambda t, s: ["src/train.py", "--distribution", "horovod"],
        ("distribution", "horovod", "torch_distributed"),
    ),
    (
        "image-not-supported",
        lambda t, s: ["src/train.py", "--image-uri", "some-image"],
        ("image_uri",),
    ),
    (
        "image-malformed",
        lambda t, s: ["src/train.py", "--image-uri", "Not An Image"],
        ("image_uri",),
    ),
    ("output-yaml", lambda t, s: ["src/train.py", "-o", "yaml"], ("--output", "yaml", "json")),
    (
        "keep-alive-over-max",
        lambda t, s: [
            "src/train.py",
            "--instance-type",
            "g5.2xlarge",
            "--keep-alive-period-in-seconds",
            "3601",
        ],
        ("keep_alive_period_in_seconds", "3600", "3601"),
    ),
    (
        "keep-alive-negative",
        lambda t, s: [
            "src/train.py",
            "--instance-type",
            "g5.2xlarge",
            "--keep-alive-period-in-seconds",
            "-1",
        ],
        ("keep_alive_period_in_seconds", "greater than or equal to 0"),
    ),
    (
        # Local (and ssh) nodes are not released after a job: refused, not ignored.
        "keep-alive-local",
        lambda t, s: ["src/train.py", "--keep-alive-period-in-seconds", "60"],
        ("keep_alive_period_in_seconds", "EC2 instance types only", "'local'"),
    ),
]


@pytest.mark.parametrize(("make_args", "words"), [pytest.param(a, w, id=i) for i, a, w in BAD_ARGS])
def test_bad_input_exits_2_with_one_line(
    cli_home: Path, tmp_path: Path, src: Path, make_args: Any, words: tuple[str, ...], monkeypatch
) -> None:
    # no container engine here (the image cases), without probing for one
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "none")
    result = _invoke(["submit", *make_args(tmp_path, src)])
    _assert_bad_input(result, cli_home, *words)
    assert result.stdout == ""


def test_bad_input_after_a_previous_store_exists(cli_home: Path, src: Path) -> None:
    # An existing store with other jobs is left exactly as it was.
    job = cli_home / "store" / "jobs" / "earlier-job"
    job.mkdir(parents=True)
    (job / "job.json").write_text("{}")
    result = _invoke(["submit", "src/train.py", "--instance-count", "0"])
    assert result.exit_code == 2
    assert sorted(p.name for p in (cli_home / "store" / "jobs").iterdir()) == ["earlier-job"]
    assert not (cli_home / "store" / "sources").exists()


def test_typer_usage_error_is_exit_2(cli_home: Path, src: Path) -> None:
    # Not an int: typer/click's own usage error, also exit 2 and no job.
    result = _invoke(["submit", "src/train.py", "--instance-count", "abc"])
    assert result.exit_code == 2
    assert "--instance-count" in _stderr(result)
    _assert_no_job(cli_home)


# --- library bugs, kept visible --------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "flag"),
    [
        pytest.param("inputs: file:///tmp\n", ["--inputs", "val=file:///tmp"], id="in"),
        pytest.param("hyperparameters: [1, 2]\n", ["-p", "a=1"], id="hp"),
        pytest.param("environment: A\n", ["--environment", "B=1"], id="env"),
    ],
)
def test_file_non_mapping_plus_flag(
    cli_home: Path, tmp_path: Path, src: Path, yaml_text: str, flag: list[str]
) -> None:
    job = _write(tmp_path / "job.yaml", "entry_point: src/train.py\n" + yaml_text)
    # --job-name makes validation fail even if the merge is fixed by accepting the value.
    result = _invoke(["submit", "-f", job, *flag, "--job-name", "bad_name!"])
    _assert_bad_input(result, cli_home)


def test_file_not_utf8(cli_home: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_bytes(b"entry_point: \xff\xfe.py\n")
    _assert_bad_input(_invoke(["submit", "-f", str(job)]), cli_home, "-f")


def test_file_non_string_key(cli_home: Path, tmp_path: Path, src: Path) -> None:
    job = _write(tmp_path / "job.yaml", "entry_point: src/train.py\n1: 2\n")
    _assert_bad_input(_invoke(["submit", "-f", job]), cli_home)


def test_entry_point_with_newline_is_one_line(cli_home: Path) -> None:
    _assert_bad_input(_invoke(["submit", "no\nfile.py"]), cli_home, "entry_point")


# --- parse_pairs and load_job_file ----------------------------------------------------------


def test_parse_pairs_typed() -> None:
    values = [
        "epochs=8",
        "lr=0.1",
        "flag=true",
        "off=false",
        "name=abc",
        'quoted="8"',
        "layers=[1, 2]",
        'cfg={"a": 1}',
        "empty=",
        "eq=a=b",
        " spaced =x y",
        "none=null",
    ]
    assert parse_pairs(values, "-p", typed=True) == {
        "epochs": 8,
        "lr": 0.1,
        "flag": True,
        "off": False,
        "name": "abc",
        "quoted": "8",
        "layers": [1, 2],
        "cfg": {"a": 1},
        "empty": "",
        "eq": "a=b",
        "spaced": "x y",
        "none": None,
    }
    typed = parse_pairs(["epochs=8", "lr=0.1", "flag=true"], "-p", typed=True)
    assert type(typed["epochs"]) is int
    assert type(typed["lr"]) is float
    assert type(typed["flag"]) is bool


def test_parse_pairs_untyped_keeps_strings() -> None:
    assert parse_pairs(["train=file:///x", "N=8", "url=s3://b/k?x=1"], "--inputs") == {
        "train": "file:///x",
        "N": "8",
        "url": "s3://b/k?x=1",
    }


def test_parse_pairs_last_wins_and_empty() -> None:
    assert parse_pairs(["a=1", "a=2"], "-p", typed=True) == {"a": 2}
    assert parse_pairs(None, "-p") == {}
    assert parse_pairs([], "-p") == {}


@pytest.mark.parametrize("item", ["epochs", "=3", " =3", ""])
@pytest.mark.parametrize("flag", ["-p", "--inputs", "--environment"])
def test_parse_pairs_malformed(item: str, flag: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_pairs([item], flag, typed=flag == "-p")
    assert info.value.field == flag
    assert str(info.value).startswith(f"{flag}: ")
    assert "KEY=VALUE" in str(info.value)
    assert "\n" not in str(info.value)


def testload_job_file_resolves_source_dir_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = tmp_path / "proj"
    (proj / "code").mkdir(parents=True)
    job = proj / "job.yaml"
    job.write_text(
        "entry_point: train.py\n"
        "source_dir: code\n"
        "instance_count: 2\n"
        "hyperparameters: {epochs: 8, lr: 0.1, flag: true, name: abc}\n"
        "distribution: {torch_distributed: {enabled: true}}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    data = load_job_file(Path("../proj/job.yaml"))
    assert data["source_dir"] == str((proj / "code").resolve())
    assert data["entry_point"] == "train.py"  # relative to source_dir, left as is
    assert data["instance_count"] == 2
    assert data["hyperparameters"] == {"epochs": 8, "lr": 0.1, "flag": True, "name": "abc"}
    assert data["distribution"] == {"torch_distributed": {"enabled": True}}


def testload_job_file_entry_point_without_source_dir(tmp_path: Path) -> None:
    # kept as written: `submit` resolves it against the file only if no source_dir is given
    job = _write(tmp_path / "job.yaml", "entry_point: code/train.py\n")
    assert load_job_file(Path(job)) == {"entry_point": "code/train.py"}


def testload_job_file_absolute_paths_kept(tmp_path: Path) -> None:
    job = _write(tmp_path / "job.yaml", "entry_point: /abs/train.py\n")
    assert load_job_file(Path(job)) == {"entry_point": "/abs/train.py"}
    job = _write(tmp_path / "job.yaml", "source_dir: /abs/code\nentry_point: t.py\n")
    assert load_job_file(Path(job)) == {"source_dir": "/abs/code", "entry_point": "t.py"}


def testload_job_file_empty_is_empty_mapping(tmp_path: Path) -> None:
    assert load_job_file(Path(_write(tmp_path / "job.yaml", ""))) == {}
    assert load_job_file(Path(_write(tmp_path / "job.yaml", "# nothing\n"))) == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: [1,\n", ("-f", "YAML")),
        ("- a\n- b\n", ("-f", "mapping")),
        ("just a string\n", ("-f", "mapping")),
    ],
)
def testload_job_file_errors(tmp_path: Path, text: str, words: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as info:
        load_job_file(Path(_write(tmp_path / "job.yaml", text)))
    assert info.value.field == "-f"
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)


def testload_job_file_missing(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_job_file(tmp_path / "missing.yaml")
    assert info.value.field == "-f"
    assert "missing.yaml" in str(info.value)


# --- flags over the file, through the real command with create_job stubbed ------------------


class _Captured(Exception):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__("captured")
        self.spec = spec


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """`trainctl submit` stops right after validation: create_job raises with the spec."""
    import trainctl.controller.submit as submit_mod

    def fake_create_job(spec: JobSpec, store: Any = None) -> Any:
        raise _Captured(spec)

    monkeypatch.setattr(submit_mod, "create_job", fake_create_job)


def _captured_spec(result: Any) -> JobSpec:
    assert isinstance(result.exception, _Captured), (result.exit_code, _stderr(result))
    return result.exception.spec


def test_flags_override_the_file(cli_home: Path, tmp_path: Path, capture: None) -> None:
    proj = tmp_path / "proj"
    (proj / "code").mkdir(parents=True)
    (proj / "code" / "train.py").write_text("print('hi')\n")
    data = tmp_path / "data"
    data.mkdir()
    job = _write(
        proj / "job.yaml",
        "entry_point: train.py\n"
        "source_dir: code\n"
        "instance_count: 2\n"
        "job_name: from-file\n"
        "hyperparameters: {lr: 0.1, epochs: 1}\n"
        "environment: {A: '1'}\n"
        "inputs: {train: file:///from/file}\n"
        "distribution: {mpi: {enabled: true}}\n",
    )
    result = _invoke(
        [
            "submit",
            "-f",
            job,
            "--instance-count",
            "3",
            "--job-name",
            "from-flag",
            "-p",
            "epochs=8",
            "-p",
            "flag=true",
            "-p",
            "name=abc",
            "--environment",
            "B=2",
            "--inputs",
            f"train={data.as_uri()}",
            "--inputs",
            f"val={data}",
            "--distribution",
            "torchrun",
        ]
    )
    spec = _captured_spec(result)
    assert spec.source_dir == str((proj / "code").resolve())
    assert spec.entry_point == "train.py"
    assert spec.instance_count == 3
    assert spec.job_name == "from-flag"
    assert spec.hyperparameters == {"lr": 0.1, "epochs": 8, "flag": True, "name": "abc"}
    assert spec.environment == {"A": "1", "B": "2"}
    assert spec.inputs == {"train": data.as_uri(), "val": str(data)}
    assert spec.launcher == "torchrun"
    _assert_no_job(cli_home)


def test_distribution_none_overrides_the_file(
    cli_home: Path, tmp_path: Path, capture: None
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = _write(tmp_path / "job.yaml", "entry_point: train.py\ndistribution: {mpi: {}}\n")
    spec = _captured_spec(_invoke(["submit", "-f", job]))
    assert spec.launcher == "mpi"
    spec = _captured_spec(_invoke(["submit", "-f", job, "--distribution", "none"]))
    assert spec.launcher == "python"


def test_file_inputs_string_is_the_training_channel(
    cli_home: Path, tmp_path: Path, capture: None
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = _write(tmp_path / "job.yaml", f"entry_point: train.py\ninputs: {tmp_path.as_uri()}\n")
    spec = _captured_spec(_invoke(["submit", "-f", job]))
    assert spec.inputs == {"training": tmp_path.as_uri()}


def test_relative_source_dir_flag_is_resolved_against_cwd(
    cli_home: Path, src: Path, capture: None
) -> None:
    spec = _captured_spec(_invoke(["submit", "train.py", "--source-dir", "src"]))
    assert spec.source_dir == str(src.resolve())
    assert spec.entry_point == "train.py"
    spec = _captured_spec(_invoke(["submit", "src/train.py"]))
    assert spec.source_dir == str(src.resolve())
    assert spec.entry_point == "train.py"


def test_source_dir_flag_with_entry_point_from_file(
    cli_home: Path, tmp_path: Path, src: Path, capture: None
) -> None:
    job = _write(tmp_path / "job.yaml", "entry_point: train.py\n")
    spec = _captured_spec(_invoke(["submit", "-f", job, "--source-dir", str(src)]))
    assert spec.source_dir == str(src.resolve())
    assert spec.entry_point == "train.py"


# --- the script's own arguments, and the fields of issue 22 ----------------------------------


def _installed(*args: str) -> Any:
    import subprocess

    from tests.helpers import TRAINCTL

    return subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=60)


def test_arguments_that_are_not_strings_are_one_line(cli_home: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = _write(tmp_path / "job.yaml", "entry_point: train.py\narguments: [50, 10]\n")
    line = _assert_bad_input(_invoke(["submit", "-f", job]), cli_home, "arguments")
    assert "quote it" in line, line


def test_the_new_fields_reach_the_spec_from_flags_and_the_file(
    cli_home: Path, tmp_path: Path, capture: None
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    data = tmp_path / "data"
    data.mkdir()
    job = _write(
        tmp_path / "job.yaml",
        "entry_point: train.py\narguments: ['50', '10']\nworkdir_ignore: ['data/']\n",
    )
    result = _invoke(
        [
            "submit", "-f", job, "--inputs", f"train={data.as_uri()}",
            "--input-mode", "train=FastFile", "--workdir-max-mb", "64",
            "--workdir-ignore", "*.log", "--instance-type", "ml.p4d.24xlarge",
        ]
    )  # fmt: skip
    spec = _captured_spec(result)
    assert spec.arguments == ["50", "10"]
    assert spec.channel_config["train"].input_mode == "FastFile"
    assert (spec.workdir_max_mb, spec.workdir_ignore) == (64, ["*.log"])
    assert spec.instance_type == "p4d.24xlarge"  # SageMaker's ml. name for the same machine
