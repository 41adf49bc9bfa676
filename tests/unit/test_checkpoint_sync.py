"""Checkpoint sync between node dirs and the store: manifest last, union restore, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import zip_bytes
from trainctl.node.checkpoints import CheckpointSync, manifest_key, restore, scan, stored_files
from trainctl.store import LocalStore


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def test_scan_skips_files_being_written(tmp_path):
    write(tmp_path / "step-1/state.pt", "a")
    write(tmp_path / "step-1/rank-0.pt.tmp", "partial")
    write(tmp_path / "step-2.tmp/state.pt", "partial dir")
    assert set(scan(tmp_path)) == {"step-1/state.pt"}


def test_manifest_lists_only_uploaded_files_and_is_written_last(tmp_path, store):
    local = tmp_path / "node0"
    write(local / "step-1/state.pt", "s1")
    order: list[str] = []
    real_put_file, real_put_bytes = store.put_file, store.put_bytes
    store.put_file = lambda key, path: (order.append(key), real_put_file(key, path))[1]
    store.put_bytes = lambda key, data: (order.append(key), real_put_bytes(key, data))[1]
    sync = CheckpointSync(store, local, 0, interval=60, log=print)
    assert sync.sync_once() == 1
    assert order == ["step-1/state.pt", manifest_key(0)]
    assert json.loads(store.get_text(manifest_key(0)))["files"] == {"step-1/state.pt": 2}
    assert sync.sync_once() == 0  # unchanged: nothing uploaded again


def test_restore_is_the_union_of_all_nodes(tmp_path, store):
    node0, node1 = tmp_path / "n0", tmp_path / "n1"
    write(node0 / "step-5/state.pt", "model")
    write(node0 / "step-5/rank-0.pt", "rng0")
    write(node0 / "step-5/meta.json", "{}")
    write(node1 / "step-5/rank-1.pt", "rng1")
    CheckpointSync(store, node0, 0, interval=60, log=print).sync_once()
    CheckpointSync(store, node1, 1, interval=60, log=print).sync_once()
    # an object that no manifest lists (an upload that never finished) is not restored
    store.put_text("step-6/state.pt", "orphan")
    fresh = tmp_path / "fresh"
    known = restore(store, fresh, log=print)
    assert set(scan(fresh)) == {
        "step-5/state.pt",
        "step-5/rank-0.pt",
        "step-5/meta.json",
        "step-5/rank-1.pt",
    }
    assert (fresh / "step-5/rank-1.pt").read_text() == "rng1"
    # restored files are known to be stored: a sync right after uploads nothing
    assert CheckpointSync(store, fresh, 0, interval=60, log=print, known=known).sync_once() == 0


def test_pruned_files_are_deleted_after_the_manifest(tmp_path, store):
    local = tmp_path / "n0"
    write(local / "step-1/state.pt", "1")
    write(local / "step-2/state.pt", "2")
    sync = CheckpointSync(store, local, 0, interval=60, log=print)
    sync.sync_once()
    (local / "step-1/state.pt").unlink()
    sync.sync_once()
    assert not store.exists("step-1/state.pt")
    assert set(stored_files(store, print)) == {"step-2/state.pt"}


def _steps(local: Path, rank: int, steps: range) -> None:
    """What a Checkpointer(keep=3) leaves on a node: its rank's files of the last 3 steps."""
    for old in local.glob("step-*"):
        if int(old.name.split("-")[1]) not in steps[-3:]:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    for step in steps[-3:]:
        write(local / f"step-{step}/rank-{rank}.pt", f"{step}")


def test_a_prune_waits_until_the_other_nodes_stored_newer_state(tmp_path, store, monkeypatch):
    """Node 1's uploads fall behind (a store outage, a slow link) while node 0 goes on and
    prunes: the files of the steps node 1 stored stay, so that a relaunch after node 1 is
    lost finds a step complete across ranks, not nothing (a restart from scratch)."""
    import trainctl.node.checkpoints as checkpoints

    monkeypatch.setattr(checkpoints, "PRUNE_CHECK_SECONDS", 0.0)
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    syncs = [CheckpointSync(store, nodes[r], r, interval=60, log=print, nodes=2) for r in (0, 1)]
    for rank in (0, 1):
        _steps(nodes[rank], rank, range(10, 40, 10))  # steps 10, 20, 30 on both
        syncs[rank].sync_once()
    _steps(nodes[0], 0, range(10, 70, 10))  # node 0 reaches step 60; node 1's uploads stall
    syncs[0].sync_once()
    stored = set(stored_files(store, print))
    assert {"step-30/rank-0.pt", "step-30/rank-1.pt"} <= stored, stored  # step 30: complete
    assert store.exists("step-10/rank-0.pt")
    syncs[0].sync_once()  # node 1 has still stored nothing newer: nothing leaves
    assert store.exists("step-30/rank-0.pt")

    _steps(nodes[1], 1, range(10, 70, 10))  # node 1 catches up, scanned after node 0's prune
    syncs[1].sync_once()
    syncs[0].sync_once()
    assert not store.exists("step-30/rank-0.pt")  # node 1 has stored steps 40-60
    # node 1's own prune waits for node 0's next copy (its next checkpoint) ...
    assert store.exists("step-30/rank-1.pt")
    for rank in (0, 1):
        _steps(nodes[rank], rank, range(10, 80, 10))
        syncs[rank].sync_once()
    syncs[1].sync_once()
    assert not store.exists("step-30/rank-1.pt")
    # ... and at the end of a training that succeeded, nothing pruned stays
    for rank in (0, 1):
        _steps(nodes[rank], rank, range(10, 90, 10))
        syncs[rank].close(trained=True)
    stored = set(stored_files(store, print))
    assert stored == {f"step-{s}/rank-{r}.pt" for s in (60, 70, 80) for r in (0, 1)}, stored
    assert sorted(i.key for i in store.list("") if not i.key.startswith(".trainctl")) == sorted(
        stored
    )


def test_a_prune_waits_for_a_silent_node_only_so_long(tmp_path, store, monkeypatch):
    """A node that stores nothing more (it never checkpoints, or it is gone) holds pruned
    files in the store for PRUNE_WAIT_SECONDS, not for the rest of the attempt."""
    import trainctl.node.checkpoints as checkpoints

    monkeypatch.setattr(checkpoints, "PRUNE_CHECK_SECONDS", 0.0)
    write(tmp_path / "n1" / "once.pt", "x")
    CheckpointSync(store, tmp_path / "n1", 1, interval=60, log=print, nodes=2).sync_once()
    logs: list[str] = []
    sync = CheckpointSync(store, tmp_path / "n0", 0, interval=60, log=logs.append, nodes=2)
    _steps(tmp_path / "n0", 0, range(10, 40, 10))
    sync.sync_once()
    _steps(tmp_path / "n0", 0, range(10, 50, 10))
    sync.sync_once()
    assert store.exists("step-10/rank-0.pt")
    monkeypatch.setattr(checkpoints, "PRUNE_WAIT_SECONDS", 0.0)
    sync.sync_once()
    assert not store.exists("step-10/rank-0.pt")
    assert any("1 pruned file(s) deleted from the store after 0 s" in line for line in logs)


def test_uri_without_manifests_is_taken_whole(tmp_path, store):
    """A checkpoint URI filled by the user (e.g. from an earlier job) restores completely."""
    store.put_text("step-9/state.pt", "x")
    restore(store, tmp_path / "fresh", log=print)
    assert (tmp_path / "fresh/step-9/state.pt").read_text() == "x"


def test_background_sync_and_final_flush(tmp_path, store):
    local = tmp_path / "n0"
    local.mkdir()
    sync = CheckpointSync(store, local, 0, interval=0.05, log=print).start()
    write(local / "step-1/state.pt", "1")
    sync.wake()
    write(local / "step-2/state.pt", "2")
    sync.close()  # whatever is left is flushed before close returns
    assert set(stored_files(store, print)) == {"step-1/state.pt", "step-2/state.pt"}


class OutageStore(LocalStore):
    """A local store whose writes fail while `down` is set, recording which of the two
    stores (the patient one, or its prompt one: see Store.prompt) made each write."""

    def __init__(self, root: Path, calls: list[str], down, label: str = "patient") -> None:
        super().__init__(root)
        self.calls, self.down, self.label = calls, down, label

    def prompt(self) -> OutageStore:
        return OutageStore(self.root, self.calls, self.down, "prompt")

    def put_bytes(self, key: str, data: bytes) -> None:
        self.calls.append(self.label)
        if self.down.is_set():
            from trainctl.errors import StoreError

            raise StoreError("503 SlowDown")
        super().put_bytes(key, data)


def test_background_passes_give_up_quickly_and_say_an_outage_once(tmp_path):
    """A background pass's writes go through the prompt store, so that the pass after a
    short outage finds the store back instead of a request held in a long backoff; the
    node's log says the outage once, and when it ended. The last pass is patient."""
    import threading
    import time

    calls: list[str] = []
    down = threading.Event()
    down.set()
    logs: list[str] = []
    local = tmp_path / "n0"
    write(local / "step-1/state.pt", "1")
    store = OutageStore(tmp_path / "store", calls, down)
    sync = CheckpointSync(store, local, 0, interval=0.02, log=logs.append).start()
    deadline = time.monotonic() + 10
    while calls.count("prompt") < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    down.clear()
    while not store.exists(manifest_key(0)) and time.monotonic() < deadline:
        time.sleep(0.01)  # the file went up before the outage; its manifest, after it
    write(local / "step-2/state.pt", "2")
    sync.close()
    assert set(stored_files(store, print)) == {"step-1/state.pt", "step-2/state.pt"}
    failed = [line for line in logs if line.startswith("checkpoint upload failed")]
    assert len(failed) == 1 and "503 SlowDown" in failed[0], logs
    assert any("works again after" in line for line in logs), logs
    assert set(calls[:-1]) == {"prompt"} and calls[-1] == "patient", calls


@pytest.mark.timeout(60)
def test_a_file_rewritten_with_the_same_content_is_not_uploaded_again(tmp_path, monkeypatch):
    """Incremental sync by size + hash on S3 (moto): a checkpoint file written again with the
    same bytes (a new mtime) matches the stored object's ETag, whole or multipart; one with
    new bytes of the same size does not."""
    import os

    import boto3
    from moto import mock_aws

    from trainctl.store.s3 import S3Store

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpts")
        store = S3Store("s3://ckpts/job")
        local = tmp_path / "node0"
        small, large = local / "step-1/meta.json", local / "step-1/state.pt"
        write(small, "{}")
        large.write_bytes(os.urandom(20 * 2**20))  # multipart: two 16 MiB parts
        sync = CheckpointSync(store, local, 0, interval=60, log=print)
        assert sync.sync_once() == 2
        for path in (small, large):  # the same bytes again: a new mtime only
            path.write_bytes(path.read_bytes())
            os.utime(path, ns=(1, 1))
        assert sync.sync_once() == 0 and sync.skipped == 2
        data = bytearray(large.read_bytes())
        data[-1] ^= 0xFF  # same size, other content
        large.write_bytes(bytes(data))
        assert sync.sync_once() == 1 and sync.uploads == 3
        assert store.get_bytes("step-1/state.pt") == bytes(data)


def test_a_step_pruned_between_scan_and_upload_is_not_an_error(tmp_path, store, monkeypatch):
    """The script deletes an old step while a pass uploads (Checkpointer(keep=N)): the pass
    goes on and says nothing; a file it had opened (every file is opened before the upload,
    following no link) goes up whole, and the next pass drops it from the manifest."""
    local = tmp_path / "ckpt"
    for step in ("step-1", "step-2"):
        (local / step).mkdir(parents=True)
        (local / step / "model.pt").write_bytes(step.encode())
    real_put_files = LocalStore.put_files

    def prune_first(self, items, *, workers=8):
        (local / "step-1" / "model.pt").unlink(missing_ok=True)  # the script's prune
        return real_put_files(self, items, workers=workers)

    monkeypatch.setattr(LocalStore, "put_files", prune_first)
    said: list[str] = []
    sync = CheckpointSync(store, local, 0, interval=60, log=said.append)
    assert sync.sync_once() >= 1
    assert store.get_bytes("step-2/model.pt") == b"step-2" and said == []
    monkeypatch.setattr(LocalStore, "put_files", real_put_files)
    sync.sync_once()
    listed = json.loads(store.get_text(manifest_key(0)))["files"]
    assert list(listed) == ["step-2/model.pt"]
    assert sync.sync_once() == 0  # nothing left to do: the vanished file is not retried


def test_a_step_directory_pruned_during_the_scan_is_not_an_error(tmp_path, store, monkeypatch):
    """The script's rotation deletes a whole step directory after the scan listed it and
    before it looked inside (the demo's `[Errno 2] ... checkpoints/step-000000030`): the
    pass leaves it out and says nothing."""
    import os
    import shutil

    local = tmp_path / "ckpt"
    for step in ("step-000000030", "step-000000040"):
        (local / step).mkdir(parents=True)
        (local / step / "model.pt").write_bytes(step.encode())
    real_scandir = os.scandir

    def rotating(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path).name == "step-000000030":
            shutil.rmtree(path, ignore_errors=True)  # the script's rotation, just then
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", rotating)
    said: list[str] = []
    sync = CheckpointSync(store, local, 0, interval=60, log=said.append)
    assert sync.sync_once() == 1 and said == []
    assert list(json.loads(store.get_text(manifest_key(0)))["files"]) == ["step-000000040/model.pt"]


def test_a_checkpoint_saved_in_place_and_cut_short_keeps_its_last_whole_copy(tmp_path, store):
    """A SageMaker-style script's torch.save straight into its checkpoint dir (no temp name):
    a copy caught mid-write never overwrites the stored one."""
    local = tmp_path / "n0"
    whole = zip_bytes("step 1")
    write_bytes(local / "checkpoint.pt", whole)
    logs: list[str] = []
    sync = CheckpointSync(store, local, 0, interval=60, log=logs.append)
    assert sync.sync_once() == 1
    write_bytes(local / "checkpoint.pt", zip_bytes("step 2")[:40])
    assert sync.sync_once() == 0 and logs == []
    sync.close()
    assert store.get_bytes("checkpoint.pt") == whole
    assert logs == [
        "checkpoints: checkpoint.pt was being written when the node stopped (a zip without "
        "its end record); its last whole copy is kept"
    ]


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_the_controller_is_told_each_time_checkpoints_are_stored(tmp_path, store):
    local = tmp_path / "node0"
    told: list[str] = []
    sync = CheckpointSync(store, local, 0, interval=60, log=print, on_state=lambda: told.append(1))
    local.mkdir()
    assert sync.sync_once() == 0 and told == []  # nothing saved yet
    write(local / "step-1/state.pt", "s1")
    assert sync.sync_once() == 1 and told == [1]
    write(local / "step-2/state.pt", "s2")
    write(local / "step-2/extra.pt", "e2")
    assert sync.sync_once() == 2 and told == [1, 1] and sync.stored_files == 3


@pytest.mark.parametrize(
    "manifest, says",
    [
        (b"[1, 2]", "no mapping of files"),
        (b"null", "no mapping of files"),
        (b'{"files": {"step-5/state.pt": "big"}}', "not a byte count"),
        (b'{"files": {"step-5/state.pt": -1}}', "not a byte count"),
        (b'{"files": ["step-5/state.pt"]}', "no mapping of files"),
        (b"\xff\xfe\x00binary", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_a_corrupt_manifest_is_one_line_and_nothing_stored_is_lost(tmp_path, store, manifest, says):
    """Node 1's manifest is corrupt (issue 46: a list or null was a raw AttributeError on
    the node, a size that is not a number a ValueError, a binary one silently skipped): the
    log names it in one line, and every file stored there is restored, node 0's and the
    ones only node 1's manifest listed."""
    node0 = tmp_path / "n0"
    write(node0 / "step-5/state.pt", "model")
    CheckpointSync(store, node0, 0, interval=60, log=print).sync_once()
    store.put_text("step-5/rank-1.pt", "rng1")
    store.put_bytes(manifest_key(1), manifest)
    lines: list[str] = []
    fresh = tmp_path / "fresh"
    restore(store, fresh, log=lines.append)
    assert set(scan(fresh)) == {"step-5/state.pt", "step-5/rank-1.pt"}
    corrupt = [line for line in lines if "unreadable" in line]
    assert len(corrupt) == 1 and "\n" not in corrupt[0], lines
    assert store.url(manifest_key(1)) in corrupt[0] and says in corrupt[0], corrupt


def test_a_checkpoint_swapped_for_a_link_after_the_scan_uploads_nothing_of_its_target(
    tmp_path, store, monkeypatch
):
    """A script (in its own view of the machine, where the store is hidden) saves a file,
    and once the pass has listed it swaps it, or its folder, for a link to a file it cannot
    read itself: the agent, which can, uploads nothing of it (issue 58)."""
    import trainctl.node.checkpoints as checkpoints

    secret = tmp_path / "elsewhere" / "job.json"
    secret.parent.mkdir()
    secret.write_bytes(b'{"password": "hunter2"}')
    local = tmp_path / "ckpt"
    (local / "step-1").mkdir(parents=True)
    (local / "step-1" / "model.pt").write_bytes(b"weights")
    (local / "a.pt").write_bytes(b"a")
    real_scan = checkpoints.scan

    def scan_then_swap(where):
        found = real_scan(where)
        (local / "a.pt").unlink()
        (local / "a.pt").symlink_to(secret)
        (local / "step-1" / "model.pt").rename(tmp_path / "moved.pt")
        (local / "step-1").rmdir()
        (local / "step-1").symlink_to(secret.parent, target_is_directory=True)
        (secret.parent / "model.pt").write_bytes(b'{"password": "hunter2"}')
        return found

    monkeypatch.setattr(checkpoints, "scan", scan_then_swap)
    sync = CheckpointSync(store, local, 0, interval=60, log=lambda _: None)
    sync.sync_once()
    for info in store.list(""):
        assert b"hunter2" not in store.get_bytes(info.key), info.key
