"""A node's working directory kept across attempts (trainctl.node.workdir), against a real
file store: what counts as state, copies that are never torn, per-node restores, the files
every node wrote, the size cap, and stored copies that cannot be trusted."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest

from tests.helpers import zip_bytes
from trainctl.node.sync import unfinished
from trainctl.node.workdir import (
    StateRoots,
    WorkdirSync,
    ignore_spec,
    manifest_key,
    restore,
)
from trainctl.store import open_store

pytestmark = pytest.mark.timeout(30)


def roots_at(base: Path, *, shipped=(), patterns=(), skip=()) -> StateRoots:
    dirs = {name: base / name for name in ("code", "model", "output")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return StateRoots(
        dirs=dirs,
        shipped=frozenset(shipped),
        skip_dirs=tuple(skip),
        ignore=ignore_spec(patterns),
    )


def sync_for(store, rank, roots, *, attempt=1, max_bytes=2**30, logs=None, known=None):
    log = logs.append if logs is not None else lambda _: None
    return WorkdirSync(
        store, rank, attempt, roots, max_bytes=max_bytes, interval=60, log=log, known=known
    )


@pytest.fixture
def store(tmp_path):
    return open_store(f"file://{tmp_path / 'store'}").child("jobs/j/workdir")


def test_state_is_what_the_script_wrote_not_the_code_nor_caches(tmp_path):
    roots = roots_at(
        tmp_path / "n0",
        shipped={"train.py", "lib/util.py"},
        patterns=["data/", "*.log"],
        skip=[tmp_path / "n0" / "code" / "ckpt"],
    )
    code = roots.dirs["code"]
    for rel in ("train.py", "lib/util.py", "snapshot.pt", "runs/events.out", "data/big.bin"):
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(rel)
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_text("x")
    (code / "half.pt.tmp").write_text("being written")
    (code / "ckpt").mkdir()
    (code / "ckpt" / "step-1.pt").write_text("the checkpoint sync's")
    (code / "train.log").write_text("ignored by pattern")
    (code / "link.pt").symlink_to(code / "snapshot.pt")
    (roots.dirs["model"] / "model.pt").write_text("m")
    (roots.dirs["output"] / "plot.png").write_text("p")
    assert sorted(roots.scan()) == [
        "code/runs/events.out",
        "code/snapshot.pt",
        "model/model.pt",
        "output/plot.png",
    ]


def test_a_node_gets_back_its_own_files_with_their_times(store, tmp_path):
    first = roots_at(tmp_path / "a1", shipped={"train.py"})
    (first.dirs["code"] / "train.py").write_text("code")
    (first.dirs["code"] / "snapshot.pt").write_bytes(b"epoch 7")
    (first.dirs["code"] / "notes").mkdir()
    (first.dirs["code"] / "notes" / "rank0.txt").write_text("mine")
    (first.dirs["output"] / "curve.csv").write_text("1,2")
    for path in ("snapshot.pt", "notes/rank0.txt", "notes"):  # (a folder's: once settled)
        os.utime(first.dirs["code"] / path, ns=(10**18, 10**18))
    sync = sync_for(store, 0, first)
    assert sync.sync_once() == 3
    assert sync.sync_once() == 0  # nothing changed: nothing goes up again

    again = roots_at(tmp_path / "a2", shipped={"train.py"})
    (again.dirs["code"] / "train.py").write_text("the record's code")
    logs: list[str] = []
    restored = restore(store, 0, again, logs.append)
    assert (restored.files, restored.from_attempt) == (3, 1)
    assert restored.largest[0] == "snapshot.pt"
    assert (again.dirs["code"] / "snapshot.pt").read_bytes() == b"epoch 7"
    assert (again.dirs["code"] / "notes" / "rank0.txt").read_text() == "mine"
    assert (again.dirs["output"] / "curve.csv").read_text() == "1,2"
    assert (again.dirs["code"] / "train.py").read_text() == "the record's code"
    assert (again.dirs["code"] / "snapshot.pt").stat().st_mtime_ns == 10**18
    assert any("restored 3 file(s)" in line for line in logs), logs
    # what was restored is known to be stored: the next attempt's first pass uploads nothing
    assert sync_for(store, 0, again, attempt=2, known=restored.known).sync_once() == 0
    # another node of the next attempt gets them too, as node 0's copies
    other = restore(store, 1, roots_at(tmp_path / "other"), print)
    assert other.files == 3 and not other.known and len(other.borrowed) == 3


def sync_after(store, rank, roots, restored, **kwargs):
    """The next attempt's sync, started from what its restore left (as the agent does)."""
    return WorkdirSync(
        store, rank, 2, roots, max_bytes=kwargs.get("max_bytes", 2**30), interval=60,
        log=lambda _: None, known=restored.known, borrowed=restored.borrowed,
        superseded=restored.superseded,
    )  # fmt: skip


def test_a_file_one_node_wrote_comes_back_on_every_node(store, tmp_path):
    """Today's DDP tutorial, Lightning, Hugging Face's Trainer: global rank 0 saves, every
    rank loads. Every node of the next attempt gets rank 0's files (SageMaker's rule for its
    checkpoint directory), and each rank's own file (Trainer's rng_state_<rank>.pth) too; a
    node does not upload another node's copy again while it is unchanged."""
    nodes = [roots_at(tmp_path / f"n{r}") for r in (0, 1)]
    (nodes[0].dirs["code"] / "snapshot.pt").write_bytes(zip_bytes("epoch 20"))
    for rank in (0, 1):
        (nodes[rank].dirs["code"] / f"rng_state_{rank}.pth").write_bytes(zip_bytes(f"r{rank}"))
        sync_for(store, rank, nodes[rank]).sync_once()
    fresh = [roots_at(tmp_path / f"m{r}") for r in (0, 1, 2)]
    results = [restore(store, r, fresh[r], print) for r in (0, 1, 2)]
    for rank in (0, 1, 2):  # rank 2: a node new to the job (an elastic job grown)
        code = fresh[rank].dirs["code"]
        assert (code / "snapshot.pt").read_bytes() == zip_bytes("epoch 20")
        assert (code / "rng_state_0.pth").read_bytes() == zip_bytes("r0")
        assert (code / "rng_state_1.pth").read_bytes() == zip_bytes("r1")
        assert results[rank].files == 3
    assert results[1].state["snapshot.pt"] == results[0].state["snapshot.pt"]
    assert results[1].state["snapshot.pt"]["node"] == 0
    assert set(results[1].borrowed) == {"code/snapshot.pt", "code/rng_state_0.pth"}
    assert set(results[1].known) == {"code/rng_state_1.pth"}
    before = sorted(i.key for i in store.list(""))
    assert sync_after(store, 1, fresh[1], results[1]).sync_once() == 0
    assert sorted(i.key for i in store.list("")) == before  # stored once, by its writer
    # rewritten by this node's script: now this node's own copy
    (fresh[1].dirs["code"] / "snapshot.pt").write_bytes(zip_bytes("epoch 21"))
    again = sync_after(store, 1, fresh[1], results[1])
    assert again.sync_once() == 1
    manifest = json.loads(store.get_text(manifest_key(1)))
    assert manifest["files"]["code/snapshot.pt"]["key"].startswith("node-1/a2-")


def test_a_file_every_node_wrote_comes_back_newest_on_every_node(store, tmp_path):
    """The DDP tutorial before 2025: each node's local rank 0 saves snapshot.pt. Node 1 was
    lost before its last copy went up; both nodes must resume from the same (newest)
    snapshot, and node 1's older copy leaves the store."""
    nodes = [roots_at(tmp_path / f"n{r}") for r in (0, 1)]
    for rank, (epoch, when) in enumerate([(20, 2 * 10**18), (10, 10**18)]):
        code = nodes[rank].dirs["code"]
        (code / "snapshot.pt").write_text(f"epoch {epoch}")
        os.utime(code / "snapshot.pt", ns=(when, when))
        (code / f"rank{rank}.log").write_text(f"node {rank}")  # only this node's
        sync_for(store, rank, nodes[rank]).sync_once()
    old_copy = json.loads(store.get_text(manifest_key(1)))["files"]["code/snapshot.pt"]["key"]
    fresh = [roots_at(tmp_path / f"m{r}") for r in (0, 1, 2)]
    results = [restore(store, r, fresh[r], print) for r in (0, 1, 2)]
    for rank in (0, 1, 2):
        assert (fresh[rank].dirs["code"] / "snapshot.pt").read_text() == "epoch 20"
        assert (fresh[rank].dirs["code"] / "rank0.log").read_text() == "node 0"
        assert (fresh[rank].dirs["code"] / "rank1.log").read_text() == "node 1"
    assert "code/snapshot.pt" in results[0].known
    assert "code/snapshot.pt" in results[1].borrowed and results[1].superseded == [old_copy]
    sync_after(store, 1, fresh[1], results[1]).sync_once()
    manifest = json.loads(store.get_text(manifest_key(1)))
    assert "code/snapshot.pt" not in manifest["files"]
    assert not store.exists(old_copy)


def test_over_the_cap_every_node_restores_the_same_newest_files(store, tmp_path):
    """At most workdir_max_mb restored per node, newest first: the same choice on every
    node (a cap must not start the nodes from different files), the rest named."""
    nodes = [roots_at(tmp_path / f"n{r}") for r in (0, 1)]
    for rank, name, when in [(0, "snapshot.pt", 3), (1, "cache.bin", 2), (0, "old.pt", 1)]:
        path = nodes[rank].dirs["code"] / name
        path.write_bytes(b"x" * 400)
        os.utime(path, ns=(when * 10**18, when * 10**18))
    for rank in (0, 1):
        sync_for(store, rank, nodes[rank]).sync_once()
    for rank in (0, 1):
        logs: list[str] = []
        fresh = roots_at(tmp_path / f"m{rank}")
        restored = restore(store, rank, fresh, logs.append, max_bytes=900)
        assert sorted(p.name for p in fresh.dirs["code"].iterdir()) == ["cache.bin", "snapshot.pt"]
        assert restored.left_out == 1
        assert any(
            "1 file(s), 400 bytes not restored" in line and "old.pt" in line for line in logs
        )


def test_a_file_written_while_it_uploads_is_not_listed_until_it_is_still(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    snapshot = roots.dirs["code"] / "snapshot.pt"
    snapshot.write_bytes(b"v1")

    original = store.put_files

    def put_files(items, **kwargs):  # the script writes a new version during the upload
        original(items, **kwargs)
        snapshot.write_bytes(b"v2 longer")

    store.put_files = put_files
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    manifest = json.loads(store.get_text(manifest_key(0)))
    assert manifest["files"] == {}, "a copy that may be torn is never listed"
    assert not any(i.key.startswith("node-0/a1-p1/") for i in store.list("")), "deleted"
    store.put_files = original
    sync.sync_once()
    manifest = json.loads(store.get_text(manifest_key(0)))
    key = manifest["files"]["code/snapshot.pt"]["key"]
    assert store.get_bytes(key) == b"v2 longer"


def test_a_file_rewritten_during_every_upload_goes_up_from_a_frozen_copy(
    store, tmp_path, monkeypatch
):
    """The DDP tutorial saves snapshot.pt every epoch; with a slow store each upload takes
    longer than an epoch, and a file that is never still would reach the store only when
    the node ends. After one torn upload it goes up from a copy nothing rewrites."""
    import shutil

    roots = roots_at(tmp_path / "n0")
    snapshot = roots.dirs["code"] / "snapshot.pt"
    epoch = [1]
    snapshot.write_bytes(zip_bytes("epoch 1"))
    original = store.put_files

    def put_files(items, **kwargs):  # an epoch ends during every upload
        original(items, **kwargs)
        epoch[0] += 1
        snapshot.write_bytes(zip_bytes(f"epoch {epoch[0]}"))

    store.put_files = put_files
    staging = tmp_path / "staging"
    sync = WorkdirSync(store, 0, 1, roots, max_bytes=2**30, interval=60, log=print, staging=staging)
    sync.sync_once()  # torn: not listed, and the file is known to move
    assert json.loads(store.get_text(manifest_key(0)))["files"] == {}
    assert sync.moving == {"code/snapshot.pt"}
    sync.sync_once()  # the copy of epoch 2 goes up, while epoch 3 is written
    files = json.loads(store.get_text(manifest_key(0)))["files"]
    assert store.get_bytes(files["code/snapshot.pt"]["key"]) == zip_bytes("epoch 2")
    assert sync.frozen == 1 and list(staging.iterdir()) == []  # copies removed after a pass
    sync.sync_once()
    files = json.loads(store.get_text(manifest_key(0)))["files"]
    assert store.get_bytes(files["code/snapshot.pt"]["key"]) == zip_bytes("epoch 3")
    assert len([i for i in store.list("") if "snapshot" in i.key]) == 1  # old versions gone

    copy = shutil.copyfile

    def copy_during_a_save(src, dst):  # the script saves again while the copy is taken
        copy(src, dst)
        snapshot.write_bytes(zip_bytes("epoch 99, a longer one"))

    monkeypatch.setattr(shutil, "copyfile", copy_during_a_save)
    sync.sync_once()  # the torn copy is not uploaded; the stored epoch 3 stays
    files = json.loads(store.get_text(manifest_key(0)))["files"]
    assert store.get_bytes(files["code/snapshot.pt"]["key"]) == zip_bytes("epoch 3")
    assert list(staging.iterdir()) == []


def test_replaced_and_deleted_files_leave_no_old_versions(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    a, b = roots.dirs["code"] / "a.pt", roots.dirs["code"] / "b.pt"
    a.write_text("1")
    b.write_text("1")
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    a.write_text("22")
    b.unlink()
    sync.sync_once()
    keys = sorted(i.key for i in store.list(""))
    assert keys == ["node-0/a1-p2/code/a.pt", "node-0/manifest.json"], keys


def test_over_the_cap_newest_files_first_and_the_rest_named_once(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    code = roots.dirs["code"]
    for name, size, when in [("old.bin", 600, 1), ("new.pt", 300, 3), ("mid.pt", 300, 2)]:
        (code / name).write_bytes(b"x" * size)
        os.utime(code / name, ns=(when * 10**18, when * 10**18))
    logs: list[str] = []
    sync = sync_for(store, 0, roots, max_bytes=700, logs=logs)
    sync.sync_once()
    sync.sync_once()
    stored = json.loads(store.get_text(manifest_key(0)))["files"]
    assert sorted(stored) == ["code/mid.pt", "code/new.pt"]
    warnings = [line for line in logs if "not kept" in line]
    assert len(warnings) == 1 and "old.bin" in warnings[0], logs


def test_a_stored_copy_that_cannot_be_trusted_restores_nothing_outside(store, tmp_path):
    roots = roots_at(tmp_path / "n0", shipped={"train.py"})
    (roots.dirs["code"] / "train.py").write_text("the record's code")
    store.put_bytes("node-0/a1-p1/x", b"evil")
    entry = {"key": "node-0/a1-p1/x", "size": 4}
    files = {
        "code/../../escaped": entry,
        "/etc/passwd": entry,
        "code/train.py": entry,  # the code is the record's
        "elsewhere/file": entry,
        "code/ok.txt": entry,
        "code/other.txt": {"key": "node-1/a1-p1/y", "size": 1},  # another node's key
    }
    store.put_text(manifest_key(0), json.dumps({"attempt": 1, "files": files}))
    logs: list[str] = []
    restored = restore(store, 0, roots, logs.append)
    assert restored.files == 1 and (roots.dirs["code"] / "ok.txt").read_bytes() == b"evil"
    assert (roots.dirs["code"] / "train.py").read_text() == "the record's code"
    assert not (tmp_path / "escaped").exists()
    assert sum("skipping" in line for line in logs) == 5, logs

    for corrupt in ("not json", json.dumps({"files": ["a"]}), json.dumps([1])):
        store.put_text(manifest_key(0), corrupt)
        logs.clear()
        assert restore(store, 0, roots_at(tmp_path / "c"), logs.append).files == 0
        assert any("unreadable" in line for line in logs), logs


def test_the_last_pass_of_a_node_that_succeeded_leaves_model_and_output_as_they_were(
    store, tmp_path
):
    roots = roots_at(tmp_path / "n0")
    (roots.dirs["model"] / "model.pt").write_text("periodic")
    sync = sync_for(store, 0, roots).start()
    sync.sync_once()
    (roots.dirs["model"] / "model.pt").write_text("final, packed in model.tar.gz")
    (roots.dirs["code"] / "plot.png").write_text("written last")
    sync.close(outputs=False)
    files = json.loads(store.get_text(manifest_key(0)))["files"]
    assert sorted(files) == ["code/plot.png", "model/model.pt"]
    assert store.get_text(files["model/model.pt"]["key"]) == "periodic"


def test_a_snapshot_cut_short_mid_write_never_replaces_its_last_whole_copy(store, tmp_path):
    """torch.save(state, "snapshot.pt") truncates the file, then writes it: a pass between
    the two, or a stop that cuts the write short, sees a torn file. The stored copy stays the
    last whole one, the node's last pass says so, and the next whole version goes up."""
    roots = roots_at(tmp_path / "n0")
    snapshot = roots.dirs["code"] / "snapshot.pt"
    whole = zip_bytes("epoch 6")
    snapshot.write_bytes(whole)
    logs: list[str] = []
    sync = sync_for(store, 0, roots, logs=logs)
    assert sync.sync_once() == 1

    def stored() -> bytes:
        files = json.loads(store.get_text(manifest_key(0)))["files"]
        return store.get_bytes(files["code/snapshot.pt"]["key"])

    later = zip_bytes("epoch 7 " * 100)
    for torn in (b"", later[:30], later[:-1]):  # just opened; mid-write; all but the last byte
        snapshot.write_bytes(torn)
        assert sync.sync_once() == 0 and stored() == whole
    assert logs == [], "a pass during the write waits quietly for the next"
    snapshot.write_bytes(later)
    assert sync.sync_once() == 1 and stored() == later

    snapshot.write_bytes(later[:100])  # the node stops here
    (roots.dirs["code"] / "fresh.ckpt").write_bytes(b"")  # opened, never written
    sync.close()
    assert stored() == later
    assert "code/fresh.ckpt" not in json.loads(store.get_text(manifest_key(0)))["files"]
    assert logs == [
        "working directory: fresh.ckpt was being written when the node stopped (empty); not kept",
        "working directory: snapshot.pt was being written when the node stopped (a zip "
        "without its end record); its last whole copy is kept",
    ], logs
    restored = restore(store, 0, roots_at(tmp_path / "a2"), print)
    assert restored.files == 1
    assert (tmp_path / "a2" / "code" / "snapshot.pt").read_bytes() == later


SAFETENSORS_HEADER = b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
SAFETENSORS = struct.pack("<Q", len(SAFETENSORS_HEADER)) + SAFETENSORS_HEADER  # + 4 bytes


@pytest.mark.parametrize(
    ("name", "content", "whole"),
    [
        ("notes.txt", b"", True),  # an empty text file is a file
        ("marker.pt", b"not a zip, not empty", True),  # no format to check: trusted
        ("zip.bin", zip_bytes("x") + b"trailing", False),
        ("commented.npz", zip_bytes("x")[:-2] + b"\x03\x00abc", True),  # a zip comment
        ("state.pkl", pickle.dumps({"a": list(range(50))}), True),
        ("state.pkl", pickle.dumps({"a": list(range(50))})[:-1], False),
        ("weights.safetensors", SAFETENSORS + b"abcd", True),
        ("weights.safetensors", SAFETENSORS + b"ab", False),
        ("weights.safetensors", SAFETENSORS[:12], False),
    ],
)  # fmt: skip
def test_which_files_cannot_be_whole(tmp_path, name, content, whole):
    path = tmp_path / name
    path.write_bytes(content)
    assert (unfinished(path, len(content)) is None) == whole


def test_the_controller_is_told_each_time_saved_state_is_stored(store, tmp_path):
    """A relaunch by choice (back to spot) needs state to resume from, and a `ckptN` fault
    counts the files: a snapshot in a saved-state format counts, other files do not."""
    roots = roots_at(tmp_path / "n0")
    told: list[str] = []
    sync = WorkdirSync(
        store, 0, 1, roots, max_bytes=2**30, interval=60, log=lambda _: None,
        on_state=lambda: told.append("state"),
    )  # fmt: skip
    (roots.dirs["code"] / "losses.csv").write_text("1,0.5\n")
    assert sync.sync_once() == 1 and told == []
    (roots.dirs["code"] / "snapshot.pt").write_bytes(zip_bytes("s"))
    assert sync.sync_once() == 1 and told == ["state"]
    (roots.dirs["code"] / "snapshot.pt").write_bytes(zip_bytes("t"))
    assert sync.sync_once() == 1 and told == ["state", "state"]
    assert sync.stored_files == 2  # two saves of it


def test_a_file_caught_being_written_when_its_node_dies_is_said_on_the_relaunch(store, tmp_path):
    """A kill leaves no last pass to say what was cut short: the manifest names what the
    newest pass caught being written, and the relaunch says it put back the last whole copy
    (`snapshot.pt`) or nothing (`fresh.ckpt`, never whole)."""
    roots = roots_at(tmp_path / "n0")
    snapshot = roots.dirs["code"] / "snapshot.pt"
    snapshot.write_bytes(zip_bytes("epoch 6"))
    sync = sync_for(store, 0, roots)
    assert sync.sync_once() == 1
    snapshot.write_bytes(zip_bytes("epoch 7 " * 100)[:50])  # torch.save under way
    (roots.dirs["code"] / "fresh.ckpt").write_bytes(b"")
    assert sync.sync_once() == 0  # nothing whole to store; the manifest says what it caught
    manifest = json.loads(store.get_text(manifest_key(0)))
    assert manifest["writing"] == ["code/fresh.ckpt", "code/snapshot.pt"]
    # (the node dies here: no last pass)
    logs: list[str] = []
    restored = restore(store, 0, roots_at(tmp_path / "a2"), logs.append)
    assert restored.files == 1 and restored.unsettled == ["fresh.ckpt", "snapshot.pt"]
    assert (tmp_path / "a2" / "code" / "snapshot.pt").read_bytes() == zip_bytes("epoch 6")
    assert [line for line in logs if "was being written" in line] == [
        "working directory: fresh.ckpt was being written when its node last copied it: "
        "not restored",
        "working directory: snapshot.pt was being written when its node last copied it: "
        "restored as it was before",
    ], logs
