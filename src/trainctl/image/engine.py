"""The container engine on this machine (or a node): docker or podman, found on PATH; running
it, and the error its failures raise (ImageBuildError, with the last lines of its output).

Both take the same command line for what trainctl does (build, push, pull, run, rm), so one
`Engine` drives either. `TRAINCTL_CONTAINER_ENGINE` (setting `container_engine`) picks one
when both are installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from trainctl.errors import TrainctlError, one_line

ENGINES = ("docker", "podman")


class EngineMissingError(TrainctlError):
    """No container engine where one is needed."""


@dataclass(frozen=True)
class Engine:
    name: str  # 'docker' | 'podman'
    path: str

    def command(self, *args: str) -> list[str]:
        return [self.path, *args]

    def run(
        self, *args: str, timeout: float | None = None, input: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `<engine> args...`, capturing its output (never raises on a non-zero exit)."""
        return subprocess.run(
            self.command(*args),
            input=input,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def image_exists(self, image: str) -> bool:
        return self.run("image", "inspect", image, timeout=60).returncode == 0


# Where each engine's client connects when told to: the answer depends on them as well.
ENDPOINT_VARIABLES = ("DOCKER_HOST", "DOCKER_CONTEXT", "CONTAINER_HOST", "CONTAINER_CONNECTION")


@lru_cache(maxsize=16)
def _usable(path: str, endpoint: tuple[str, ...] = ()) -> bool:
    """Whether the engine answers (a docker CLI without a reachable daemon does not).
    `endpoint`: the ENDPOINT_VARIABLES' values, part of the cache key only."""
    try:
        done = subprocess.run([path, "info"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def find_engine(preferred: str | None = None) -> Engine | None:
    """The engine to use: `preferred` if given (None if it is not usable), else the
    `container_engine` setting, else docker, else podman; None when none is installed and
    answering."""
    if preferred is None:
        from trainctl.spec.settings import get_settings

        preferred = get_settings().container_engine or None
    if preferred == "none":
        return None
    endpoint = tuple(os.environ.get(variable, "") for variable in ENDPOINT_VARIABLES)
    for name in [preferred] if preferred else ENGINES:
        path = shutil.which(name)
        if path and _usable(path, endpoint):
            return Engine(name, path)
    return None


def require_engine(why: str, preferred: str | None = None) -> Engine:
    """The engine, or a clear error saying what needed one."""
    engine = find_engine(preferred)
    if engine is None:
        wanted = preferred or " or ".join(ENGINES)
        raise EngineMissingError(f"{why} needs a container engine ({wanted}); none is installed")
    return engine


OUTPUT_TAIL_LINES = 40


class ImageBuildError(TrainctlError):
    """Building, pulling or pushing an image failed. The first line says what; the engine's
    output (its last lines) follows when there is any."""

    def __init__(self, summary: str, output: str = "", *, reason: str = "") -> None:
        self.summary = one_line(summary)
        self.reason = one_line(reason) or self.summary  # why, for a caller's own summary
        self.output = tail_lines(output)
        super().__init__(self.summary + (f"\n{self.output}" if self.output else ""))


def run_engine(engine: Engine, args: list[str], timeout: float, what: str) -> Any:
    """`engine args...`, with a spinner saying `what` on a terminal (builds, pulls and pushes
    take minutes); ImageBuildError on a timeout or an engine that cannot run."""
    from trainctl.progress import status

    try:
        with status(what):
            return engine.run(*args, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(
            f"{what} took longer than {timeout:g} s", engine_output(exc.stdout, exc.stderr)
        ) from None
    except OSError as exc:
        raise ImageBuildError(f"{what}: cannot run {engine.path}: {exc.strerror or exc}") from None


def engine_output(*parts: bytes | str | None) -> str:
    out = []
    for part in parts:
        if part:
            out.append(part.decode(errors="replace") if isinstance(part, bytes) else part)
    return "\n".join(p.rstrip("\n") for p in out)


def tail_lines(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def last_line(text: bytes | str | None) -> str:
    lines = engine_output(text).strip().splitlines()
    return one_line(lines[-1].strip()) if lines else "no output"
