"""The Store contract, run against LocalStore and against S3Store on a local moto server.

The S3 half talks only to a ThreadedMotoServer bound to 127.0.0.1 (AWS_ENDPOINT_URL points
there, proxies are cleared, config files are blanked), so no traffic leaves the machine.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO
from trainctl.errors import NotFoundError, SpecError, StoreError
from trainctl.spec.uris import parse_uri, validate_uri
from trainctl.store import LocalStore, ObjectInfo, S3Store, Store, open_store

BUCKET = "trainctl-test"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with the AWS environment pointed at it (restored after)."""
    pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        # Anything that could send a request elsewhere (a proxy, a profile with its own
        # endpoint, an S3-specific endpoint override, IMDS) is cleared.
        for var in (
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "AWS_ENDPOINT_URL_S3",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ):
            mp.delenv(var, raising=False)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            import boto3

            boto3.session.Session().client("s3").create_bucket(Bucket=BUCKET)
            yield endpoint
        finally:
            server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    request.getfixturevalue("moto_endpoint")
    # One fresh prefix per test: the bucket is shared by the module, the objects are not.
    return S3Store(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def s3store(moto_endpoint: str) -> S3Store:
    return S3Store(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}")


def _keys(store: Store, prefix: str = "") -> list[str]:
    return [info.key for info in store.list(prefix)]


# -- the contract, on both backends -----------------------------------------------------------


def test_put_get_bytes_and_text(store: Store) -> None:
    store.put_bytes("a/b/c.bin", b"\x00\x01\x02")
    assert store.get_bytes("a/b/c.bin") == b"\x00\x01\x02"
    store.put_text("t.txt", "héllo\n")
    assert store.get_text("t.txt") == "héllo\n"
    store.put_bytes("a/b/c.bin", b"new")  # whole-object overwrite
    assert store.get_bytes("a/b/c.bin") == b"new"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""


def test_get_range(store: Store) -> None:
    store.put_bytes("log", b"0123456789")
    assert store.get_range("log", 0) == b"0123456789"
    assert store.get_range("log", 4) == b"456789"
    assert store.get_range("log", 9) == b"9"
    assert store.get_range("log", 10) == b""  # at the end
    assert store.get_range("log", 1000) == b""  # past the end
    store.put_bytes("empty", b"")
    assert store.get_range("empty", 0) == b""
    assert store.get_range("empty", 3) == b""
    with pytest.raises(NotFoundError):
        store.get_range("nope", 3)


def test_put_file_get_file(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"payload")
    store.put_file("files/src.txt", src)
    dest = tmp_path / "out" / "deep" / "dest.txt"  # parents do not exist yet
    store.get_file("files/src.txt", dest)
    assert dest.read_bytes() == b"payload"
    assert store.get_bytes("files/src.txt") == b"payload"


def test_large_file_round_trip(store: Store, tmp_path: Path) -> None:
    # Above the 8 MiB multipart threshold: S3Store uploads and downloads it in parts.
    data = os.urandom(9 * 1024 * 1024 + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store.put_file("ckpt/big.bin", src)
    assert [(i.key, i.size) for i in store.list("ckpt")] == [("ckpt/big.bin", len(data))]
    dest = tmp_path / "dl" / "big.bin"
    store.get_file("ckpt/big.bin", dest)
    assert dest.read_bytes() == data
    assert store.get_range("ckpt/big.bin", len(data) - 5) == data[-5:]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["big.bin"]  # no temp left


def test_exists(store: Store) -> None:
    assert not store.exists("x/y")
    store.put_bytes("x/y", b"1")
    assert store.exists("x/y")
    assert not store.exists("x")  # a 'directory' is not an object


def test_list_recursive_sorted_with_sizes(store: Store) -> None:
    objects = {"b/2": b"22", "a/b": b"1", "a.txt": b"333", "a/c/d": b"", "z": b"4444"}
    for key, data in objects.items():
        store.put_bytes(key, data)
    infos = list(store.list())
    assert all(isinstance(i, ObjectInfo) for i in infos)
    # Full-key order, as S3 gives it: "a.txt" < "a/b" because '.' < '/'.
    assert [i.key for i in infos] == ["a.txt", "a/b", "a/c/d", "b/2", "z"]
    assert {i.key: i.size for i in infos} == {k: len(v) for k, v in objects.items()}
    assert all(i.mtime > 0 for i in infos)
    assert _keys(store, "a") == ["a/b", "a/c/d"]
    assert _keys(store, "a/") == ["a/b", "a/c/d"]
    assert _keys(store, "a/c") == ["a/c/d"]
    assert _keys(store, "missing") == []


def test_list_prefix_is_a_directory_not_a_string_prefix(store: Store) -> None:
    store.put_bytes("jobs/a/x", b"1")
    store.put_bytes("jobs/ab/x", b"2")
    assert _keys(store, "jobs/a") == ["jobs/a/x"]
    store.delete_prefix("jobs/a")
    assert _keys(store) == ["jobs/ab/x"]


def test_list_dirs(store: Store) -> None:
    for key in ("jobs/j2/job.json", "jobs/j1/job.json", "jobs/j1/logs/0.log", "jobs/top.txt"):
        store.put_bytes(key, b"{}")
    assert store.list_dirs("jobs") == ["j1", "j2"]
    assert store.list_dirs("jobs/") == ["j1", "j2"]
    assert store.list_dirs() == ["jobs"]
    assert store.list_dirs("jobs/j1") == ["logs"]
    assert store.list_dirs("jobs/j2") == []
    assert store.list_dirs("missing") == []


def test_delete(store: Store) -> None:
    store.put_bytes("d/e/f", b"1")
    store.put_bytes("d/g", b"2")
    store.delete("d/e/f")
    assert not store.exists("d/e/f")
    assert _keys(store) == ["d/g"]
    assert store.list_dirs("d") == []  # the emptied 'directory' is gone on both backends
    store.delete("d/e/f")  # missing: no error
    store.delete("never/was")
    with pytest.raises(NotFoundError):
        store.get_bytes("d/e/f")


def test_delete_prefix(store: Store) -> None:
    for i in range(5):
        store.put_bytes(f"run/{i}/data", b"x")
    store.put_bytes("keep/me", b"y")
    store.delete_prefix("run")
    assert _keys(store) == ["keep/me"]
    store.delete_prefix("run")  # nothing left: no error


def test_append_bytes(store: Store) -> None:
    store.append_bytes("logs/0.log", b"line 1\n")  # created when missing
    store.append_bytes("logs/0.log", b"line 2\n")
    store.append_bytes("logs/0.log", b"")
    assert store.get_bytes("logs/0.log") == b"line 1\nline 2\n"
    assert store.get_range("logs/0.log", 7) == b"line 2\n"


def test_appends_from_threads_of_one_process_all_land(store: Store) -> None:
    """A controller appends events from more than one thread (its main loop, its machine
    watcher): on S3 an append is a read-modify-write, and none may overwrite another."""
    import threading

    def append(n: int) -> None:
        for i in range(5):
            store.append_bytes("events.jsonl", f"{n}.{i}\n".encode())

    threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    lines = store.get_text("events.jsonl").splitlines()
    assert sorted(lines) == sorted(f"{n}.{i}" for n in range(4) for i in range(5))


def test_missing_raises_not_found(store: Store, tmp_path: Path) -> None:
    url = store.url("no/such")
    for call in (
        lambda: store.get_bytes("no/such"),
        lambda: store.get_text("no/such"),
        lambda: store.get_range("no/such", 0),
        lambda: store.get_file("no/such", tmp_path / "dl" / "f"),
    ):
        with pytest.raises(NotFoundError) as exc_info:
            call()
        assert str(exc_info.value) == f"{url} does not exist"
        assert isinstance(exc_info.value, (StoreError, KeyError))
    assert not (tmp_path / "dl" / "f").exists()


def test_put_if_is_a_compare_and_swap(store: Store) -> None:
    """Create only if absent; replace only at the version read; a stale version loses."""
    first = store.put_if("jobs/j/lease.json", b"one", version=None)
    assert first is not None
    assert store.put_if("jobs/j/lease.json", b"two", version=None) is None  # exists
    data, version = store.get_versioned("jobs/j/lease.json")
    assert (data, version) == (b"one", first)
    second = store.put_if("jobs/j/lease.json", b"two", version=version)
    assert second is not None and second != first
    assert store.put_if("jobs/j/lease.json", b"three", version=first) is None  # stale
    assert store.get_bytes("jobs/j/lease.json") == b"two"
    assert _keys(store, "jobs") == ["jobs/j/lease.json"]  # no lock file listed


def test_put_if_lets_exactly_one_of_racing_writers_win(store: Store) -> None:
    import threading

    store.put_bytes("race.json", b"stale")
    _, version = store.get_versioned("race.json")
    wins: list[str] = []
    barrier = threading.Barrier(8)

    def take(n: int) -> None:
        barrier.wait()
        if store.put_if("race.json", f"writer {n}".encode(), version=version):
            wins.append(f"writer {n}")

    threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
    assert store.get_text("race.json") == wins[0]


def test_child(store: Store) -> None:
    child = store.child("jobs/j1")
    assert child.uri == store.url("jobs/j1")
    assert type(child) is type(store)
    child.put_bytes("job.json", b"{}")
    assert store.get_bytes("jobs/j1/job.json") == b"{}"
    assert _keys(child) == ["job.json"]  # keys are relative to the child's root
    assert child.child("logs").uri == store.url("jobs/j1/logs")
    assert store.child("").uri == store.uri


@pytest.mark.parametrize("key", ["../x", "a/../../x", "a/..", "/etc/passwd", ""])
def test_bad_keys_rejected(store: Store, key: str) -> None:
    with pytest.raises(StoreError):
        store.put_bytes(key, b"x")
    with pytest.raises(StoreError):
        store.get_bytes(key)
    if key:
        with pytest.raises(StoreError):
            store.child(key)


def test_url(store: Store) -> None:
    assert not store.uri.endswith("/")
    assert store.url("a/b") == store.uri + "/a/b"
    assert store.url("") == store.uri


# -- LocalStore specifics -----------------------------------------------------------------------


def test_local_uri_and_layout(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    assert store.uri == (tmp_path / "s").resolve().as_uri()
    store.put_bytes("a/b", b"1")
    assert (tmp_path / "s" / "a" / "b").read_bytes() == b"1"


def test_local_key_escaping_root_rejected(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    for key in ("../outside", "a/../../outside", "/tmp/outside"):
        with pytest.raises(StoreError, match="invalid key"):
            store.put_bytes(key, b"x")
    with pytest.raises(StoreError):
        store.child("..")
    assert not (tmp_path / "outside").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_local_skips_temp_files_and_leaves_none(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("d/obj", b"1")
    src = tmp_path / "src"
    src.write_bytes(b"2")
    store.put_file("d/copy", src)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["copy", "obj"]
    (tmp_path / "d" / ".obj.tmp-deadbeef").write_bytes(b"partial")  # an in-progress write
    assert _keys(store, "d") == ["d/copy", "d/obj"]


def test_local_put_file_missing_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LocalStore(tmp_path / "s").put_file("k", tmp_path / "missing")


def test_local_concurrent_writes_and_deletes(tmp_path: Path) -> None:
    # delete() prunes empty parents; a concurrent put into the same directory must survive that.
    store = LocalStore(tmp_path)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(100):
                store.put_bytes(f"shared/w{n}-{i}", b"x")
                store.delete(f"shared/w{n}-{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _keys(store) == []


# -- S3Store specifics ----------------------------------------------------------------------------


def test_s3_uploads_are_encrypted_and_large_ones_multipart(
    s3store: S3Store, tmp_path: Path
) -> None:
    client = s3store.client
    s3store.put_bytes("small", b"abc")
    big = tmp_path / "big"
    big.write_bytes(os.urandom(9 * 1024 * 1024))
    s3store.put_file("big", big)
    small_head = client.head_object(Bucket=BUCKET, Key=f"{s3store.prefix}/small")
    big_head = client.head_object(Bucket=BUCKET, Key=f"{s3store.prefix}/big")
    assert small_head["ServerSideEncryption"] == "AES256"
    assert big_head["ServerSideEncryption"] == "AES256"
    assert "-" in big_head["ETag"]  # multipart ETags are '<md5>-<parts>'


def test_s3_error_is_one_line_store_error_without_secrets(moto_endpoint: str) -> None:
    store = S3Store("s3://no-such-bucket-here/p")
    with pytest.raises(StoreError) as exc_info:
        store.put_bytes("k", b"x")
    msg = str(exc_info.value)
    assert not isinstance(exc_info.value, NotFoundError)
    assert "s3://no-such-bucket-here/p/k" in msg
    assert "NoSuchBucket" in msg
    assert "\n" not in msg
    assert "testing" not in msg  # the (fake) access key and secret


def test_probe_answers_at_once_and_an_unreachable_s3_store_fails_fast(
    store: Store, monkeypatch
) -> None:
    """A reachable store probes fine (local and moto S3 alike); nothing listening at the S3
    endpoint is a one-line StoreError in seconds, not the half minute its requests retry."""
    import time

    from tests.helpers import free_port

    store.probe()
    unreachable = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in unreachable.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(StoreError) as exc_info:
        S3Store("s3://unreachable/store").probe()
    assert time.monotonic() - started < 10, "the probe retried as long as a node would"
    assert "EndpointConnectionError" in str(exc_info.value)
    assert "\n" not in str(exc_info.value)


def test_s3_root_of_bucket_and_uri_forms(moto_endpoint: str) -> None:
    root = S3Store(f"s3://{BUCKET}/")
    assert root.uri == f"s3://{BUCKET}" and root.prefix == ""
    name = f"rootobj-{uuid.uuid4().hex[:8]}"
    root.put_bytes(f"{name}/x", b"1")
    try:
        assert name in root.list_dirs()
        assert S3Store(f"s3://{BUCKET}/{name}").get_bytes("x") == b"1"
    finally:
        root.delete_prefix(name)
    assert not root.exists(f"{name}/x")


def test_s3_delete_prefix_in_batches(s3store: S3Store) -> None:
    # More than one DeleteObjects batch of 1000, put straight into the in-process server's
    # state: 1005 PUTs over HTTP were half a minute of the suite's CPU, and the test is
    # about the listing and the deletes.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    for i in range(1005):
        backend.put_object(BUCKET, f"{s3store.prefix}/many/{i:04d}", b"")
    assert len(_keys(s3store, "many")) == 1005  # and listing pages through >1000 keys
    s3store.delete_prefix("many")
    assert _keys(s3store) == []


def test_s3_client_created_once_across_threads_and_children(s3store: S3Store) -> None:
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(s3store.client)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 1
    assert s3store.child("x").client is seen[0]


def test_s3_store_pickles_without_its_client(s3store: S3Store) -> None:
    s3store.put_bytes("k", b"v")
    copy = pickle.loads(pickle.dumps(s3store))
    assert copy == s3store
    assert copy.get_bytes("k") == b"v"


def test_a_prompt_s3_store_retries_once_and_shares_its_client(s3store: S3Store) -> None:
    """Store.prompt: the same objects through a client that retries once, without adaptive
    mode's client-side rate limiting (which, after a burst of 503s, holds later requests
    back); one such client per patient one, kept by its children and copies."""
    prompt = s3store.prompt()
    assert prompt.uri == s3store.uri
    prompt.put_bytes("p", b"v")
    assert s3store.get_bytes("p") == b"v"
    retries = prompt.client.meta.config.retries
    assert (retries["mode"], retries["total_max_attempts"]) == ("standard", 2)
    assert s3store.client.meta.config.retries["mode"] == "adaptive"
    assert s3store.child("x").prompt().client is prompt.client
    assert prompt.prompt().client is prompt.client
    copy = pickle.loads(pickle.dumps(prompt))
    assert copy.client.meta.config.retries["total_max_attempts"] == 2


# -- URIs ---------------------------------------------------------------------------------------


def test_open_store_file_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "dir with space"
    by_uri = open_store(target.as_uri())  # percent-encoded space round-trips
    assert isinstance(by_uri, LocalStore) and by_uri.root == target.resolve()
    assert open_store(str(target)).uri == by_uri.uri
    assert open_store(f"file://localhost{target}").uri == by_uri.uri
    assert open_store(f"file:{target}").uri == by_uri.uri
    monkeypatch.chdir(tmp_path)
    assert open_store("dir with space").uri == by_uri.uri  # relative path
    assert open_store("./dir with space/").uri == by_uri.uri
    assert parse_uri("rel/dir") == ("file", str(tmp_path / "rel" / "dir"))
    assert parse_uri("/abs/x") == ("file", "/abs/x")
    assert parse_uri("file:///abs/x") == ("file", "/abs/x")


def test_open_store_s3_forms() -> None:
    # No client is built (no network) until the store is used.
    store = open_store("s3://my-bucket/some/prefix/")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.uri) == (
        "my-bucket",
        "some/prefix",
        "s3://my-bucket/some/prefix",
    )
    assert open_store("s3://my.bucket-1").uri == "s3://my.bucket-1"
    assert parse_uri("s3://my-bucket") == ("s3", "my-bucket")
    assert parse_uri("s3://my-bucket/a/b") == ("s3", "my-bucket/a/b")


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("ftp://x", "unsupported URI scheme 'ftp'; use file:// or s3://"),
        ("gs://bucket/x", "unsupported URI scheme 'gs'"),
        ("https://example.com/x", "unsupported URI scheme 'https'"),
        ("s3://", "invalid S3 bucket name"),
        ("s3://ab", "invalid S3 bucket name"),
        ("s3://My_Bucket/x", "invalid S3 bucket name"),
        ("s3://-bucket/x", "invalid S3 bucket name"),
        ("s3://" + "a" * 64, "invalid S3 bucket name"),
        ("s3://bucket/../x", "invalid S3 prefix"),
        ("s3:bucket/x", "s3://bucket/prefix"),
        ("file://remotehost/x", "names host"),
        ("file:relative", "not absolute"),
        ("", "non-empty"),
    ],
)
def test_bad_uris_raise_spec_error_naming_the_field(uri: str, needle: str) -> None:
    for call in (
        lambda: open_store(uri, field="output_path"),
        lambda: parse_uri(uri, field="output_path"),
        lambda: validate_uri(uri, "output_path"),
    ):
        with pytest.raises(SpecError) as exc_info:
            call()
        assert exc_info.value.field == "output_path"
        msg = str(exc_info.value)
        assert msg.startswith("output_path: ")
        assert needle in msg
        assert "\n" not in msg


def test_valid_uris_pass_validation() -> None:
    for uri in ("s3://abc", "s3://a.b-c/x/y", "file:///x", "/x/y", "rel", "~/store"):
        validate_uri(uri, "inputs.train")


def test_import_does_not_import_boto3() -> None:
    code = "import sys, trainctl.store; assert 'boto3' not in sys.modules, 'boto3 imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
