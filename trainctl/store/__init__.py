"""Stores: one interface over file:// directories and s3:// buckets.

Importing this package never imports boto3 (S3Store imports it on first use), so the CLI and
spec validation stay fast and work without the `aws` extra.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from trainctl.errors import SpecError
from trainctl.store.base import ObjectInfo, Store
from trainctl.store.local import LocalStore
from trainctl.store.s3 import S3Store, split_s3_uri

__all__ = [
    "ObjectInfo",
    "Store",
    "LocalStore",
    "S3Store",
    "open_store",
    "parse_uri",
    "validate_uri",
]

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# "s3:bucket" or "file:/abs" have no '//' but are clearly meant as URIs, not relative paths.
_BARE_SCHEME_RE = re.compile(r"(s3|file):", re.IGNORECASE)
_HINT = "use file:// or s3://"


def parse_uri(uri: str, field: str = "uri") -> tuple[str, str]:
    """Split a store URI into (scheme, rest), validating it.

    - `file:///abs/path` (or `file://localhost/...`, `file:/abs`) -> ("file", "/abs/path"),
      percent-decoded so that `Path.as_uri()` output round-trips;
    - `s3://bucket[/prefix]` -> ("s3", "bucket" or "bucket/prefix"), bucket name checked;
    - a plain path (absolute, relative or `~/...`) -> ("file", absolute path);
    - anything else raises SpecError naming `field`.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise SpecError(field, f"must be a non-empty path or URI; {_HINT}")
    m = _SCHEME_RE.match(uri) or _BARE_SCHEME_RE.match(uri)
    if m is None:
        # No scheme: a filesystem path. Made absolute here so the meaning does not depend on
        # the working directory of whoever opens the store later.
        return "file", os.path.abspath(os.path.expanduser(uri))
    scheme = m.group(1).lower()
    rest = uri[m.end() :]
    if scheme == "file":
        return "file", _file_path(uri, field)
    if scheme == "s3":
        if not m.group(0).endswith("//"):
            raise SpecError(field, f"{uri!r} is not a valid S3 URI; use s3://bucket/prefix")
        bucket, prefix = split_s3_uri(f"s3://{rest}", field)
        return "s3", f"{bucket}/{prefix}" if prefix else bucket
    raise SpecError(field, f"unsupported URI scheme '{m.group(1)}'; {_HINT}")


def _file_path(uri: str, field: str) -> str:
    rest = uri[len("file:") :]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        # Only the local host makes sense: file://host/... would be a remote share.
        if host not in ("", "localhost"):
            raise SpecError(
                field, f"{uri!r} names host {host!r}; use file:///absolute/path for a local store"
            )
        rest = slash + path
    if not rest.startswith("/"):
        raise SpecError(field, f"{uri!r} is not absolute; use file:///absolute/path")
    path = unquote(rest)
    if "\x00" in path:
        raise SpecError(field, f"{uri!r} contains a NUL character")
    return path


def validate_uri(uri: str, field: str = "uri") -> None:
    """Raise SpecError (naming `field`) unless `uri` is a usable store location."""
    parse_uri(uri, field)


def open_store(uri: str, *, field: str = "uri") -> Store:
    """The store for a `file://` / `s3://` URI or a plain filesystem path."""
    scheme, rest = parse_uri(uri, field)
    if scheme == "s3":
        return S3Store(f"s3://{rest}")
    return LocalStore(Path(rest))
