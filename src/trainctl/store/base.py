"""One store interface over file:// directories and s3:// buckets.

Keys are '/'-separated paths relative to the store's root URI. Writes of whole objects are
atomic: a reader sees the old object or the new one, never a partial one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[int], None]  # called with a number of bytes just transferred


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store root
    size: int
    mtime: float  # seconds since the epoch


class Store(ABC):
    """A place for job records, sources, logs, checkpoints and outputs."""

    uri: str  # root URI, no trailing slash

    def url(self, key: str) -> str:
        return f"{self.uri}/{key.lstrip('/')}" if key else self.uri

    def child(self, prefix: str) -> Store:
        """The same store rooted one level deeper."""
        raise NotImplementedError

    def writing_with(self, *, kms_key: str | None, tags: dict[str, str]) -> Store:
        """The same store, its writes encrypted with this KMS key and tagged with these tags
        where the store can (S3); a file:// store is the machine's disk, and itself."""
        return self

    def prompt(self) -> Store:
        """The same store for work that runs again on its own schedule (a node's status
        every heartbeat, its log copy, a sync pass): a request gives up after a retry or
        two instead of backing off for up to half a minute, so that the next round, a
        second later, finds the store back. (A request held in a long backoff when a short
        outage ends is what leaves a node's status and checkpoints in the store many
        seconds behind it.) A store without such retries is its own prompt one."""
        return self

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Raises NotFoundError when the key does not exist."""

    @abstractmethod
    def get_range(self, key: str, start: int) -> bytes:
        """Bytes from offset `start` to the end (b'' when start is at or past the end)."""

    @abstractmethod
    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        """Upload `path`; `progress(n)` is called with each n bytes sent."""

    def put_request(self, key: str) -> tuple[dict[str, str], dict[str, object]]:
        """For a dry run: the call `put_file(key, ...)` would make, as ({"service",
        "operation"}, params)."""
        return {"service": "store", "operation": "PutFile"}, {"uri": self.url(key)}

    def matches(self, key: str, path: Path) -> bool:
        """Whether the stored object `key` has the content of `path` (checked by content
        hash where the store can tell cheaply; False when it cannot: then upload)."""
        return False

    def put_files(self, items: list[tuple[str, Path]], *, workers: int = 8) -> None:
        """Upload many files (key, path) at once, up to `workers` at a time; stores with a
        transfer engine of their own (S3) schedule every part of every file together."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda item: self.put_file(item[0], item[1]), items))

    @abstractmethod
    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        """Download to `path` (parents created). Raises NotFoundError. `progress(n)` is
        called with each n bytes received."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def info(self, key: str) -> ObjectInfo | None:
        """The object `key` (size, time), or None when there is no such object."""
        if not self.exists(key):
            return None
        parent = key.rsplit("/", 1)[0] if "/" in key else ""
        return next((i for i in self.list(parent) if i.key == key), None)

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under `prefix` (recursively), sorted by key."""

    @abstractmethod
    def list_dirs(self, prefix: str = "") -> list[str]:
        """Names of the immediate 'sub-directories' under `prefix`."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; missing is not an error."""

    @abstractmethod
    def append_bytes(self, key: str, data: bytes) -> None:
        """Append to an object (created if missing). One writing process per key; within
        it, appends from several threads each land whole (the store serializes them)."""

    @abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """(data, version) of an object: the version `put_if` compares. NotFoundError."""

    @abstractmethod
    def put_if(self, key: str, data: bytes, *, version: str | None) -> str | None:
        """Compare and swap: write only if the object is still at `version` (None: only if it
        does not exist). The new version, or None when another writer got there first."""

    def probe(self, prefix: str = "jobs") -> bool:
        """Raise StoreError now if the store cannot be read: for a person waiting at a
        command's start. (An S3 store's own requests retry for about half a minute, which
        carries nodes through a short outage but is too long to learn of a wrong endpoint.)
        Returns whether anything is stored under `prefix`."""
        return bool(self.list_dirs(prefix)) or any(True for _ in self.list(prefix))

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode())

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode()

    def delete_prefix(self, prefix: str) -> None:
        for info in list(self.list(prefix)):
            self.delete(info.key)
