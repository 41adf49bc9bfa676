"""SageMaker's framework images under trainctl: what `image_uris.retrieve` names, and whether
a framework image runs as an image here or as processes with the installed PyTorch.

A SageMaker program names SageMaker's PyTorch image one of three ways: v2's
`framework_version`/`py_version`, v2's `image_uri` or v3's `training_image` set to a Deep
Learning Container URI (often from `image_uris.retrieve`). Every v3 program names one, so a
machine that cannot run that image must not refuse the program: the image is SageMaker's
PyTorch, and the installed PyTorch runs the same script. Where the image cannot be had (no
engine, the engine turned off, a version trainctl builds no image for, no AWS credentials for
ECR's pull) the job runs as processes, with one warning naming that reason. A user's own
image is not SageMaker's: it still needs an engine, and says so.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainctl.errors import SpecError

# AWS's Deep Learning Containers for PyTorch training, as SageMaker names them:
# <account>.dkr.ecr.<region>.amazonaws.com[.cn]/pytorch-training:<fw>-<cpu|gpu>-<py>[-...].
DLC_RE = re.compile(
    r"^\d{12}\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?/"
    r"(?:[a-z0-9-]+-)?pytorch-training(?::(?P<tag>[A-Za-z0-9_.-]+))?$"
)
DLC_TAG_RE = re.compile(r"^(?P<version>\d+\.\d+(?:\.\d+)?)-(?P<device>cpu|gpu)-(?P<py>py\d+)")
T = TypeVar("T")
DLC_ACCOUNT = "763104351884"  # (trainctl.spec.frameworks builds on the same account's images)
# retrieve()'s other arguments: they pick among SageMaker's variants of an image (a
# distribution's, a compiler's, JumpStart's); the PyTorch training image is the same here.
RETRIEVE_VARIANTS = frozenset(
    {
        "accelerator_type", "container_version", "distribution", "base_framework_version",
        "training_compiler_config", "model_id", "model_version", "hub_arn",
        "tolerate_vulnerable_model", "tolerate_deprecated_model", "sdk_version",
        "inference_tool", "serverless_inference_config", "config_name", "model_type",
        "sagemaker_session",
    }
)  # fmt: skip


@dataclass(frozen=True)
class FrameworkImage:
    """SageMaker's PyTorch image as a program named it: `uri` when by its URI."""

    version: str
    py_version: str | None = None
    uri: str | None = None

    def __str__(self) -> str:
        if self.uri is not None:
            return self.uri
        return f"{self.version} (py_version {self.py_version or '-'})"


def framework_image_of(uri: str | None) -> FrameworkImage | None:
    """The framework image a URI names, or None (not SageMaker's PyTorch training image)."""
    found = DLC_RE.fullmatch(uri) if isinstance(uri, str) else None
    if found is None:
        return None
    tag = DLC_TAG_RE.match(found["tag"] or "")
    if tag is None:
        return FrameworkImage("latest", None, uri)
    return FrameworkImage(tag["version"], tag["py"], uri)


def why_not_an_image(image: FrameworkImage) -> str | None:
    """Why `image` cannot run as an image on this machine, or None: it can."""
    from trainctl.image.engine import find_engine
    from trainctl.spec.frameworks import FRAMEWORK_VERSIONS, resolve_framework_version
    from trainctl.spec.settings import get_settings

    if get_settings().container_engine == "none":
        return "container engines are turned off here (container_engine: none)"
    if find_engine() is None:
        return "no container engine, docker or podman, is running here"
    if image.uri is None:
        try:
            resolve_framework_version(image.version)
        except SpecError:
            return (
                f"trainctl builds SageMaker's PyTorch images for {', '.join(FRAMEWORK_VERSIONS)}, "
                f"not {image.version}"
            )
    if not _aws_credentials():
        return "pulling it from AWS's ECR needs AWS credentials; none are configured"
    return None


@functools.cache
def _aws_credentials() -> bool:
    """Whether AWS credentials are configured: the environment, the config files, SSO, a
    container's role; an instance role only on EC2 (elsewhere botocore would ask
    169.254.169.254, a network call, and wait for its timeout)."""
    try:
        import botocore.session

        session = botocore.session.Session()
        if not _on_ec2():
            session.get_component("credential_provider").remove("iam-role")
        return session.get_credentials() is not None
    except Exception:  # no botocore, a broken config: no credentials to pull with
        return False


def _on_ec2() -> bool:
    for path, mark in (
        ("/sys/devices/virtual/dmi/id/sys_vendor", "Amazon EC2"),
        ("/sys/hypervisor/uuid", "ec2"),
    ):
        try:
            with open(path) as f:
                if f.read().strip().startswith(mark):
                    return True
        except OSError:
            continue
    return False


def as_processes(image: FrameworkImage, field: str) -> bool:
    """Whether `image` runs as processes here (one warning, under `field`, says why)."""
    why = why_not_an_image(image)
    if why is None:
        return False
    _say(image, why, field, stacklevel=5)
    return True


def fit_or_processes(
    image: FrameworkImage | None,
    field: str,
    fit: Callable[[], T],
    without_image: Callable[[], T],
) -> T:
    """`fit()`; where SageMaker's framework `image` turns out not to be had as the job's
    image is built (the registry refused the pull or ECR the login: what only trying
    tells), one warning says so and `without_image()` runs the job as processes instead.
    Nothing of the job is made before its image is built (controller.submit.create_job)."""
    from trainctl.image.engine import ImageBuildError

    try:
        return fit()
    except ImageBuildError as exc:
        if image is None:
            raise
        _say(image, f"building on it failed: {exc.reason}", field, stacklevel=5)
        return without_image()


def _say(image: FrameworkImage, why: str, field: str, *, stacklevel: int) -> None:
    from trainctl.sagemaker._compat import warn

    try:
        from importlib.metadata import version

        installed = f"PyTorch {version('torch')}"
    except Exception:
        installed = "the installed PyTorch"
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    warn(
        field,
        f"{image} is SageMaker's container image and cannot be had here ({why}): the job runs "
        f"as processes with the installed PyTorch ({installed}, {python} here)",
        stacklevel=stacklevel,
    )


def retrieve(
    framework: str,
    region: str | None = None,
    version: str | None = None,
    py_version: str | None = None,
    instance_type: str | None = None,
    image_scope: str | None = None,
    **kwargs: object,
) -> str:
    """`sagemaker.core.image_uris.retrieve` for PyTorch training: the Deep Learning
    Container URI SageMaker names (what trainctl does with it: see the module docstring)."""
    from trainctl.spec.frameworks import FRAMEWORK_VERSIONS

    if framework != "pytorch":
        raise ValueError(
            f"image_uris.retrieve: framework {framework!r}: trainctl runs PyTorch's images "
            "(framework='pytorch') only"
        )
    if image_scope not in (None, "training"):
        raise ValueError(
            f"image_uris.retrieve: image_scope {image_scope!r}: trainctl trains models; it "
            "hosts none (image_scope='training')"
        )
    for name in kwargs:
        if name not in RETRIEVE_VARIANTS:
            raise TypeError(f"image_uris.retrieve() got an unexpected keyword argument {name!r}")
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+(?:\.\d+)?", version):
        raise ValueError("image_uris.retrieve: version: a PyTorch version such as '2.5.1'")
    if py_version is None:
        known = FRAMEWORK_VERSIONS.get(version)
        if known is None:
            raise ValueError(f"image_uris.retrieve: py_version: required for PyTorch {version}")
        py_version = known[-1]
    if not re.fullmatch(r"py3\d+", py_version):
        raise ValueError(f"image_uris.retrieve: py_version {py_version!r}: such as 'py311'")
    if region is None:
        from trainctl.sagemaker.session import Session

        region = Session().boto_region_name
    device = "gpu" if _has_gpus(instance_type) else "cpu"
    registry = f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com"
    return f"{registry}/pytorch-training:{version}-{device}-{py_version}"


def _has_gpus(instance_type: str | None) -> bool:
    from trainctl.spec.catalog import CATALOG, ec2_name

    if instance_type is None or instance_type in ("local", "local_cpu"):
        return False
    if instance_type == "local_gpu":
        return True
    known = CATALOG.get(ec2_name(instance_type))
    return known is not None and known.gpus > 0
