"""The job's container image: rendered Dockerfiles, the build context, the content-hash tag,
real builds with podman, push/pull through a real registry on loopback, ECR against moto."""

from __future__ import annotations

import base64
import json
import stat
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.rigs.registry import Registry, import_busybox_image
from tests.rigs.sshd import free_port
from trainctl.cli import app
from trainctl.cli.app import EXIT_BAD_INPUT
from trainctl.errors import SpecError
from trainctl.image.build import (
    build_image,
    job_image,
    plan_build,
    plan_for_spec,
    render_dockerfile,
)
from trainctl.image.engine import Engine, EngineMissingError, ImageBuildError
from trainctl.image.registry import ecr_login, ensure_ecr_repository, pull_image
from trainctl.spec.build import build_spec
from trainctl.spec.frameworks import framework_image
from trainctl.toolkit import agent_version, package_files

DLC = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training"
TOOLKIT_PIP = (
    'RUN python3 -c "import boto3, pathspec, pydantic, pydantic_settings, yaml" 2>/dev/null '
    "|| python3 -m pip install 'boto3>=1.34' 'pathspec>=0.12' 'pydantic-settings>=2.2' "
    "'pydantic>=2.6,<3' 'pyyaml>=6'\n"
)
HEADER = (
    'LABEL trainctl.version="0.1.0-test" trainctl.entry_point="train.py"\n'
    "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 "
    "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore\n"
)
FOOTER = (
    "COPY trainctl /opt/trainctl/trainctl\n"
    "COPY code /opt/ml/code\n"
    "ENV PYTHONPATH=/opt/trainctl SAGEMAKER_PROGRAM=train.py TRAINCTL_ENTRY_POINT=train.py\n"
    "WORKDIR /opt/ml/code\n"
)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "digits"
    (src / "lib").mkdir(parents=True)
    (src / "train.py").write_text("print('training')\n")
    (src / "lib" / "util.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / ".gitignore").write_text("data/\n")
    (src / "data").mkdir()
    (src / "data" / "big.bin").write_bytes(b"\0" * 100)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return src


# --- framework images -----------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_framework_image_by_version_python_and_device() -> None:
    assert framework_image("2.3.0", "py311", gpu=False) == f"{DLC}:2.3.0-cpu-py311"
    assert framework_image("2.3", gpu=True) == f"{DLC}:2.3.0-gpu-py311"
    assert (
        framework_image("1.13", "py39", gpu=True, region="eu-west-1")
        == "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:1.13.1-gpu-py39"
    )
    with pytest.raises(SpecError, match=r"^framework_version: PyTorch '0.4' has no .*2\.6\.0"):
        framework_image("0.4", gpu=False)
    with pytest.raises(SpecError, match=r"^py_version: 'py38' is not available .*py311"):
        framework_image("2.4.0", "py38", gpu=False)
    with pytest.raises(SpecError, match=r"^region: "):
        framework_image("2.4.0", gpu=False, region="mars")


# --- golden Dockerfiles ---------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_dockerfile_cpu_base() -> None:
    got = render_dockerfile(
        f"{DLC}:2.5.1-cpu-py311", "train.py", has_requirements=False, version="0.1.0-test"
    )
    assert got == f"FROM {DLC}:2.5.1-cpu-py311\n" + HEADER + TOOLKIT_PIP + FOOTER


@pytest.mark.timeout(10)
def test_dockerfile_gpu_base() -> None:
    base = framework_image("2.6", gpu=True)
    got = render_dockerfile(base, "train.py", has_requirements=False, version="0.1.0-test")
    assert got == f"FROM {DLC}:2.6.0-gpu-py312\n" + HEADER + TOOLKIT_PIP + FOOTER


@pytest.mark.timeout(10)
def test_dockerfile_with_requirements_txt() -> None:
    got = render_dockerfile(
        "registry.example.com/base:1", "train.py", has_requirements=True, version="0.1.0-test"
    )
    assert got == (
        "FROM registry.example.com/base:1\n"
        + HEADER
        + TOOLKIT_PIP
        + "COPY code/requirements.txt /opt/ml/code/requirements.txt\n"
        + "RUN python3 -m pip install -r /opt/ml/code/requirements.txt\n"
        + FOOTER
    )


@pytest.mark.timeout(10)
def test_dockerfile_with_dependencies_list() -> None:
    got = render_dockerfile(
        "base:1",
        "train.py",
        has_requirements=False,
        dependencies=["numpy>=1.26", "torchvision"],
        toolkit_dependencies=False,
        version="0.1.0-test",
    )
    assert got == (
        "FROM base:1\n" + HEADER + "RUN python3 -m pip install 'numpy>=1.26' torchvision\n" + FOOTER
    )


@pytest.mark.timeout(10)
def test_plan_renders_this_trainctl_version_and_requirements(source: Path) -> None:
    (source / "requirements.txt").write_text("numpy\n")
    plan = plan_build(source, "train.py", base_image="base:1", dependencies=["scipy"])
    assert plan.dockerfile == render_dockerfile(
        "base:1",
        "train.py",
        has_requirements=True,
        dependencies=["scipy"],
        version=agent_version(),
    )
    assert plan.repository == "localhost/trainctl/digits"
    assert plan.image == f"localhost/trainctl/digits:{plan.tag}"


# --- context and tag --------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_context_holds_the_code_and_the_toolkit_only(source: Path, tmp_path: Path) -> None:
    plan = plan_build(source, "train.py", base_image="base:1")
    files = plan.context_files()
    code = [f for f in files if f.startswith("code/")]
    toolkit = [f for f in files if f.startswith("trainctl/")]
    assert code == ["code/.gitignore", "code/lib/util.py", "code/run.sh", "code/train.py"]
    assert toolkit == sorted(f"trainctl/{p.as_posix()}" for p in package_files())
    assert "trainctl/node/agent.py" in toolkit
    assert set(files) == {"Dockerfile", *code, *toolkit}

    context = plan.write_context(tmp_path / "ctx")
    written = sorted(p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file())
    assert written == files
    assert (context / "Dockerfile").read_text() == plan.dockerfile
    assert (context / "code" / "run.sh").stat().st_mode & stat.S_IXUSR
    assert not (context / "code" / "train.py").stat().st_mode & stat.S_IXUSR


@pytest.mark.timeout(20)
def test_tag_is_a_hash_of_the_dockerfile_and_context(source: Path) -> None:
    first = plan_build(source, "train.py", base_image="base:1")
    assert plan_build(source, "train.py", base_image="base:1").tag == first.tag
    (source / "data" / "big.bin").write_bytes(b"ignored file changed")  # not in the context
    assert plan_build(source, "train.py", base_image="base:1").tag == first.tag

    tags = {first.tag}
    (source / "lib" / "util.py").write_text("X = 2\n")
    tags.add(plan_build(source, "train.py", base_image="base:1").tag)
    (source / "lib" / "util.py").chmod(0o755)
    tags.add(plan_build(source, "train.py", base_image="base:1").tag)
    tags.add(plan_build(source, "train.py", base_image="base:2").tag)
    tags.add(plan_build(source, "train.py", base_image="base:2", dependencies=["numpy"]).tag)
    assert len(tags) == 5


@pytest.mark.timeout(10)
def test_plan_bad_input(source: Path) -> None:
    with pytest.raises(SpecError, match=r"^base_image: 'Not An Image' is not an image reference"):
        plan_build(source, "train.py", base_image="Not An Image")
    with pytest.raises(SpecError, match=r"^dependencies: '-e \.' is not a pip requirement"):
        plan_build(source, "train.py", base_image="base:1", dependencies=["-e ."])
    with pytest.raises(SpecError, match=r"^repository: 'Reg/x:tag' is not a repository"):
        plan_build(source, "train.py", base_image="base:1", repository="Reg/x:tag")
    with pytest.raises(SpecError, match=r"^entry_point: nope.py not found"):
        plan_build(source, "nope.py", base_image="base:1")
    with pytest.raises(SpecError, match=r"^framework_version: "):
        plan_build(source, "train.py", framework_version="9.9")


# --- spec, Estimator and CLI fields --------------------------------------------------------------


@pytest.mark.timeout(10)
def test_spec_build_fields(source: Path) -> None:
    spec = build_spec(
        entry_point="train.py",
        source_dir=str(source),
        instance_type="p3.2xlarge",
        build_image=True,
        framework_version="2.4",
        py_version="py311",
        dependencies=["numpy"],
    )
    plan = plan_for_spec(spec, repository="127.0.0.1:5000/digits")
    assert plan.base_image == f"{DLC}:2.4.0-gpu-py311"  # a GPU instance type
    assert "RUN python3 -m pip install numpy\n" in plan.dockerfile
    assert plan.image.startswith("127.0.0.1:5000/digits:")

    from trainctl.estimator import Estimator

    est = Estimator(
        "train.py", str(source), build_image=True, base_image="base:1", dependencies=["scipy"]
    )
    assert (est.spec.build_image, est.spec.base_image, est.spec.dependencies) == (
        True,
        "base:1",
        ["scipy"],
    )
    framework_only = est.spec.model_copy(
        update={
            "build_image": False,
            "base_image": None,
            "dependencies": [],
            "framework_version": "2.2",
        }
    )
    # AWS's image lacks the agent: the job's image is built on it, with the toolkit added
    assert framework_only.builds_image
    assert plan_for_spec(framework_only).base_image == f"{DLC}:2.2.0-cpu-py310"
    given = framework_only.model_copy(update={"image_uri": "registry.example.com/x:1"})
    assert not given.builds_image and job_image(given) == "registry.example.com/x:1"

    def bad(**fields: object) -> str:
        with pytest.raises(SpecError) as info:
            build_spec(entry_point="train.py", source_dir=str(source), **fields)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert bad(base_image="base:1").startswith("base_image: only with build_image=True")
    assert bad(dependencies=["numpy"]).startswith("dependencies: only with build_image=True")
    assert bad(build_image=True, image_uri="repo:1").startswith("image_uri: give either")
    assert bad(framework_version="0.1").startswith("framework_version: PyTorch '0.1'")
    assert bad(framework_version="2.6", py_version="py39").startswith(
        "py_version: 'py39' is not available for PyTorch 2.6.0"
    )
    assert bad(build_image=True, dependencies=["--index-url=x"]).startswith("dependencies: ")
    assert bad(build_image="yes").startswith("build_image: ")


@pytest.mark.timeout(20)
def test_cli_build_dry_run_prints_dockerfile_then_context(home: Path, source: Path) -> None:
    args = ["build", "--source-dir", str(source), "--entry-point", "train.py"]
    result = CliRunner().invoke(app, [*args, "--base-image", "base:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = plan_build(source, "train.py", base_image="base:1")
    assert result.stdout == plan.dockerfile + "\n" + "\n".join(plan.context_files()) + "\n"

    result = CliRunner().invoke(app, [*args, "--gpu", "--dry-run", "-o", "json"])
    data = json.loads(result.stdout)
    assert data["base_image"] == framework_image("2.5.1", gpu=True)
    assert data["context"][0] == "Dockerfile"

    result = CliRunner().invoke(app, [*args, "--base-image", "Bad Image", "--dry-run"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.startswith("error: base_image: 'Bad Image' is not an image reference")


@pytest.mark.timeout(20)
def test_cli_submit_passes_build_fields(
    home: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainctl.spec.build as spec_module

    seen: dict[str, object] = {}
    real = spec_module.build_spec

    def recording_build_spec(**fields: object) -> object:
        seen.update(fields)
        return real(**fields)

    monkeypatch.setattr(spec_module, "build_spec", recording_build_spec)
    result = CliRunner().invoke(
        app,
        [
            "submit",
            "train.py",
            "--source-dir",
            str(source),
            "--build-image",
            "--base-image",
            "Bad Image",
            "--dependencies",
            "numpy",
        ],
    )
    assert result.exit_code == EXIT_BAD_INPUT
    assert seen["build_image"] is True and seen["dependencies"] == ["numpy"]
    assert "base_image: 'Bad Image'" in result.stderr


# --- real builds with podman ---------------------------------------------------------------


def _podman() -> Engine:
    from trainctl.image.engine import require_engine

    return require_engine("tests", preferred="podman")


def _inspect(image: str) -> dict[str, object]:
    done = subprocess.run(
        ["podman", "image", "inspect", image], capture_output=True, timeout=60, check=True
    )
    return dict(json.loads(done.stdout)[0])


@pytest.mark.timeout(90)
def test_build_then_cache_then_rebuild_on_change(
    podman_storage: Path, source: Path, tmp_path: Path
) -> None:
    base = import_busybox_image(tmp_path, "localhost/trainctl-test/busybox:1")
    engine = _podman()
    plan = plan_build(source, "train.py", base_image=base, toolkit_dependencies=False)
    ref = build_image(plan, engine=engine)
    assert (ref.built, ref.pushed, ref.image) == (True, False, plan.image)
    config = _inspect(ref.image)["Config"]
    assert isinstance(config, dict)
    assert config["WorkingDir"] == "/opt/ml/code"
    assert "PYTHONPATH=/opt/trainctl" in config["Env"]
    assert f'trainctl.version="{config["Labels"]["trainctl.version"]}"' in plan.dockerfile

    # the same plan object: others editing trainctl/ meanwhile would change a fresh plan's tag
    again = build_image(plan)
    assert (again.image, again.built, again.skipped_reason) == (ref.image, False, "exists locally")
    assert not any(c[1:2] == ["build"] for c in again.commands)

    (source / "train.py").write_text("print('changed')\n")
    changed = build_image(
        plan_build(source, "train.py", base_image=base, toolkit_dependencies=False)
    )
    assert changed.built and changed.tag != ref.tag
    assert engine.image_exists(changed.image) and engine.image_exists(ref.image)


@pytest.mark.timeout(90)
def test_build_push_remove_pull(
    podman_storage: Path, registry: Registry, source: Path, tmp_path: Path
) -> None:
    base = import_busybox_image(tmp_path, "localhost/trainctl-test/busybox:1")
    engine = _podman()
    repository = f"{registry.host}/team/digits"
    plan = plan_build(
        source, "train.py", base_image=base, toolkit_dependencies=False, repository=repository
    )
    ref = build_image(plan, push=True, engine=engine)
    assert (ref.built, ref.pushed) == (True, True)
    assert registry.has_manifest("team/digits", ref.tag)
    push = next(c for c in ref.commands if c[1] == "push")
    assert "--tls-verify=false" in push  # a loopback registry speaks plain http

    again = build_image(plan, push=True, engine=engine)
    assert (again.built, again.pushed, again.skipped_reason) == (False, False, "in the registry")

    assert engine.run("rmi", ref.image, timeout=60).returncode == 0
    assert not engine.image_exists(ref.image)
    pull_image(engine, ref.image)
    assert engine.image_exists(ref.image)
    assert _inspect(ref.image)["Config"]["Labels"]["trainctl.entry_point"] == "train.py"  # type: ignore[index]


@pytest.mark.timeout(90)
def test_a_registry_that_wants_credentials_is_asked_with_the_engines_login(
    podman_storage: Path, private_registry: Registry, source: Path, tmp_path: Path
) -> None:
    """The tag check goes through the engine, with its login: an image already in a
    private registry is neither rebuilt nor pushed again."""
    from tests.rigs.registry import REGISTRY_PASSWORD

    base = import_busybox_image(tmp_path, "localhost/trainctl-test/busybox:1")
    engine = _podman()
    login = engine.run(
        "login", "--tls-verify=false", "-u", "alice", "--password-stdin", private_registry.host,
        input=REGISTRY_PASSWORD.encode(), timeout=60,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    plan = plan_build(
        source, "train.py", base_image=base, toolkit_dependencies=False,
        repository=f"{private_registry.host}/team/digits",
    )  # fmt: skip
    ref = build_image(plan, push=True, engine=engine)
    assert (ref.built, ref.pushed) == (True, True)
    assert engine.run("rmi", ref.image, timeout=60).returncode == 0
    again = build_image(plan, push=True, engine=engine)
    assert (again.built, again.pushed, again.skipped_reason) == (False, False, "in the registry")


# --- failures -------------------------------------------------------------------------------------


def _created_images() -> list[str]:
    done = subprocess.run(
        ["podman", "images", "--all", "--noheading", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return sorted(done.stdout.decode().split())


@pytest.mark.timeout(60)
def test_missing_base_image_is_one_clear_line(podman_storage: Path, source: Path) -> None:
    base = f"127.0.0.1:{free_port('127.0.0.1')}/nobody/base:1"
    plan = plan_build(source, "train.py", base_image=base, toolkit_dependencies=False)
    with pytest.raises(ImageBuildError) as info:
        build_image(plan, engine=_podman())
    assert str(info.value).startswith(f"base image {base} is not on this machine and cannot")
    assert "\n" not in str(info.value)
    assert _created_images() == []


@pytest.mark.timeout(30)
def test_engine_missing(
    home: Path, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_build(source, "train.py", base_image="base:1")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("TRAINCTL_CONTAINER_ENGINE", raising=False)
    with pytest.raises(EngineMissingError, match=r"^building the job's image needs a container"):
        build_image(plan)
    from trainctl.image.engine import require_engine

    with pytest.raises(EngineMissingError, match=r"needs a container engine \(nerdctl\)"):
        require_engine("building the job's image", preferred="nerdctl")


@pytest.mark.timeout(60)
def test_dockerfile_failure_carries_the_build_output(
    podman_storage: Path, source: Path, tmp_path: Path
) -> None:
    base = import_busybox_image(tmp_path, "localhost/trainctl-test/busybox:1")
    (source / "requirements.txt").write_text("numpy\n")  # busybox has no python3 to pip with
    plan = plan_build(source, "train.py", base_image=base, toolkit_dependencies=False)
    with pytest.raises(ImageBuildError) as info:
        build_image(plan, engine=_podman())
    first, _, output = str(info.value).partition("\n")
    assert first.startswith(f"building {plan.image} from {base} failed (exit ")
    assert "python3" in output and "not found" in output
    assert not _podman().image_exists(plan.image)


@pytest.mark.timeout(60)
def test_push_refused(
    podman_storage: Path, readonly_registry: Registry, source: Path, tmp_path: Path
) -> None:
    base = import_busybox_image(tmp_path, "localhost/trainctl-test/busybox:1")
    engine = _podman()
    nobody = f"127.0.0.1:{free_port('127.0.0.1')}"
    for host in (nobody, readonly_registry.host):
        plan = plan_build(
            source,
            "train.py",
            base_image=base,
            toolkit_dependencies=False,
            repository=f"{host}/team/digits",
        )
        with pytest.raises(ImageBuildError) as info:
            build_image(plan, push=True, engine=engine)
        first = str(info.value).partition("\n")[0]
        assert first.startswith(f"pushing {plan.image} to {host} failed (exit ")
        assert engine.image_exists(plan.image)  # built; only the push failed
    assert not readonly_registry.has_manifest("team/digits", plan.tag)

    with pytest.raises(SpecError, match=r"^repository: 'localhost/trainctl/digits' names no"):
        build_image(plan_build(source, "train.py", base_image=base), push=True, engine=engine)


# --- ECR ------------------------------------------------------------------------------------------


def _ecr_password(region: str) -> str:
    """The password of the token ECR (moto, inside mock_aws) hands out."""
    import boto3

    token = boto3.client("ecr", region_name=region).get_authorization_token()
    return (
        base64.b64decode(token["authorizationData"][0]["authorizationToken"])
        .decode()
        .partition(":")[2]
    )


def _recording_engine(tmp_path: Path) -> tuple[Engine, Path]:
    """An 'engine' that records each command line and its stdin, and succeeds; `image
    inspect` says the image exists, so no build runs (the ECR path is what is under test)."""
    log = tmp_path / "engine.log"
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "ARGV $*" >> {log}\n'
        f'if [ "$1" = login ]; then echo "STDIN $(cat)" >> {log}; fi\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return Engine("podman", str(script)), log


@pytest.mark.timeout(60)
def test_ecr_repository_creation_login_and_push(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto import mock_aws

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    engine, log = _recording_engine(tmp_path)
    repo = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainctl/digits"
    with mock_aws():
        ecr = boto3.client("ecr", region_name="us-west-2")
        uri = ensure_ecr_repository("trainctl/digits", "us-west-2")
        assert uri == repo
        assert ensure_ecr_repository("trainctl/digits", "us-west-2") == repo  # found, not new
        assert len(ecr.describe_repositories()["repositories"]) == 1
        ecr.delete_repository(repositoryName="trainctl/digits")

        password = _ecr_password("us-west-2")
        plan = plan_build(source, "train.py", base_image="base:1", repository=repo)
        ref = build_image(plan, push=True, engine=engine)
        assert (ref.built, ref.pushed) == (False, True)  # the recorder says it exists locally
        names = [r["repositoryName"] for r in ecr.describe_repositories()["repositories"]]
        assert names == ["trainctl/digits"]

    lines = log.read_text().splitlines()
    login = next(line for line in lines if line.startswith("ARGV login"))
    assert login == (
        "ARGV login --username AWS --password-stdin 123456789012.dkr.ecr.us-west-2.amazonaws.com"
    )
    assert f"STDIN {password}" in lines
    assert lines[-1] == f"ARGV push {plan.image}"
    assert all(password not in " ".join(c) for c in ref.commands)


@pytest.mark.timeout(30)
def test_ecr_login_failure_hides_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    script = tmp_path / "podman"
    # an engine that echoes what it read, as a careless error message might
    script.write_text('#!/bin/sh\necho "Error: bad credentials $(cat)" >&2\nexit 1\n')
    script.chmod(0o755)
    with mock_aws():
        password = _ecr_password("us-east-1")
        with pytest.raises(ImageBuildError) as info:
            ecr_login(Engine("podman", str(script)), "us-east-1")
    assert str(info.value).startswith("podman login to 123456789012.dkr.ecr.us-east-1")
    assert password not in str(info.value) and "***" in str(info.value)


def _registry_engine(tmp_path: Path) -> tuple[Engine, Path]:
    """An 'engine' whose registry wants a login: `pull` fails until `login` has run, as a
    real engine does against ECR without credentials. Records argv and the login's stdin."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "engine.log"
    logged_in = tmp_path / "logged-in"
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "ARGV $*" >> {log}\n'
        f'if [ "$1" = login ]; then echo "STDIN $(cat)" >> {log}; touch {logged_in}; exit 0; fi\n'
        f'if [ "$1" = pull ] && [ ! -e {logged_in} ]; then\n'
        '  echo "Error: initializing source docker://$2: reading manifest: authentication '
        'required" >&2; exit 125\n'
        "fi\n"
        'if [ "$1" = image ]; then exit 1; fi\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return Engine("podman", str(script)), log


@pytest.mark.timeout(30)
def test_pull_of_a_framework_image_logs_in_to_its_ecr_registry(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS's framework images live in another account's registry (763104351884): a refused
    pull logs in there with the caller's token (stdin only) and pulls again; a build on such
    a base does the same. No traffic leaves the machine: the engine is a recorder."""
    from moto import mock_aws

    from trainctl.image.container import ensure_image

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    image = f"{DLC}:2.3.0-gpu-py311-cu121-ubuntu20.04-ec2"
    registry = "763104351884.dkr.ecr.us-east-1.amazonaws.com"
    engine, log = _registry_engine(tmp_path)
    with mock_aws():
        password = _ecr_password("us-east-1")
        commands: list[list[str]] = []
        pull_image(engine, image, commands=commands)
        assert ensure_image(engine, image)  # logged in now: pulled at once
    lines = log.read_text().splitlines()
    assert lines[:4] == [
        f"ARGV pull {image}",
        f"ARGV login --username AWS --password-stdin {registry}",
        f"STDIN {password}",
        f"ARGV pull {image}",
    ]
    assert lines[4:] == [f"ARGV image inspect {image}", f"ARGV pull {image}"]
    assert [c[1] for c in commands] == ["pull", "login", "pull"]
    assert all(password not in " ".join(c) for c in commands)

    # a build on it: the base is pulled the same way (a new recorder: not logged in yet)
    engine, log = _registry_engine(tmp_path / "build")
    with mock_aws():
        plan = plan_build(source, "train.py", base_image=image)
        ref = build_image(plan, engine=engine)
    assert [c[1] for c in ref.commands] == ["pull", "login", "pull", "build"]


@pytest.mark.timeout(30)
def test_refused_pull_outside_ecr_logs_in_nowhere(tmp_path: Path) -> None:
    engine, log = _registry_engine(tmp_path)
    with pytest.raises(ImageBuildError) as info:
        pull_image(engine, "registry.example.com/team/base:1")
    assert str(info.value).splitlines()[0].endswith("authentication required")
    assert log.read_text().splitlines() == ["ARGV pull registry.example.com/team/base:1"]


@pytest.mark.timeout(30)
def test_ecr_login_without_credentials_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # boto3's default session keeps credentials an earlier test resolved: start afresh, and
    # should any be found anyway, the request still goes to a closed port on loopback
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port('127.0.0.1')}")
    engine, _ = _registry_engine(tmp_path)
    with pytest.raises(ImageBuildError) as info:
        pull_image(engine, f"{DLC}:2.3.0-cpu-py311")
    assert str(info.value) == (
        "cannot get an ECR login token in us-east-1: Unable to locate credentials"
    )
