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
    assert set(stored_files(store)) == {"step-2/state.pt"}


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
    assert set(stored_files(store)) == {"step-1/state.pt", "step-2/state.pt"}


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
    goes on without it, says nothing, and the manifest lists what is there."""
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
    assert sync.sync_once() == 1
    listed = json.loads(store.get_text(manifest_key(0)))["files"]
    assert list(listed) == ["step-2/model.pt"]
    assert not store.exists("step-1/model.pt") and said == []
    monkeypatch.setattr(LocalStore, "put_files", real_put_files)
    assert sync.sync_once() == 0  # nothing left to do: the vanished file is not retried


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


def test_the_controller_is_told_once_when_a_checkpoint_is_stored(tmp_path, store):
    local = tmp_path / "node0"
    told: list[str] = []
    sync = CheckpointSync(store, local, 0, interval=60, log=print, on_state=lambda: told.append(1))
    local.mkdir()
    assert sync.sync_once() == 0 and told == []  # nothing saved yet
    write(local / "step-1/state.pt", "s1")
    assert sync.sync_once() == 1 and told == [1]
    write(local / "step-2/state.pt", "s2")
    assert sync.sync_once() == 1 and told == [1]
