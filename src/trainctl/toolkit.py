"""What of trainctl ships to a node: the package's files, their content-hashed version, and
the agent's third-party dependencies.

Both ways a node gets the agent use it: uploaded to an SSH host (`transport.bootstrap`) and
copied into a built image (`image.build`). It imports only the standard library: a host
runs `agent_version()` from it to report which trainctl it has, possibly without
trainctl's dependencies installed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

# import name -> pip requirement (the ranges of pyproject.toml's dependencies)
AGENT_DEPENDENCIES = {
    "pydantic": "pydantic>=2.6,<3",
    "pydantic_settings": "pydantic-settings>=2.2",
    "yaml": "pyyaml>=6",
    "pathspec": "pathspec>=0.12",
}
S3_DEPENDENCIES = {"boto3": "boto3>=1.34"}


def package_dir() -> Path:
    """The `trainctl` package directory this module belongs to."""
    return Path(__file__).resolve().parent


def package_files(root: Path | None = None) -> list[Path]:
    """The package's files, relative and sorted (no bytecode caches: they differ per host)."""
    root = root or package_dir()
    files = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo") or not path.is_file():
            continue
        files.append(rel)
    return sorted(files, key=lambda p: p.as_posix())


def content_hash(root: Path | None = None) -> str:
    root = root or package_dir()
    digest = hashlib.sha256()
    for rel in package_files(root):
        digest.update(rel.as_posix().encode() + b"\0")
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


def agent_version(root: Path | None = None) -> str:
    """`<__version__>-<content hash>` of the trainctl package at `root` (default: this one)."""
    from trainctl.version import __version__

    return f"{__version__}-{content_hash(root)}"


def package_tarball(root: Path | None = None) -> bytes:
    """A reproducible tar.gz of the package as `trainctl/...`: same files, same bytes."""
    root = root or package_dir()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({p.parent for p in package_files(root)} - {Path(".")}, key=str)
        for rel in [Path("."), *dirs]:
            info = tarfile.TarInfo(("trainctl" / rel).as_posix())
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(_normalized(info))
        for rel in package_files(root):
            data = (root / rel).read_bytes()
            info = tarfile.TarInfo(("trainctl" / rel).as_posix())
            info.size, info.mode = len(data), 0o644
            tar.addfile(_normalized(info), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info
