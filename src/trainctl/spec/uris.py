"""Store locations as users write them: file:// and s3:// URIs, plain paths, and the rule
every object key follows. Pure parsing (no I/O): the spec validates its URIs with it before
anything runs, and every store backend names its objects with it."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

from trainctl.errors import SpecError, StoreError


def clean_key(key: str, *, allow_empty: bool = False) -> str:
    """Normalise a '/'-separated key and reject keys that could escape the store root.

    Shared by every backend so that a key means the same thing on file:// and s3://: empty and
    '.' components are dropped, '..' components and absolute keys are refused (on a local disk
    they would reach outside the root; on S3 they would silently name a different object).
    """
    if "\x00" in key:
        raise StoreError(f"invalid key {key!r}: contains a NUL character")
    if key.startswith("/"):
        raise StoreError(f"invalid key {key!r}: keys are relative to the store root")
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StoreError(f"invalid key {key!r}: '..' would escape the store root")
    if not parts and not allow_empty:
        raise StoreError("invalid key '': an object key must not be empty")
    return "/".join(parts)


# 3-63 characters of lowercase letters, digits, dots and hyphens, starting and ending with a
# letter or digit (the S3 naming rules that matter for a URI typed by a user).
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def as_uri(location: str) -> str:
    """A location as users give one (SageMaker's channels and model_uri take both): a URI
    as it is, a local path as its file:// URI."""
    if "://" in location:
        return location
    from pathlib import Path

    return Path(location).resolve().as_uri()


def split_s3_uri(uri: str, field: str = "uri") -> tuple[str, str]:
    """`s3://bucket/a/b/` -> ("bucket", "a/b"). Raises SpecError naming `field`."""
    if not uri.startswith("s3://"):
        raise SpecError(field, f"{uri!r} is not an s3:// URI; use s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise SpecError(
            field,
            f"invalid S3 bucket name {bucket!r} in {uri!r}; bucket names are 3-63 lowercase "
            "letters, digits, '.' or '-', starting and ending with a letter or digit",
        )
    try:
        prefix = clean_key(prefix, allow_empty=True)
    except StoreError as exc:
        raise SpecError(field, f"invalid S3 prefix in {uri!r}: {exc}") from None
    return bucket, prefix


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
    if "?" in rest or "#" in rest:
        # A URI's query or fragment would otherwise become part of a directory's or an
        # object's name ('out?x=1#frag'), silently.
        raise SpecError(field, f"{uri!r} has a query or fragment ('?' or '#'); {_HINT}")
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
