"""Framework images the spec can name: AWS Deep Learning Containers for PyTorch training,
and the syntax of extra pip dependencies. Pure data and checks: building is `image.build`'s."""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainctl.errors import SpecError

# AWS Deep Learning Containers for PyTorch training: framework version -> Python versions.
# Names follow `<account>.dkr.ecr.<region>.amazonaws.com/pytorch-training:<fw>-<cpu|gpu>-<py>`.
FRAMEWORK_VERSIONS: dict[str, tuple[str, ...]] = {
    "1.13.1": ("py39",),
    "2.0.1": ("py310",),
    "2.1.0": ("py310",),
    "2.2.0": ("py310",),
    "2.3.0": ("py311",),
    "2.4.0": ("py311",),
    "2.5.1": ("py311",),
    "2.6.0": ("py312",),
}
DEFAULT_FRAMEWORK_VERSION = "2.5.1"
DLC_ACCOUNT = "763104351884"
DEFAULT_REGION = "us-east-1"


# A pip requirement given on a command line: no option (leading '-'), no control characters.
DEPENDENCY_RE = re.compile(r"^[A-Za-z0-9][^\x00-\x1f\x7f]{0,299}$")


def framework_image(
    framework_version: str,
    py_version: str | None = None,
    *,
    gpu: bool,
    region: str | None = None,
) -> str:
    """The AWS DLC PyTorch training image for this version, Python and CPU/GPU.

    `framework_version` may be short ("2.3" for 2.3.0); `py_version` defaults to the only
    (or newest) one the table has for that version.
    """
    version = resolve_framework_version(framework_version)
    pythons = FRAMEWORK_VERSIONS[version]
    if py_version is None:
        py_version = pythons[-1]
    elif py_version not in pythons:
        raise SpecError(
            "py_version",
            f"{py_version!r} is not available for PyTorch {version}; allowed: {', '.join(pythons)}",
        )
    region = region or DEFAULT_REGION
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]", region):
        raise SpecError("region", f"{region!r} is not an AWS region name like us-east-1")
    device = "gpu" if gpu else "cpu"
    registry = f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com"
    return f"{registry}/pytorch-training:{version}-{device}-{py_version}"


def resolve_framework_version(framework_version: str) -> str:
    """'2.3' -> '2.3.0' (the table's entry); a SpecError naming the supported ones otherwise."""
    if framework_version in FRAMEWORK_VERSIONS:
        return framework_version
    matches = [v for v in FRAMEWORK_VERSIONS if v.startswith(f"{framework_version}.")]
    if len(matches) == 1:
        return matches[0]
    raise SpecError(
        "framework_version",
        f"PyTorch {framework_version!r} has no training image; supported: "
        f"{', '.join(FRAMEWORK_VERSIONS)}",
    )


def check_dependencies(dependencies: Sequence[str]) -> list[str]:
    """Validated pip requirements (raises SpecError('dependencies', ...))."""
    out = []
    for dep in dependencies:
        if not isinstance(dep, str) or not DEPENDENCY_RE.fullmatch(dep.strip()):
            raise SpecError(
                "dependencies",
                f"{dep!r} is not a pip requirement (e.g. 'numpy>=1.26'); options and control "
                "characters are not allowed",
            )
        out.append(dep.strip())
    return out
