"""A real image registry (Debian's `docker-registry`, the CNCF distribution server) on
127.0.0.1, and an isolated podman storage, for image build/push/pull tests.

The podman storage lives in the test's tmp dir (CONTAINERS_STORAGE_CONF, vfs driver: no
mounts to undo), so tests neither see nor leave images in the machine's own storage, and
removing the directory removes every image and layer a test made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.rigs.sshd import free_port

REGISTRY = "/usr/bin/docker-registry"
BUSYBOX = "/bin/busybox"


def require(reason: str | None, what: str) -> None:
    """Skip locally when a real part is missing; under CI a missing part is a failure."""
    from tests.helpers import require_part

    require_part(what, reason)


def podman_missing_reason() -> str | None:
    from trainctl.image.engine import find_engine

    if shutil.which("podman") is None:
        return "podman not found (apt-get install podman runc)"
    if find_engine("podman") is None:
        return "podman is installed but `podman info` fails"
    if not Path(BUSYBOX).is_file():
        return f"{BUSYBOX} not found (apt-get install busybox-static)"
    return None


def registry_missing_reason() -> str | None:
    if not Path(REGISTRY).is_file():
        return f"{REGISTRY} not found (apt-get install docker-registry)"
    return None


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT

    def has_manifest(self, name: str, tag: str) -> bool:
        request = urllib.request.Request(
            f"http://{self.host}/v2/{name}/manifests/{tag}",
            method="HEAD",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.docker.distribution.manifest.v2+json"
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return False


def start_registry(
    root: Path, *, read_only: bool = False, user: tuple[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a registry storing under `root`; returns the process and its host:port. With
    `user` (name, password), it answers only requests with those credentials."""
    port = free_port("127.0.0.1")
    maintenance = "  maintenance:\n    readonly:\n      enabled: true\n" if read_only else ""
    (root / "data").mkdir(parents=True, exist_ok=True)
    auth = ""
    if user is not None:
        import bcrypt  # (paramiko's dependency) the registry's htpasswd takes bcrypt only

        hashed = bcrypt.hashpw(user[1].encode(), bcrypt.gensalt(rounds=5)).decode()
        (root / "htpasswd").write_text(f"{user[0]}:{hashed}\n")
        auth = f"auth:\n  htpasswd:\n    realm: trainctl-test\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"{maintenance}"
        f"{auth}"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = open(root / "registry.log", "wb")  # noqa: SIM115 - closed by the child's exit
    # (the registry reads REGISTRY_* variables as settings: podman's REGISTRY_AUTH_FILE too)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc = subprocess.Popen(
        [REGISTRY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    log.close()
    host = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"docker-registry exited: {(root / 'registry.log').read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://{host}/v2/", timeout=2):
                return proc, host
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # up, and asking for the credentials it was given
                return proc, host
            time.sleep(0.05)
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError("docker-registry did not answer within 20 s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _running_registry(root: Path, **options: Any) -> Iterator[Registry]:
    """A registry (start_registry's `options`) for as long as the caller's fixture lasts."""
    require(registry_missing_reason(), "registry")
    proc, host = start_registry(root, **options)
    try:
        yield Registry(host)
    finally:
        stop_process(proc)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    yield from _running_registry(tmp_path / "registry")


@pytest.fixture(scope="module")
def module_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry for a file's tests (each pushes to a repository of its own): a torch-
    sized base layer pushed by one test is then mounted, not uploaded again, by the next
    (podman's push of it costs ~24 CPU-s; the mount 0.1)."""
    yield from _running_registry(tmp_path_factory.mktemp("registry"))


@pytest.fixture
def private_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A registry that wants credentials (alice / REGISTRY_PASSWORD), and an auth file of
    the test's own for the engine's login."""
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "registry-auth.json"))
    root = tmp_path / "registry-private"
    yield from _running_registry(root, user=("alice", REGISTRY_PASSWORD))


REGISTRY_PASSWORD = "not-a-real-s3cret"


@pytest.fixture
def readonly_registry(tmp_path: Path) -> Iterator[Registry]:
    yield from _running_registry(tmp_path / "registry-ro", read_only=True)


@pytest.fixture
def podman_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """podman with its image storage in tmp (every podman this test runs inherits it)."""
    require(podman_missing_reason(), "podman")
    root = tmp_path / "podman"
    conf = root / "storage.conf"
    root.mkdir()
    conf.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "graph"}"\nrunroot = "{root / "run"}"\n'
    )
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(conf))
    try:
        yield root
    finally:
        # vfs keeps every image as plain files under root (no mounts): deleting the directory
        # deletes them all, and no podman command can reach the machine's own storage here
        shutil.rmtree(root, ignore_errors=True)


def import_busybox_image(tmp_path: Path, reference: str) -> str:
    """A tiny base image (busybox only, ~1 MB) imported into the current podman storage."""
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        for name in ("bin", "tmp", "opt"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    subprocess.run(
        ["podman", "import", str(rootfs), reference], capture_output=True, timeout=60, check=True
    )
    rootfs.unlink()
    return reference
