"""A store under an S3 prefix (s3://bucket/prefix).

boto3 is imported only inside methods: `import trainctl.store` must stay cheap and must work
without the `aws` extra installed. The client honours the standard AWS environment (credentials,
region, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for S3-compatible servers, proxies); nothing here
names an endpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.errors import NotFoundError, StoreError
from trainctl.spec.uris import clean_key, split_s3_uri
from trainctl.store.base import ObjectInfo, Progress, Store

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_MULTIPART_THRESHOLD = 8 * 1024 * 1024
# Bulk uploads (a checkpoint's files): requests in flight and part size. Measured on the
# upload bench (1 GiB, 787 files, moto on loopback): 16 threads and 16 MiB parts (see
# docs/benchmarks.md).
BULK_CONCURRENCY = 16
BULK_PART_SIZE = 16 * 1024 * 1024
_DELETE_BATCH = 1000  # the DeleteObjects maximum
_SSE = {"ServerSideEncryption": "AES256"}
# An append is a read-modify-write: two threads of one process appending to one object (the
# controller's main thread and its machine watcher both record events) would lose a line. A
# fixed set of locks, an object's by its name's hash: bounded however many objects a
# long-lived controller appends to (keys that share a lock only wait for each other).
_APPEND_LOCKS = tuple(threading.Lock() for _ in range(64))


def _append_lock(bucket: str, key: str) -> threading.Lock:
    return _APPEND_LOCKS[hash((bucket, key)) % len(_APPEND_LOCKS)]


def local_etag(path: Path, size: int) -> str:
    """The ETag S3 gives `path` uploaded by `S3Store.put_files`: the MD5 of the content, or
    for a multipart upload (from _MULTIPART_THRESHOLD on, BULK_PART_SIZE parts) the MD5 of
    the parts' MD5s and the part count."""
    import hashlib

    with open(path, "rb") as f:
        if size < _MULTIPART_THRESHOLD:
            return hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
        digests = []
        while chunk := f.read(BULK_PART_SIZE):
            digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f"{combined}-{len(digests)}"


class _ClientHolder:
    """One lazily created boto3 client, shared by a store and the children it hands out.

    boto3 clients are thread-safe once built, but building one from the default session is not,
    so creation is guarded by a lock and goes through a private Session.
    """

    def __init__(self, *, prompt: bool = False) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self.prompt = prompt
        self._prompt: _ClientHolder | None = None

    def get(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from botocore.config import Config

                    from trainctl.store.boto import new_session

                    if self.prompt:  # see Store.prompt: one retry, no client-side limiter
                        retries = {"mode": "standard", "total_max_attempts": 2}
                    else:
                        # Adaptive mode retries throttling (SlowDown/503) with client-side
                        # rate limiting, which matters when many nodes upload at once.
                        retries = {"mode": "adaptive", "max_attempts": 10}
                    config = Config(retries=retries)  # type: ignore[arg-type]
                    self._client = new_session().client("s3", config=config)
        return self._client

    def prompt_holder(self) -> _ClientHolder:
        """The holder of the prompt client beside this one (one per patient client)."""
        if self.prompt:
            return self
        with self._lock:
            if self._prompt is None:
                self._prompt = _ClientHolder(prompt=True)
            return self._prompt

    # Clients hold sockets and locks and are not fork/pickle-safe: a copy starts without one.
    def __getstate__(self) -> dict[str, Any]:
        return {"prompt": self.prompt}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(prompt=bool(state.get("prompt")))  # type: ignore[misc]


class S3Store(Store):
    """Objects are S3 objects under `s3://bucket/prefix/`; 'directories' are key prefixes."""

    def __init__(
        self,
        uri: str,
        *,
        _clients: _ClientHolder | None = None,
        kms_key: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        from urllib.parse import urlencode

        self.bucket, self.prefix = split_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._clients = _clients or _ClientHolder()
        # What every write adds: server-side encryption (S3's own keys, or this KMS key) and
        # object tags (SageMaker's output_kms_key and tags: the job's outputs only)
        self.kms_key, self.tags = kms_key, dict(tags or {})
        self._sse: dict[str, str] = (
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key} if kms_key else dict(_SSE)
        )
        if self.tags:
            self._sse["Tagging"] = urlencode(self.tags)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Store) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(("s3", self.uri))

    @property
    def client(self) -> Any:
        return self._clients.get()

    def child(self, prefix: str) -> S3Store:
        clean = clean_key(prefix, allow_empty=True)
        return S3Store(
            self.url(clean), _clients=self._clients, kms_key=self.kms_key, tags=self.tags
        )

    def prompt(self) -> S3Store:
        holder = self._clients.prompt_holder()
        return S3Store(self.uri, _clients=holder, kms_key=self.kms_key, tags=self.tags)

    def writing_with(self, *, kms_key: str | None, tags: dict[str, str]) -> S3Store:
        return S3Store(self.uri, _clients=self._clients, kms_key=kms_key, tags=tags)

    # -- keys -------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        clean = clean_key(key)
        return f"{self.prefix}/{clean}" if self.prefix else clean

    def _dir_prefix(self, prefix: str) -> str:
        """The S3 Prefix for a 'directory': always ends in '/' so "jobs/a" never matches
        "jobs/ab/..." (same path-component semantics as LocalStore)."""
        clean = clean_key(prefix, allow_empty=True)
        full = "/".join(p for p in (self.prefix, clean) if p)
        return f"{full}/" if full else ""

    @property
    def _root_strip(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    @staticmethod
    def _transfer_config() -> TransferConfig:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=_MULTIPART_THRESHOLD, max_concurrency=10)

    # -- error mapping ----------------------------------------------------------------------

    @contextmanager
    def _errors(self, key: str, op: str) -> Iterator[None]:
        """Map boto errors to NotFoundError / one-line StoreError.

        Messages name the URI, the operation and the S3 error code only: S3's free-text
        messages and request details are left out so no request signature or key id leaks.
        """
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        url = self.url(key)
        try:
            yield
        except ClientError as exc:
            raise self._client_error(url, op, exc) from None
        except S3UploadFailedError as exc:
            # upload_file wraps the ClientError it hit; report that one's code.
            cause = exc.__context__
            if isinstance(cause, ClientError):
                raise self._client_error(url, op, cause) from None
            raise StoreError(f"{url}: {op} failed (upload error)") from exc
        except BotoCoreError as exc:
            # e.g. EndpointConnectionError, NoCredentialsError, ReadTimeoutError: their messages
            # name endpoints or settings, never secrets.
            detail = " ".join(str(exc).split())
            raise StoreError(f"{url}: {op} failed ({type(exc).__name__}: {detail})") from exc

    @staticmethod
    def _client_error(url: str, op: str, exc: Any) -> StoreError:
        code = str(exc.response.get("Error", {}).get("Code", "") or "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _NOT_FOUND_CODES:
            return NotFoundError(f"{url} does not exist")
        return StoreError(f"{url}: {op} failed ({code or 'error'}, HTTP {status})")

    @staticmethod
    def _is_invalid_range(exc: Any) -> bool:
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return err.get("Code") == "InvalidRange" or status == 416

    # -- writes -----------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._key(key)
        with self._errors(key, "put"):
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **self._sse)

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        full = self._key(key)
        src = Path(path)
        if not src.is_file():
            raise FileNotFoundError(f"{src} is not a file")
        with self._errors(key, "upload"):
            # s3transfer switches to a parallel multipart upload above the threshold; S3 only
            # makes the object visible once the upload completes, so the write stays atomic.
            self.client.upload_file(
                str(src),
                self.bucket,
                full,
                ExtraArgs=dict(self._sse),
                Config=self._transfer_config(),
                Callback=progress,
            )

    def put_request(self, key: str) -> tuple[dict[str, str], dict[str, object]]:
        return {"service": "s3", "operation": "PutObject"}, {
            "Bucket": self.bucket,
            "Key": self._key(key),
        }

    def matches(self, key: str, path: Path) -> bool:
        """Compare S3's ETag (MD5 of the content, or of the MD5s of its parts for a
        multipart upload) with the same hash of the local file, as `put_files` would have
        uploaded it. A different part size or encryption just reads as "changed"."""
        try:
            with self._errors(key, "head"):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except (NotFoundError, StoreError):
            return False
        size = Path(path).stat().st_size
        if int(head.get("ContentLength", -1)) != size:
            return False
        return str(head.get("ETag", "")).strip('"') == local_etag(Path(path), size)

    def put_files(self, items: list[tuple[str, Path]], *, workers: int = 8) -> None:
        """Every file through one s3transfer TransferManager on the store's one client: the
        parts of all files share `BULK_CONCURRENCY` request threads (a manager per file made
        a pool of 10 threads per file, 80 at once for 8 files, and scheduled files, not
        parts). The threads start from the calling thread and share its CPU priority."""
        from s3transfer.manager import TransferManager

        for _, path in items:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{path} is not a file")
        config = self._transfer_config()
        config.max_request_concurrency = BULK_CONCURRENCY
        config.multipart_chunksize = BULK_PART_SIZE
        with TransferManager(self.client, config) as manager:
            futures = [
                (key, manager.upload(str(path), self.bucket, self._key(key), dict(self._sse)))
                for key, path in items
            ]
            for key, future in futures:
                with self._errors(key, "upload"):
                    future.result()

    def append_bytes(self, key: str, data: bytes) -> None:
        # S3 has no append: read-modify-write. Safe because the contract is one writing
        # process per key (and, within it, one append at a time); objects appended to (logs,
        # events) stay small enough that rewriting them is cheap.
        with _append_lock(self.bucket, self._key(key)):
            try:
                old = self.get_bytes(key)
            except NotFoundError:
                old = b""
            self.put_bytes(key, old + data)

    # -- compare and swap --------------------------------------------------------------------

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        full = self._key(key)
        with self._errors(key, "get"):
            resp = self.client.get_object(Bucket=self.bucket, Key=full)
            return resp["Body"].read(), str(resp["ETag"])

    def put_if(self, key: str, data: bytes, *, version: str | None) -> str | None:
        """S3 conditional writes: If-None-Match: * to create, If-Match: <etag> to replace."""
        from botocore.exceptions import ClientError

        full = self._key(key)
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        with self._errors(key, "put"):
            try:
                resp = self.client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, **condition, **self._sse
                )
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = exc.response.get("Error", {}).get("Code")
                # 412: the condition failed; 409: a concurrent conditional write won; 404:
                # If-Match on an object that is gone.
                if status in (409, 412) or code in ("PreconditionFailed", *_NOT_FOUND_CODES):
                    return None
                raise
        return str(resp["ETag"])

    # -- reads ------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        full = self._key(key)
        with self._errors(key, "get"):
            resp = self.client.get_object(Bucket=self.bucket, Key=full)
            return resp["Body"].read()

    def get_range(self, key: str, start: int) -> bytes:
        if start < 0:
            raise ValueError(f"get_range start must be >= 0, got {start}")
        if start == 0:
            return self.get_bytes(key)  # a range on an empty object would be a 416
        from botocore.exceptions import ClientError

        full = self._key(key)
        with self._errors(key, "get"):
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={start}-")
            except ClientError as exc:
                # S3 answers 416 when start is at or past the end: nothing new to read.
                if self._is_invalid_range(exc):
                    return b""
                raise
            return resp["Body"].read()

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        full = self._key(key)
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._errors(key, "download"):
            # s3transfer downloads to a temp name beside `dest` and renames it into place, so
            # `dest` is never seen half-written.
            self.client.download_file(
                self.bucket, full, str(dest), Config=self._transfer_config(), Callback=progress
            )

    def exists(self, key: str) -> bool:
        full = self._key(key)
        try:
            with self._errors(key, "head"):
                self.client.head_object(Bucket=self.bucket, Key=full)
        except NotFoundError:
            return False
        return True

    def info(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        try:
            with self._errors(key, "head"):
                head = self.client.head_object(Bucket=self.bucket, Key=full)
        except NotFoundError:
            return None
        return ObjectInfo(
            key=full[len(self._root_strip) :],
            size=int(head["ContentLength"]),
            mtime=head["LastModified"].timestamp(),
        )

    # -- listing ----------------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        s3_prefix = self._dir_prefix(prefix)
        strip = len(self._root_strip)
        with self._errors(prefix, "list"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_prefix
            )
            # S3 returns keys in UTF-8 byte order, which equals Python's str order: no sort.
            for page in pages:
                for obj in page.get("Contents", []):
                    key: str = obj["Key"]
                    if key.endswith("/"):
                        continue  # a console-made 'folder' marker, not an object
                    yield ObjectInfo(
                        key=key[strip:],
                        size=int(obj["Size"]),
                        mtime=obj["LastModified"].timestamp(),
                    )

    def list_dirs(self, prefix: str = "") -> list[str]:
        s3_prefix = self._dir_prefix(prefix)
        names: set[str] = set()
        with self._errors(prefix, "list"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_prefix, Delimiter="/"
            )
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    name = common["Prefix"][len(s3_prefix) :].rstrip("/")
                    if name:
                        names.add(name)
        return sorted(names)

    def probe(self, prefix: str = "jobs") -> bool:
        """One listing with two tries and a short connect timeout (see Store.probe)."""
        from botocore.config import Config

        from trainctl.store.boto import new_session

        config = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5)
        client = new_session().client("s3", config=config)
        with self._errors(prefix, "list"):
            listed = client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._dir_prefix(prefix), MaxKeys=1
            )
        return bool(listed.get("KeyCount"))

    # -- deletes ----------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        full = self._key(key)
        with self._errors(key, "delete"):
            self.client.delete_object(Bucket=self.bucket, Key=full)  # missing: S3 says 204

    def delete_prefix(self, prefix: str) -> None:
        # One DeleteObjects call per 1000 keys instead of one request per object.
        strip = self._root_strip
        batch: list[str] = []
        for info in self.list(prefix):
            batch.append(strip + info.key)
            if len(batch) == _DELETE_BATCH:
                self._delete_batch(prefix, batch)
                batch = []
        if batch:
            self._delete_batch(prefix, batch)

    def _delete_batch(self, prefix: str, keys: list[str]) -> None:
        with self._errors(prefix, "delete"):
            resp = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
            )
        errors = resp.get("Errors") or []
        if errors:
            first = errors[0]
            raise StoreError(
                f"{self.url(prefix)}: delete failed for {len(errors)} object(s) "
                f"(first: {first.get('Key')}: {first.get('Code')})"
            )
