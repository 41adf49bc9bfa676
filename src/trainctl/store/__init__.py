"""Stores: one interface over file:// directories and s3:// buckets.

Importing this package never imports boto3 (S3Store imports it on first use), so the CLI and
spec validation stay fast and work without the `aws` extra.
"""

from __future__ import annotations

from pathlib import Path

from trainctl.spec.uris import parse_uri, validate_uri
from trainctl.store.base import ObjectInfo, Store
from trainctl.store.local import LocalStore
from trainctl.store.s3 import S3Store

__all__ = [
    "ObjectInfo",
    "Store",
    "LocalStore",
    "S3Store",
    "default_store",
    "open_store",
    "parse_uri",
    "validate_uri",
]


def open_store(uri: str, *, field: str = "uri", pinned: bool = False) -> Store:
    """The store for a `file://` / `s3://` URI or a plain filesystem path (`pinned`: a
    folder that must stay the one it was at its first use; see LocalStore)."""
    scheme, rest = parse_uri(uri, field)
    if scheme == "s3":
        return S3Store(f"s3://{rest}")
    return LocalStore(Path(rest), pinned=pinned)


def default_store() -> Store:
    """The store of this machine's configuration (TRAINCTL_STORE / config.yaml's `store`,
    else the home's file store)."""
    from trainctl.spec.settings import get_settings

    return open_store(get_settings().store_uri, field="TRAINCTL_STORE")
