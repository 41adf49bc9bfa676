"""An isolated Python environment per job's requirements.txt, never the user's own.

A venv layered over the agent's interpreter: packages the job asks for are installed into
the venv and shadow the agent's, while everything already installed (torch, trainctl) stays
visible through a .pth hook, so `torch` in requirements.txt does not download it again.
Environments are cached by the hash of requirements.txt and shared by the nodes of a host.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

REQUIREMENTS = "requirements.txt"


def prepare_python(code_dir: Path, envs_dir: Path, log: Callable[[str], None]) -> str:
    """The interpreter to run the job with: the agent's own, or a venv with the requirements."""
    req = code_dir / REQUIREMENTS
    if not req.is_file():
        return sys.executable
    digest = hashlib.sha256(req.read_bytes())
    # The interpreter itself, however it was called (`python`, `python3`, a venv's link to
    # it): one environment per requirements and interpreter, not per path to it.
    digest.update(os.path.realpath(sys.executable).encode() + sys.version.encode())
    digest.update(sys.prefix.encode())  # a venv's packages are what the overlay shows
    env_dir = envs_dir / digest.hexdigest()[:20]
    python = env_dir / "bin" / "python"
    envs_dir.mkdir(parents=True, exist_ok=True)
    with open(envs_dir / f"{env_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # nodes of one host share the env: build it once
        if (env_dir / ".ready").exists():
            log(f"[trainctl] requirements: reusing {env_dir}")
            return str(python)
        log(f"[trainctl] requirements: installing {req.name} into {env_dir}")
        for warning in replaced_packages(req.read_text(errors="replace")):
            log(f"[trainctl] warning: {warning}")
        _create_overlay_venv(env_dir)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                str(req),
            ],
            cwd=code_dir,
            log=log,
        )
        (env_dir / ".ready").touch()
    return str(python)


# A requirement line's name and version specifier (PEP 508, without markers or URLs).
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;#@]*)")
# Packages whose download is several GB when pip picks their CUDA build.
_HEAVY = {"torch": "with its CUDA packages, several GB", "torchvision": "", "torchaudio": ""}


def replaced_packages(requirements: str) -> list[str]:
    """One warning per requirement that pins an installed package to a version it is not:
    pip will download that version into the job's environment, which shadows the
    installed one (a torch pin that differs from the installed torch pulls its CUDA wheels)."""
    from importlib import metadata

    specifier_set = _specifier_class()
    warnings = []
    for line in requirements.splitlines():
        found = _REQUIREMENT.match(line)
        if not found or line.lstrip().startswith(("-", "#")):
            continue
        name, spec = found[1], found[2].strip()
        if not spec:
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        try:
            wanted = specifier_set(spec)
            if wanted.contains(installed, prereleases=True):
                continue
        except Exception:  # a specifier pip may still understand: not ours to judge
            continue
        size = _HEAVY.get(name.lower().replace("_", "-"), "")
        warnings.append(
            f"{REQUIREMENTS} asks for {name}{spec} and {name} {installed} is installed: pip "
            f"will download {name}{spec}{f' ({size})' if size else ''} into the job's "
            f"environment. To use the installed one, write '{name}' without a version (or "
            f"'{name}=={installed}')"
        )
    return warnings


def _specifier_class():
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.specifiers import SpecifierSet
    return SpecifierSet


def _create_overlay_venv(env_dir: Path) -> None:
    import shutil
    import venv

    shutil.rmtree(env_dir, ignore_errors=True)
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(env_dir)
    purelib = Path(
        sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)})
    )
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    # addsitedir (not a bare path) so the parent's own .pth files run too: an editable
    # install of trainctl is one.
    lines = [f"import site; site.addsitedir({p!r})" for p in parents]
    (purelib / "_trainctl_parent_env.pth").write_text("\n".join(lines) + "\n")


def _run(argv: list[str], cwd: Path, log: Callable[[str], None]) -> None:
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
    if proc.wait() != 0:
        raise RuntimeError(f"pip install -r {REQUIREMENTS} failed (exit code {proc.returncode})")
