"""A real Docker engine for tests: a private `dockerd` (Debian's docker.io) on a unix socket
in a temp dir, so the docker code path runs against a daemon, not only golden command lines.

The daemon keeps everything under its own directory: data root, exec root, socket, pid file
and trust key (`deprecated-key-path`, else it writes /etc/docker/key.json). It makes no
bridge and touches no iptables: trainctl's containers use the host's network. Tests point
at it with DOCKER_HOST; it lives as long as the test module that uses it. At the end every
container is removed, the daemon is stopped, what it left mounted under its directory is
unmounted, and the directory is deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.rigs.registry import require

DOCKERD = "/usr/sbin/dockerd"


def dockerd_missing_reason() -> str | None:
    for binary in (DOCKERD, "/usr/bin/docker-init"):
        if not Path(binary).is_file():
            return f"{binary} not found (apt-get install docker.io)"
    if shutil.which("docker") is None:
        return "no docker CLI on PATH (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    return None


@dataclass(frozen=True)
class Dockerd:
    host: str  # unix:///.../docker.sock, for DOCKER_HOST
    root: Path
    cli: str

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.host}
        return subprocess.run(
            [self.cli, *args], env=env, capture_output=True, text=True, timeout=timeout
        )


def _mounts_under(root: Path) -> list[str]:
    """Mount points below root, deepest first (overlay layers, the default netns)."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == str(root) or point.startswith(f"{root}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _start(root: Path) -> subprocess.Popen[bytes]:
    config = root / "daemon.json"
    config.write_text(json.dumps({"deprecated-key-path": str(root / "key.json")}))
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - closed by the child's exit
    argv = [
        DOCKERD,
        "--config-file", str(config),
        "--host", f"unix://{root / 'docker.sock'}",
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"),
        "--iptables=false", "--ip6tables=false", "--bridge=none",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc


def _stop(proc: subprocess.Popen[bytes], daemon: Dockerd) -> None:
    if proc.poll() is None:
        left = daemon.run("ps", "-aq", timeout=60).stdout.split()
        if left:
            daemon.run("rm", "-f", *left, timeout=120)
        proc.terminate()  # dockerd stops the containerd it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
    for point in _mounts_under(daemon.root):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    require(dockerd_missing_reason(), "docker")
    root = Path(tempfile.mkdtemp(prefix="trainctl-dockerd-"))
    proc = _start(root)
    daemon = Dockerd(f"unix://{root / 'docker.sock'}", root, shutil.which("docker") or "docker")
    try:
        deadline = time.monotonic() + 60
        while daemon.run("info", timeout=30).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (root / "dockerd.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"dockerd did not start: {log}")
            time.sleep(0.2)
        yield daemon
    finally:
        _stop(proc, daemon)
