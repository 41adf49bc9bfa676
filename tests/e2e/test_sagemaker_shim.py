"""`from trainctl.sagemaker import PyTorch, TrainingInput`: SageMaker's arguments mapped,
refused in one line, or warned about in one line; channels sharded; a job run with SageMaker's
API (the notebook with one changed import runs in tests/providers/test_container_run.py, in a real
kernel, in the containers SageMaker's local mode would use)."""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import FIXTURES
from trainctl.errors import SpecError
from trainctl.sagemaker import PyTorch, SageMakerCompatibilityWarning, TrainingInput
from trainctl.sagemaker._compat import REFUSED

SOURCE = FIXTURES / "sagemaker"
ROLE = "arn:aws:iam::111122223333:role/service-role/AmazonSageMaker-ExecutionRole"
PROFILE_ARN = "arn:aws:iam::111122223333:instance-profile/trainctl-node"


def pytorch(**kwargs) -> PyTorch:
    base = {
        "entry_point": "known_args.py",
        "source_dir": str(SOURCE),
        "framework_version": "2.5.1",
        "py_version": "py311",
        "instance_count": 2,
        "instance_type": "ml.p4d.24xlarge",
        "role": PROFILE_ARN,
    }
    return PyTorch(**{**base, **kwargs})


def spec_of(est: PyTorch):
    return est._estimator.spec


@cache
def engine_here() -> bool:
    """Whether SageMaker's framework image can be had on this machine (an engine answers,
    AWS credentials for ECR's pull). Where it cannot, framework_version runs as processes,
    with one warning; the tests that pass framework_version expect that warning there
    (tested on its own below)."""
    from trainctl.sagemaker.images import FrameworkImage, why_not_an_image

    return why_not_an_image(FrameworkImage("2.5.1", "py311")) is None


def others(caught, *, versioned: bool = True) -> list[str]:
    """The warnings caught, less the one a machine without a container engine gets for
    framework_version, which is checked to be there exactly when no engine is and the
    estimator named a framework_version (`versioned`)."""
    # (a ResourceWarning is the collector finding an earlier test's file or socket, in
    # whatever line it runs: nothing these arguments said)
    messages = [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)]
    about_engine = [m for m in messages if m.startswith("framework_version: ")]
    assert len(about_engine) == (0 if engine_here() or not versioned else 1), messages
    assert all("cannot be had here" in m for m in about_engine), about_engine
    return [m for m in messages if m not in about_engine]


@contextmanager
def quiet(*, versioned: bool = True):
    """No warning but the one this machine's lack of an engine explains (see others);
    `versioned=False` for an estimator without framework_version, which never gets it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert others(caught, versioned=versioned) == []


@pytest.mark.timeout(30)
def test_sagemaker_arguments_map_to_the_job(home):
    with quiet():  # nothing here deserves a warning
        est = pytorch(
            hyperparameters={"learning_rate": 0.1},
            output_path="s3://bucket/models",
            checkpoint_s3_uri="s3://bucket/ckpt",
            base_job_name="mnist",
            use_spot_instances=True,
            max_run=3600,
            max_wait=7200,
            metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
            environment={"MODE": "x"},
            volume_size=100,
            distribution={"pytorchddp": {"enabled": True}},
            enable_network_isolation=False,  # SageMaker's defaults are accepted quietly
            input_mode="File",
        )
    spec = spec_of(est)
    assert spec.instance_type == "p4d.24xlarge" and spec.instance_count == 2
    assert spec.instance_profile == PROFILE_ARN
    if engine_here():  # SageMaker's image (else processes: tested on its own below)
        assert spec.framework_version == "2.5.1" and spec.py_version == "py311"
    assert spec.use_spot_instances and spec.max_wait == 7200 and spec.max_run == 3600
    assert spec.launcher == "torchrun"
    assert spec.volume_size == 100 and spec.environment == {"MODE": "x"}
    assert est.hyperparameters() == {"learning_rate": 0.1}
    est.set_hyperparameters(batch_size=8)
    assert spec_of(est).hyperparameters == {"learning_rate": 0.1, "batch_size": 8}
    assert est.latest_training_job is None and est.model_data is None


@pytest.mark.timeout(30)
def test_local_instance_types_run_here(home):
    for itype in ("local", "local_gpu"):
        est = pytorch(instance_type=itype, framework_version=None, py_version=None, role=ROLE)
        assert spec_of(est).instance_type == itype  # local_gpu: refused at submit without a GPU
        assert spec_of(est).instance_profile is None  # your machine: no profile, no warning


@pytest.mark.timeout(30)
def test_a_role_arn_is_used_as_the_instance_profile_of_its_name_with_one_warning(home):
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(role=ROLE)
    (warned,) = others(caught)
    assert warned.startswith("role: ") and "'AmazonSageMaker-ExecutionRole'" in warned
    assert spec_of(est).instance_profile == "AmazonSageMaker-ExecutionRole"
    assert spec_of(pytorch(role="my-profile")).instance_profile == "my-profile"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"instance_type": "ml.r7i.48xlarg"}, "instance_type", "did you mean ml.r7i.48xlarge"),
        ({"role": "not a role!"}, "role", "is neither an IAM ARN"),
        ({"keep_alive_period_in_seconds": 7200}, "keep_alive_period_in_seconds", "3600"),
        ({"input_mode": "Pipe"}, "input_mode", "no Pipe mode"),
        ({"enable_network_isolation": True}, "enable_network_isolation", "not supported"),
        ({"instance_groups": [object()]}, "instance_groups", "not supported"),
        ({"tags": "team=x"}, "tags", "must be a list"),
        ({"tags": [{"Key": "aws:x", "Value": "1"}]}, "tags", "reserved"),
        ({"container_log_level": 99}, "container_log_level", "50"),
        ({"distribution": {"smdistributed": {}}}, "distribution", "runs only on SageMaker"),
        ({"distribution": {"smdistributed": {"x": {}}}}, "distribution", "runs only on"),
    ],
)
def test_what_trainctl_cannot_honour_is_one_line_naming_it(home, kwargs, field, text):
    with pytest.raises(SpecError) as raised:
        pytorch(**kwargs)
    assert raised.value.field == field
    assert text in str(raised.value) and "\n" not in str(raised.value)
    assert not (home / "store").exists(), "something was created"


@pytest.mark.timeout(30)
def test_keep_alive_is_a_warm_pool_as_on_sagemaker(home):
    assert spec_of(pytorch(keep_alive_period_in_seconds=1800)).keep_alive_period_in_seconds == 1800


@pytest.mark.timeout(30)
def test_training_input_distribution_is_checked(home):
    with pytest.raises(SpecError, match=r"TrainingInput\.distribution: 'Sharded' is not"):
        TrainingInput("s3://bucket/train", distribution="Sharded")
    with pytest.raises(SpecError, match=r"TrainingInput\.input_mode: not supported"):
        TrainingInput("s3://bucket/train", input_mode="Pipe")


@pytest.mark.timeout(30)
def test_accepted_arguments_without_effect_warn_once_each(home):
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(
            sagemaker_session=object(),
            enable_sagemaker_metrics=True,
            tags=[{"Key": "team", "Value": "x"}],  # honoured: no warning
            volume_kms_key="alias/train",
            max_retry_attempts=3,
        )
    messages = sorted(m.split(":")[0] for m in others(caught))
    assert messages == ["enable_sagemaker_metrics", "sagemaker_session"]
    spec = spec_of(est)
    assert spec.tags == {"team": "x"} and spec.volume_kms_key == "alias/train"
    assert spec.max_retry_attempts == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        pytorch(no_such_argument=1)


@pytest.mark.timeout(30)
def test_dependencies_are_copied_next_to_the_source(home, tmp_path):
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("VALUE = 1\n")
    est = pytorch(dependencies=[str(lib)])
    staged = Path(spec_of(est).source_dir)
    assert (staged / "mylib" / "__init__.py").read_text() == "VALUE = 1\n"
    assert (staged / "known_args.py").exists()
    del est
    import gc

    gc.collect()
    assert not staged.exists()  # the staged copy goes with the estimator


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_fit_with_sagemaker_api_on_two_local_nodes(home, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (data / name).write_text(name)
    est = PyTorch(
        entry_point="shard_probe.py",
        source_dir=str(SOURCE),
        role=ROLE,
        instance_count=2,
        instance_type="local",
        base_job_name="shards",
        metric_definitions=[{"Name": "shard", "Regex": r"SHARD (\d)"}],
    )
    est.fit({"train": TrainingInput(f"file://{data}", distribution="ShardedByS3Key")})
    job = est.latest_training_job
    assert job is not None and job.name.startswith("shards-")
    assert job.describe()["state"] == "Completed"
    logs = {
        rank: job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log")
        for rank in (0, 1)
    }
    assert "SHARD 0 a.txt,c.txt" in logs[0]
    assert "SHARD 1 b.txt,d.txt" in logs[1]
    capsys.readouterr()
    est.logs()  # SageMaker's: the latest job's logs, every node's
    printed = capsys.readouterr().out
    assert "[algo-1] SHARD 0 a.txt,c.txt" in printed
    assert "[algo-2] SHARD 1 b.txt,d.txt" in printed
    frame = est.training_job_analytics.dataframe()
    assert list(frame.columns) == ["timestamp", "metric_name", "value"]
    assert sorted(frame["value"].tolist()) == [0.0, 1.0]
    assert set(frame["metric_name"]) == {"shard"}


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_sagemaker_data_parallel_script_runs_unchanged_on_two_nodes(home, capsys):
    """smdistributed's data parallel library (today's `smddp` backend and its older module
    API) and the training toolkit's Environment, imported as on SageMaker, over torchrun on
    2 local nodes: every rank trains in one group and ends with the same weights."""
    est = PyTorch(
        entry_point="train.py",
        source_dir=str(FIXTURES / "smddp"),
        role=None,
        instance_count=2,
        instance_type="local",
        hyperparameters={"lr": 0.1},
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
    )
    assert spec_of(est).launcher == "torchrun"
    est.fit(logs=False)
    job = est.latest_training_job
    assert job.describe()["state"] == "Completed"
    lines = "".join(
        job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log") for rank in (0, 1)
    )
    for rank in (0, 1):
        found = re.search(
            rf"SMDDP rank={rank} world=2 backend=gloo same=True host=(\S+) "
            rf"master={rank == 0} hosts=(\S+) gpus=0 model_dir_ok=True lr=0.1",
            lines,
        )
        assert found, lines
        assert found[2].split(",")[rank] == found[1]  # SM_HOSTS, in rank order
        assert f"LEGACY rank={rank} world=2 local_rank=0 local_size=1 sum=3 same=True" in lines, (
            lines
        )
        assert re.search(rf"TOOLKIT rank={rank} smddp=True properties=\d+", lines), lines
    assert est.model_data.endswith("/output/model.tar.gz")


@pytest.mark.timeout(30)
def test_smdistributed_model_parallel_is_refused_and_data_parallel_options_warn(home):
    for value in ({"modelparallel": {"enabled": True}}, {"dataparallel": {"enabled": False}}):
        with pytest.raises(SpecError) as raised:
            pytorch(distribution={"smdistributed": value})
        assert raised.value.field == "distribution" and "runs only on SageMaker" in str(
            raised.value
        )
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(
            distribution={
                "smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-x"}}
            }
        )
    (warned,) = others(caught)
    assert warned.startswith("distribution: ") and "'custom_mpi_options'" in warned
    assert spec_of(est).launcher == "torchrun"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_model_uri_is_the_model_channel_and_the_infra_check_is_accepted(home, tmp_path):
    """SageMaker's model_uri (a model to fine-tune) arrives as the "model" channel, as on
    SageMaker; enable_infra_check=True is what trainctl's nodes do anyway."""
    model = tmp_path / "pretrained"
    model.mkdir()
    (model / "weights.pt").write_text("w")
    with quiet(versioned=False):  # (no framework_version: no engine warning either way)
        est = PyTorch(
            entry_point="model_channel.py", source_dir=str(SOURCE), role=None,
            instance_count=1, instance_type="local", model_uri=str(model),
            enable_infra_check=True,
        )  # fmt: skip
    est.fit()
    job = est.latest_training_job
    assert job.describe()["state"] == "Completed"
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "MODEL True weights.pt" in log, log
    with pytest.raises(SpecError, match=r"^model_channel_name: 'train' is also a channel"):
        PyTorch(
            entry_point="model_channel.py", source_dir=str(SOURCE), role=None,
            instance_type="local", model_uri=str(model), model_channel_name="train",
        ).fit({"train": str(model)})  # fmt: skip


@pytest.mark.timeout(60)
def test_git_config_clones_the_repository_and_reads_the_source_inside_it(home, tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return done.stdout.strip()

    git("init", "--quiet", "--initial-branch", "main")
    (repo / "src" / "train.py").write_text("print('v1')\n")
    git("add", ".")
    git("commit", "--quiet", "-m", "v1")
    first = git("rev-parse", "HEAD")
    (repo / "src" / "train.py").write_text("print('v2')\n")
    git("commit", "--quiet", "-am", "v2")
    with quiet():
        latest = pytorch(entry_point="train.py", source_dir="src", git_config={
            "repo": str(repo), "branch": "main"}, instance_type="local", role=None)  # fmt: skip
    with quiet():
        pinned = pytorch(entry_point="train.py", source_dir="src", git_config={
            "repo": str(repo), "commit": first}, instance_type="local", role=None)  # fmt: skip
    assert (Path(spec_of(latest).source_dir) / "train.py").read_text() == "print('v2')\n"
    assert (Path(spec_of(pinned).source_dir) / "train.py").read_text() == "print('v1')\n"
    for config, text in (
        ({"repo": str(repo), "token": "ghp_x"}, "credentials"),
        ({"repo": str(tmp_path / "nowhere")}, "git clone failed: "),
        ({"repo": str(repo), "commit": "0" * 40}, "git checkout failed: "),
        ({"repo": str(repo), "tag": "v1"}, "'tag' is not a key"),
    ):
        with pytest.raises(SpecError) as raised:
            pytorch(entry_point="train.py", source_dir="src", git_config=config)
        assert raised.value.field == "git_config" and text in str(raised.value), raised.value
        assert "\n" not in str(raised.value) and "ghp_x" not in str(raised.value)
    with pytest.raises(SpecError, match=r"^source_dir: '\.\./x' is outside the git_config"):
        pytorch(entry_point="train.py", source_dir="../x", git_config={"repo": str(repo)})


# --- every SageMaker argument, the session, the role, framework images without an engine ----


def test_every_sagemaker_argument_is_honoured_warned_or_refused():
    from trainctl.sagemaker import _compat

    classified = (
        set(_compat.SIGNATURE)
        | set(_compat.PASSED)
        | set(_compat.HANDLED)
        | set(_compat.WARNED)
        | set(_compat.REFUSED)
    )
    assert classified == _compat.SAGEMAKER_ARGUMENTS
    # the newest arguments of SageMaker's estimator are among them
    assert {"training_plan", "instance_placement_config"} <= set(_compat.REFUSED)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_argument_is_one_line_and_its_default_is_quiet(home, name):
    defaults, _ = REFUSED[name]
    with quiet():
        pytorch(**{name: defaults[0]})  # SageMaker's default: accepted quietly
    with pytest.raises(SpecError) as raised:
        pytorch(**{name: "something"})
    assert raised.value.field == name
    assert "not supported by trainctl" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.timeout(30)
def test_a_name_sagemaker_does_not_have_is_a_type_error_with_the_closest_name(home):
    with pytest.raises(TypeError, match=r"'instance_typ'; did you mean 'instance_type'\?"):
        pytorch(instance_typ="ml.p3.2xlarge")
    with pytest.raises(TypeError, match=r"'checkpoint_uri'; did you mean 'checkpoint_s3_uri'\?"):
        pytorch(checkpoint_uri="s3://b/c")
    # names no spelling distance finds: what other SDKs (and trainctl) call them
    with pytest.raises(TypeError, match=r"'env'; did you mean 'environment'\?"):
        pytorch(env={"A": "1"})
    from trainctl.sagemaker._compat import ALIASES, SAGEMAKER_ARGUMENTS

    assert set(ALIASES.values()) <= set(SAGEMAKER_ARGUMENTS)


@pytest.mark.timeout(30)
def test_the_tuner_refuses_what_comes_after_training_in_one_line(home):
    from trainctl.sagemaker.tuner import ContinuousParameter, HyperparameterTuner

    tuner = HyperparameterTuner(
        pytorch(instance_type="local", role=None), "accuracy",
        {"lr": ContinuousParameter(0.01, 0.1)},
        metric_definitions=[{"Name": "accuracy", "Regex": "accuracy=([0-9.]+)"}], max_jobs=2,
    )  # fmt: skip
    for method in ("deploy", "transfer_learning_tuner", "create"):
        with pytest.raises(SpecError, match=r"not supported by trainctl: ") as raised:
            getattr(tuner, method)
        assert raised.value.field == method and "\n" not in str(raised.value)
    with pytest.raises(AttributeError):
        tuner.no_such_method  # noqa: B018


@pytest.mark.timeout(30)
def test_without_source_dir_only_the_entry_point_is_sent_as_on_sagemaker(home, tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "data.csv").write_text("1,2\n")  # a notebook's folder holds its data too
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(entry_point=str(folder / "train.py"), source_dir=None,
                      instance_type="local", role=None)  # fmt: skip
    (warned,) = others(caught)
    assert warned.startswith("source_dir: not given: only train.py is sent"), warned
    spec = spec_of(est)
    assert spec.entry_point == "train.py"
    assert sorted(p.name for p in Path(spec.source_dir).iterdir()) == ["train.py"]
    with pytest.raises(SpecError) as raised:
        pytorch(entry_point=str(folder / "missing.py"), source_dir=None)
    assert raised.value.field == "entry_point"


@pytest.mark.timeout(30)
def test_what_comes_after_training_is_refused_in_one_line(home):
    est = pytorch()
    with pytest.raises(SpecError, match=r"deploy: not supported by trainctl: .*hosts no endpoints"):
        est.deploy(initial_instance_count=1, instance_type="ml.m5.xlarge")
    with pytest.raises(AttributeError):
        est.no_such_method  # noqa: B018


@pytest.mark.timeout(30)
def test_framework_version_without_a_container_engine_runs_as_processes(home, monkeypatch):
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "none")  # as a machine without one
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(instance_type="local", role=None)
    (warning,) = [str(w.message) for w in caught]
    assert warning.startswith("framework_version: 2.5.1 (py_version py311)")
    assert "container engines are turned off here" in warning and "PyTorch" in warning
    spec = spec_of(est)
    assert spec.framework_version is None and spec.image_uri is None and not spec.builds_image


@pytest.mark.timeout(30)
def test_get_execution_role_is_the_configured_instance_profile_or_a_placeholder(home, monkeypatch):
    from trainctl.sagemaker import get_execution_role
    from trainctl.sagemaker.session import ROLE_PLACEHOLDER

    role = get_execution_role()
    assert role == ROLE_PLACEHOLDER
    with quiet():  # the placeholder is fine on this machine
        assert spec_of(pytorch(instance_type="local", role=role)).instance_profile is None
    with pytest.warns(SageMakerCompatibilityWarning, match="no instance profile is configured"):
        assert spec_of(pytorch(role=role)).instance_profile is None
    monkeypatch.setenv("TRAINCTL_INSTANCE_PROFILE", "trainctl-node")
    assert get_execution_role() == "trainctl-node"
    assert spec_of(pytorch(role=get_execution_role())).instance_profile == "trainctl-node"
    # the same default for a job that names no profile, through any door
    from trainctl import Estimator

    plain = Estimator(
        entry_point="known_args.py", source_dir=str(SOURCE), instance_type="ml.p4d.24xlarge"
    )
    assert (plain.spec.instance_type, plain.spec.instance_profile) == (
        "p4d.24xlarge",
        "trainctl-node",
    )


@pytest.mark.timeout(30)
def test_the_session_default_bucket_is_the_store(home, tmp_path):
    import trainctl.sagemaker as sagemaker
    from trainctl.sagemaker.s3 import S3Downloader, S3Uploader

    sess = sagemaker.Session()
    bucket = sess.default_bucket()
    assert bucket == "trainctl-local-bucket"
    assert sess.boto_region_name
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_text("1,2\n")
    (data / "sub" / "b.csv").write_text("3,4\n")
    uri = sess.upload_data(path=str(data), bucket=bucket, key_prefix="sagemaker/demo")
    store_dir = home / "store" / "bucket" / "sagemaker" / "demo"
    assert uri == f"file://{store_dir}"
    assert (store_dir / "sub" / "b.csv").read_text() == "3,4\n"
    one = sess.upload_data(path=str(data / "a.csv"), key_prefix="single")
    assert one.endswith("/bucket/single/a.csv")
    assert sorted(sess.list_s3_files(bucket, "sagemaker/demo")) == [
        "sagemaker/demo/a.csv",
        "sagemaker/demo/sub/b.csv",
    ]
    assert sess.read_s3_file(bucket, "sagemaker/demo/a.csv") == "1,2\n"
    got = sess.download_data(str(tmp_path / "back"), bucket, "sagemaker/demo")
    assert sorted(Path(p).relative_to(tmp_path / "back").as_posix() for p in got) == [
        "a.csv",
        "sub/b.csv",
    ]
    # URIs built from the bucket's name, as notebooks build them, are the store's
    assert sess.resolve(f"s3://{bucket}/sagemaker/demo/output") == f"{uri}/output"
    assert sess.resolve("s3://another-bucket/x") == "s3://another-bucket/x"
    S3Uploader.upload_string_as_file_body(
        "hello", f"s3://{bucket}/notes/n.txt", sagemaker_session=sess
    )
    assert S3Downloader.read_file(f"s3://{bucket}/notes/n.txt", sagemaker_session=sess) == "hello"
    assert S3Downloader.list(f"s3://{bucket}/notes", sagemaker_session=sess) == [
        f"s3://{bucket}/notes/n.txt"
    ]
    est = pytorch(
        instance_type="local",
        framework_version=None,
        py_version=None,
        sagemaker_session=sess,
        output_path=f"s3://{bucket}/sagemaker/demo/output",
        checkpoint_s3_uri=f"s3://{bucket}/ckpt",
    )
    assert spec_of(est).output_path == f"{uri}/output"
    assert spec_of(est).checkpoint_s3_uri == f"file://{home / 'store' / 'bucket' / 'ckpt'}"


@pytest.mark.timeout(30)
def test_sagemaker_module_layout_imports_as_notebooks_write_it():
    import trainctl.sagemaker as sagemaker
    from trainctl.sagemaker import get_execution_role
    from trainctl.sagemaker.analytics import TrainingJobAnalytics
    from trainctl.sagemaker.inputs import TrainingInput as Input
    from trainctl.sagemaker.local import LocalSession
    from trainctl.sagemaker.pytorch import PyTorch as Estimator
    from trainctl.sagemaker.pytorch.estimator import PyTorch as Same
    from trainctl.sagemaker.session import Session

    assert Estimator is Same is sagemaker.PyTorch
    assert Input is TrainingInput and sagemaker.Session is Session
    assert issubclass(LocalSession, Session) and callable(get_execution_role)
    assert sagemaker.TrainingJobAnalytics is TrainingJobAnalytics


# A notebook written as SageMaker's PyTorch examples write theirs (session, default bucket,
# execution role, upload_data, framework_version, S3 URIs made from the bucket name), with its
# import lines - and nothing else - changed to trainctl.sagemaker.
SAGEMAKER_NOTEBOOK = [
    """import trainctl.sagemaker as sagemaker
from trainctl.sagemaker import get_execution_role
from trainctl.sagemaker.pytorch import PyTorch
from trainctl.sagemaker.inputs import TrainingInput""",
    """sagemaker_session = sagemaker.Session()
bucket = sagemaker_session.default_bucket()
prefix = "sagemaker/DEMO-pytorch-mnist"
role = get_execution_role()""",
    """import os
import numpy as np
os.makedirs("data", exist_ok=True)
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype("float32")
np.savez("data/train.npz", x=x, y=(x.sum(axis=1) > 0).astype("int64"))
inputs = sagemaker_session.upload_data(path="data", bucket=bucket, key_prefix=prefix)
print("input spec (in this case, just an S3 path): {}".format(inputs))""",
    """estimator = PyTorch(
    entry_point="mnist.py",
    source_dir=SOURCE_DIR,
    role=role,
    py_version="py311",
    framework_version="2.5.1",
    instance_count=2,
    instance_type="local",
    hyperparameters={"epochs": 2, "backend": "gloo"},
    output_path=f"s3://{bucket}/{prefix}/output",
    metric_definitions=[{"Name": "train:loss", "Regex": r"Loss: ([0-9.]+)"}],
)""",
    """estimator.fit({"training": TrainingInput(inputs)})""",
    """job = estimator.latest_training_job
print(job.describe()["TrainingJobStatus"], job.describe()["ModelArtifacts"]["S3ModelArtifacts"])
print(estimator.model_data)""",
    """sagemaker_session.download_data(
    path="model", bucket=bucket, key_prefix=f"{prefix}/output/{job.name}/output/model.tar.gz"
)
print(sorted(os.listdir("model")))""",
]


@pytest.mark.e2e
@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_a_sagemaker_notebook_runs_with_only_its_imports_changed(home, tmp_path, monkeypatch):
    """framework_version on a machine without a container engine: processes with the
    installed torch, one warning naming both versions; run cell by cell in a real kernel."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "none")  # as a machine without one
    notebook = nbformat.v4.new_notebook()
    parameters = f"SOURCE_DIR = {str(FIXTURES / 'sagemaker_nb')!r}"
    notebook.cells = [nbformat.v4.new_code_cell(parameters)] + [
        nbformat.v4.new_code_cell(source) for source in SAGEMAKER_NOTEBOOK
    ]
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=200, kernel_name="python3", resources=resources).execute()
    nbformat.write(notebook, tmp_path / "sagemaker-mnist.ipynb")  # kept, outputs included

    def text(cell: int) -> str:
        outputs = notebook.cells[cell].outputs
        return "".join(
            o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs
        )

    bucket_dir = home / "store" / "bucket" / "sagemaker" / "DEMO-pytorch-mnist"
    assert f"file://{bucket_dir}" in text(3)
    warned = text(4)
    assert warned.count("framework_version: 2.5.1 (py_version py311)") == 1, warned
    assert "container engines are turned off here" in warned
    fit = text(5)
    assert "[algo-1]" in fit and "[algo-2]" in fit and "Completed" in fit, fit
    assert "Train Epoch: 2" in fit
    status, artifacts = text(6).split()[:2]
    assert status == "Completed"
    assert artifacts.startswith(f"file://{bucket_dir}/output/") and artifacts.endswith(
        "/output/model.tar.gz"
    )
    assert text(7).strip() == "['model.tar.gz']"
