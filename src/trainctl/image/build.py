"""The job's container image: a Dockerfile rendered from a base image, the user's requirements
and the trainctl toolkit; a content-addressed tag; build and push
(registries and ECR: `image.registry`).

The image holds everything a node needs to run the job without downloading anything: the
trainctl package (the node agent) under /opt/trainctl and the user's source directory (the
same files `trainctl submit` packages) under /opt/ml/code, the working directory. The tag is a
hash of the rendered Dockerfile and of every file in the build context, so the same inputs
give the same tag, and a build whose tag already exists (locally, or in the registry when
pushing) is skipped.

Without a base image, the base is an AWS Deep Learning Container chosen by framework version,
Python version and CPU/GPU, as SageMaker's PyTorch estimator picks one (`framework_image`).

Only the standard library and trainctl's light modules are imported at the top: boto3 loads
inside the ECR functions.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.cluster import is_loopback
from trainctl.errors import SpecError
from trainctl.image.engine import ImageBuildError, engine_output, last_line, run_engine
from trainctl.image.registry import (
    ECR_RE,
    PUSH_TIMEOUT,
    REPOSITORY_RE,
    ecr_login,
    ensure_ecr_repository,
    pull_image,
    registry_has,
    registry_host,
    tls_args,
)
from trainctl.spec.frameworks import DEFAULT_FRAMEWORK_VERSION, check_dependencies, framework_image

if TYPE_CHECKING:
    from trainctl.image.engine import Engine
    from trainctl.spec.job import JobSpec

__all__ = [
    "BuildPlan",
    "ImageBuildError",
    "ImageRef",
    "build_image",
    "job_image",
    "plan_build",
    "plan_for_spec",
]


CODE_DIR = "/opt/ml/code"  # SageMaker's: the script's working directory
TOOLKIT_DIR = "/opt/trainctl"  # on PYTHONPATH: `python -m trainctl.node.agent` works
DEFAULT_REPOSITORY_PREFIX = "localhost/trainctl"
BUILD_TIMEOUT = 3600.0


@dataclass(frozen=True)
class BuildPlan:
    """What a build would do: the Dockerfile, the context's files and the resulting image."""

    dockerfile: str
    files: dict[str, Path]  # context path (posix) -> file it is copied from
    base_image: str
    repository: str
    tag: str  # content hash of the Dockerfile and every context file

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"

    def context_files(self) -> list[str]:
        """Every file of the build context, sorted (the Dockerfile included)."""
        return sorted(["Dockerfile", *self.files])

    def write_context(self, dest: Path) -> Path:
        """Assemble the build context in the (empty or new) directory `dest`."""
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "Dockerfile").write_text(self.dockerfile, encoding="utf-8")
        for rel, src in self.files.items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            # only the executable bit is kept: the tag must not depend on umask or owners
            target.chmod(0o755 if src.stat().st_mode & 0o111 else 0o644)
        return dest


@dataclass(frozen=True)
class ImageRef:
    """The image a build produced (or found already there)."""

    image: str  # repository:tag
    repository: str
    tag: str
    built: bool  # False: an image with this tag already existed, nothing was built
    pushed: bool  # True: pushed by this call
    skipped_reason: str = ""
    commands: list[list[str]] = field(default_factory=list)  # engine commands run (no secrets)

    def __str__(self) -> str:
        return self.image


# --- framework images -------------------------------------------------------------------


# --- planning -----------------------------------------------------------------------------


def _toolkit(s3: bool) -> dict[str, str]:
    from trainctl.toolkit import AGENT_DEPENDENCIES, S3_DEPENDENCIES

    return {**AGENT_DEPENDENCIES, **(S3_DEPENDENCIES if s3 else {})}


def toolkit_modules(s3: bool = True) -> list[str]:
    """The modules of `toolkit_requirements`, for checking whether a base image has them."""
    return sorted(_toolkit(s3))


def toolkit_requirements(s3: bool = True) -> list[str]:
    """What the node agent imports beyond the standard library (boto3 for s3:// stores)."""
    return sorted(_toolkit(s3).values())


def render_dockerfile(
    base_image: str,
    entry_point: str,
    *,
    has_requirements: bool,
    dependencies: Sequence[str] = (),
    toolkit_dependencies: bool = True,
    s3: bool = True,
    version: str | None = None,
) -> str:
    """The Dockerfile. Slow-changing layers first (pip installs), code last, so an edit to
    the training script rebuilds only the last layers."""
    from trainctl.toolkit import agent_version

    def pip(args: Sequence[str]) -> str:
        return "RUN python3 -m pip install " + " ".join(shlex.quote(a) for a in args)

    lines = [
        f"FROM {base_image}",
        f'LABEL trainctl.version="{version or agent_version()}" '
        f'trainctl.entry_point="{_label_value(entry_point)}"',
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 "
        "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore",
    ]
    if toolkit_dependencies:
        # Framework base images usually carry them already; installed only if missing.
        modules = ", ".join(toolkit_modules(s3=s3))
        lines.append(
            f'RUN python3 -c "import {modules}" 2>/dev/null || '
            + pip(toolkit_requirements(s3=s3)).removeprefix("RUN ")
        )
    if has_requirements:
        lines.append(f"COPY code/requirements.txt {CODE_DIR}/requirements.txt")
        lines.append(pip(["-r", f"{CODE_DIR}/requirements.txt"]))
    if dependencies:
        lines.append(pip(list(dependencies)))
    lines += [
        f"COPY trainctl {TOOLKIT_DIR}/trainctl",
        f"COPY code {CODE_DIR}",
        f"ENV PYTHONPATH={TOOLKIT_DIR} SAGEMAKER_PROGRAM={_env_value(entry_point)} "
        f"TRAINCTL_ENTRY_POINT={_env_value(entry_point)}",
        f"WORKDIR {CODE_DIR}",
    ]
    return "\n".join(lines) + "\n"


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _env_value(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_./-]+", text) else f'"{_label_value(text)}"'


def plan_build(
    source_dir: str | Path,
    entry_point: str,
    *,
    base_image: str | None = None,
    dependencies: Sequence[str] = (),
    framework_version: str | None = None,
    py_version: str | None = None,
    gpu: bool = False,
    region: str | None = None,
    repository: str | None = None,
    toolkit_dependencies: bool = True,
    s3: bool = True,
) -> BuildPlan:
    """Plan the image for `entry_point` in `source_dir` (nothing is built or written).

    `base_image`: the FROM image (default: the framework image for `framework_version`,
    `py_version` and `gpu`). `repository`: where the image goes, e.g. a registry's
    `host:port/name` or an ECR repository URI (default `localhost/trainctl/<dir name>`).
    `toolkit_dependencies=False` leaves out the pip install of the agent's own requirements,
    for a base image that already has them (an earlier trainctl image, say); with it they
    are installed only if the base image lacks them. `s3=False`: the job uses no s3:// URI,
    so the agent needs no boto3.
    """
    from trainctl.packaging import list_included_files
    from trainctl.spec.checks import IMAGE_URI_RE
    from trainctl.toolkit import package_dir, package_files

    source = Path(source_dir).expanduser()
    if not source.is_dir():
        raise SpecError("source_dir", f"{source_dir} is not a directory")
    source = source.resolve()
    entry = Path(entry_point)
    if entry.is_absolute() or not (source / entry).resolve().is_relative_to(source):
        raise SpecError("entry_point", f"{entry_point} must be a path inside {source}")
    if not (source / entry).is_file():
        raise SpecError("entry_point", f"{entry_point} not found in source_dir {source}")
    deps = check_dependencies(dependencies)
    if base_image is None:
        base_image = framework_image(
            framework_version or DEFAULT_FRAMEWORK_VERSION, py_version, gpu=gpu, region=region
        )
    elif not IMAGE_URI_RE.fullmatch(base_image):
        raise SpecError("base_image", f"{base_image!r} is not an image reference like repo:tag")
    if repository is None:
        repository = f"{DEFAULT_REPOSITORY_PREFIX}/{_slug(source.name)}"
    elif not REPOSITORY_RE.fullmatch(repository):
        raise SpecError(
            "repository",
            f"{repository!r} is not a repository like registry.example.com:5000/name "
            "(lower case, no tag)",
        )

    code = list_included_files(source)
    files: dict[str, Path] = {f"code/{rel}": source / rel for rel in code}
    root = package_dir()
    files.update({f"trainctl/{rel.as_posix()}": root / rel for rel in package_files(root)})
    dockerfile = render_dockerfile(
        base_image,
        entry.as_posix(),
        has_requirements="requirements.txt" in code,
        dependencies=deps,
        toolkit_dependencies=toolkit_dependencies,
        s3=s3,
    )
    return BuildPlan(dockerfile, files, base_image, repository, _content_tag(dockerfile, files))


def plan_for_spec(spec: JobSpec, *, repository: str | None = None) -> BuildPlan:
    """The build plan of a job that builds its image (`spec.builds_image`)."""
    from trainctl.spec.catalog import CATALOG
    from trainctl.spec.checks import uses_s3

    return plan_build(
        spec.source_dir,
        spec.entry_point,
        s3=uses_s3(spec),
        base_image=spec.base_image,
        dependencies=spec.dependencies,
        framework_version=spec.framework_version,
        py_version=spec.py_version,
        gpu=CATALOG[spec.instance_type].gpus > 0,
        region=spec.region,
        repository=repository,
    )


def job_image(
    spec: JobSpec,
    *,
    repository: str | None = None,
    push: bool = False,
    engine: Engine | None = None,
) -> str | None:
    """The image a job's nodes run, building (and pushing) it first when the job builds one
    (`spec.builds_image`: build_image, or a framework image, which gets the toolkit added):
    `image_uri` as given, else the built image's reference; None for a job without one."""
    if spec.image_uri is not None:
        return spec.image_uri
    if spec.builds_image:
        return build_image(
            plan_for_spec(spec, repository=repository), push=push, engine=engine
        ).image
    return None


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "job"


def _content_tag(dockerfile: str, files: dict[str, Path]) -> str:
    digest = hashlib.sha256(b"Dockerfile\0" + dockerfile.encode() + b"\0")
    for rel in sorted(files):
        src = files[rel]
        executable = b"x" if src.stat().st_mode & 0o111 else b"-"
        digest.update(rel.encode() + b"\0" + executable)
        digest.update(hashlib.sha256(src.read_bytes()).digest())
    return digest.hexdigest()[:20]


# --- build and push -----------------------------------------------------------------------


def build_image(
    plan: BuildPlan,
    *,
    push: bool = False,
    engine: Engine | None = None,
    tls_verify: bool | None = None,
    timeout: float = BUILD_TIMEOUT,
) -> ImageRef:
    """Build `plan.image` (unless it exists) and, with `push`, push it to its repository.

    With `push`, an image already in the registry is neither built nor pushed. An ECR
    repository is created when missing and the engine logs in with a fresh token.
    `tls_verify`: None checks TLS except for loopback registries (127.0.0.0/8, localhost),
    which are plain http here; False/True force it (podman only; docker's daemon decides).
    """
    from trainctl.image.engine import require_engine

    if engine is None:
        engine = require_engine("building the job's image")
    commands: list[list[str]] = []
    host = registry_host(plan.repository)
    verify = tls_verify if tls_verify is not None else not is_loopback(host or "")
    ecr = ECR_RE.fullmatch(plan.repository)
    if push:
        if host is None or (host == "localhost" and plan.repository.startswith("localhost/")):
            raise SpecError(
                "repository",
                f"{plan.repository!r} names no registry to push to; give one like "
                "registry.example.com/name or an ECR repository URI",
            )
        if ecr:
            ensure_ecr_repository(ecr["name"], ecr["region"])
            commands.append(ecr_login(engine, ecr["region"], tls_verify=tls_verify))
        if registry_has(engine, plan.repository, plan.tag, verify):
            return ImageRef(
                plan.image, plan.repository, plan.tag, False, False, "in the registry", commands
            )
    built = False
    reason = "exists locally"
    if not engine.image_exists(plan.image):
        _ensure_base(engine, plan.base_image, tls_verify, commands)
        with tempfile.TemporaryDirectory(prefix="trainctl-build-") as tmp:
            context = plan.write_context(Path(tmp) / "context")
            args = ["build", "-f", str(context / "Dockerfile"), "-t", plan.image]
            if engine.name == "podman":
                args.append("--pull=never")  # the base is local now (_ensure_base)
            args.append(str(context))
            commands.append(engine.command(*args))
            done = run_engine(engine, args, timeout, f"building {plan.image}")
            if done.returncode != 0:
                raise ImageBuildError(
                    f"building {plan.image} from {plan.base_image} failed "
                    f"(exit {done.returncode}); {engine.name} build output follows",
                    engine_output(done.stdout, done.stderr),
                )
        built, reason = True, ""
    pushed = False
    if push:
        args = ["push", *tls_args(engine, verify), plan.image]
        commands.append(engine.command(*args))
        done = run_engine(engine, args, PUSH_TIMEOUT, f"pushing {plan.image}")
        if done.returncode != 0:
            raise ImageBuildError(
                f"pushing {plan.image} to {host} failed (exit {done.returncode}): "
                f"{last_line(done.stderr or done.stdout)}",
                engine_output(done.stdout, done.stderr),
            )
        pushed = True
    return ImageRef(plan.image, plan.repository, plan.tag, built, pushed, reason, commands)


def _ensure_base(
    engine: Engine, base: str, tls_verify: bool | None, commands: list[list[str]]
) -> None:
    """The base image locally, pulled if need be, with a clear error when it cannot be had."""
    if engine.image_exists(base):
        return
    try:
        pull_image(engine, base, tls_verify=tls_verify, commands=commands)
    except ImageBuildError as exc:
        raise ImageBuildError(
            f"base image {base} is not on this machine and cannot be pulled: {exc.reason}"
        ) from None
