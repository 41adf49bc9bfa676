"""A relaunch restores a state the node's files were in together (trainctl.node.settled,
through WorkdirSync and restore): a multi-file checkpoint caught half-written, by a pass or
by the node's end, comes back as it was before or not at all, and the restore says which."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import zip_bytes
from trainctl.node.settled import QUIET_SECONDS, incomplete_folders, unit_of
from trainctl.node.workdir import StateRoots, WorkdirSync, ignore_spec, manifest_key, restore
from trainctl.store import open_store

pytestmark = pytest.mark.timeout(30)
LONG_AGO = 10**18  # ns: 2001


def roots_at(base: Path) -> StateRoots:
    dirs = {name: base / name for name in ("code", "model", "output")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return StateRoots(dirs=dirs, ignore=ignore_spec(()))


def write(root: Path, rel: str, data: bytes, *, aged: bool = True) -> None:
    """A file as a script leaves it; `aged`: long enough ago to count as settled."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if aged:
        os.utime(path, ns=(LONG_AGO, LONG_AGO))
        os.utime(path.parent, ns=(LONG_AGO, LONG_AGO))


def trainer_checkpoint(code: Path, step: int, *, whole: bool = True, aged: bool = True) -> None:
    """A Hugging Face Trainer's checkpoint-<step>/, trainer_state.json last (or not yet)."""
    folder = f"out/checkpoint-{step}"
    write(code, f"{folder}/model.safetensors", zip_bytes(f"model {step}"), aged=aged)
    write(code, f"{folder}/optimizer.pt", zip_bytes(f"optimizer {step}"), aged=aged)
    if whole:
        write(code, f"{folder}/trainer_state.json", json.dumps({"step": step}).encode(), aged=aged)


@pytest.fixture
def store(tmp_path):
    return open_store(f"file://{tmp_path / 'store'}").child("jobs/j/workdir")


def sync_for(store, rank, roots, logs=None):
    log = logs.append if logs is not None else lambda _: None
    return WorkdirSync(store, rank, 1, roots, max_bytes=2**30, interval=60, log=log)


def restored_paths(store, tmp_path, name="again", rank=0) -> tuple[list[str], list[str]]:
    again = roots_at(tmp_path / name)
    logs: list[str] = []
    result = restore(store, rank, again, logs.append)
    code = again.dirs["code"]
    return sorted(p.relative_to(code).as_posix() for p in code.rglob("*") if p.is_file()), [
        *result.unsettled,
        *logs,
    ]


def test_units_are_files_alone_or_folders_that_are_written_together():
    listed = {
        "code/out/checkpoint-5": {"model.safetensors", "trainer_state.json"},
        "code/checkpoints": {"last.ckpt", "epoch=1.ckpt"},
        "code/ckpt/step-3": {"part-0.dat", "part-1.dat"},
        "code/run/checkpoint-5": {"rng_state_1.pth"},  # another rank's part of one
    }

    def unit(rel: str) -> str:
        return unit_of(rel, lambda folder: listed.get(folder, ()))

    assert unit("code/snapshot.pt") == "code/snapshot.pt"
    assert unit("code/train.log") == "code/train.log"
    assert unit("code/out/checkpoint-5/model.safetensors") == "code/out/checkpoint-5/"
    assert unit("code/checkpoints/last.ckpt") == "code/checkpoints/last.ckpt"  # whole alone
    assert unit("code/ckpt/step-3/part-0.dat") == "code/ckpt/step-3/"
    assert unit("code/run/checkpoint-5/rng_state_1.pth") == "code/run/checkpoint-5/rng_state_1.pth"
    assert incomplete_folders(
        ["code/a/checkpoint-5/rng_state_1.pth", "code/b/step/__1_0.distcp", "code/c/x.dat"]
    ) == {"code/a/checkpoint-5": "trainer_state.json", "code/b/step": ".metadata"}


def test_a_trainer_checkpoint_caught_half_written_is_not_restored(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    code = roots.dirs["code"]
    trainer_checkpoint(code, 10)
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    trainer_checkpoint(code, 15, whole=False)  # the pass comes between two of its files
    sync.sync_once()
    files, said = restored_paths(store, tmp_path)
    assert [f for f in files if "checkpoint-15" in f] == []
    assert "out/checkpoint-10/trainer_state.json" in files
    assert "out/checkpoint-15/" in said, said
    assert any("out/checkpoint-15/ was being written" in line and "not restored" in line
               for line in said), said  # fmt: skip
    write(code, "out/checkpoint-15/trainer_state.json", b'{"step": 15}')
    sync.sync_once()  # whole now: restored from here on
    files, _ = restored_paths(store, tmp_path, "third")
    assert "out/checkpoint-15/trainer_state.json" in files
    assert "out/checkpoint-15/optimizer.pt" in files


def test_a_node_killed_while_it_writes_a_folder_leaves_the_folder_as_it_was(store, tmp_path):
    """A folder of files whose format says nothing of their end, rewritten in place by a
    writer the node's end cut short: the last pass (after a kill, not the script's own end)
    keeps the folder's settled version; one written long enough ago is settled."""
    roots = roots_at(tmp_path / "n0")
    code = roots.dirs["code"]
    for part in range(3):
        write(code, f"ckpt/latest/part-{part}.dat", f"step 1 part {part}".encode())
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    write(code, "ckpt/latest/part-0.dat", b"step 2 part 0", aged=False)  # then the kill
    logs: list[str] = []
    sync.log = logs.append
    sync.close(ended_cleanly=False)
    assert any("ckpt/latest/ is kept as it was before" in line for line in logs), logs
    again = roots_at(tmp_path / "again")
    restore(store, 0, again, lambda _: None)
    got = [(again.dirs["code"] / f"ckpt/latest/part-{p}.dat").read_bytes() for p in range(3)]
    assert got == [f"step 1 part {p}".encode() for p in range(3)]


def test_what_the_script_left_at_its_own_end_is_kept_as_it_is(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    write(roots.dirs["code"], "ckpt/final/a.dat", b"a", aged=False)
    write(roots.dirs["code"], "ckpt/final/b.dat", b"b", aged=False)
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    assert json.loads(store.get_text(manifest_key(0)))["files"] == {}  # too fresh to tell
    sync.close(ended_cleanly=True)  # the script ended by itself: nothing is being written
    files = json.loads(store.get_text(manifest_key(0)))["files"]
    assert sorted(files) == ["code/ckpt/final/a.dat", "code/ckpt/final/b.dat"]


def test_a_folder_settles_once_it_has_been_still_long_enough(store, tmp_path):
    roots = roots_at(tmp_path / "n0")
    folder = roots.dirs["code"] / "ckpt" / "step-1"
    write(roots.dirs["code"], "ckpt/step-1/a.dat", b"a", aged=False)
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    assert json.loads(store.get_text(manifest_key(0)))["files"] == {}
    past = int((os.path.getmtime(folder) - QUIET_SECONDS - 1) * 1e9)
    for path in (folder / "a.dat", folder):
        os.utime(path, ns=(past, past))
    sync.sync_once()  # nothing new to upload: the wait alone settles it
    assert list(json.loads(store.get_text(manifest_key(0)))["files"]) == ["code/ckpt/step-1/a.dat"]


def test_a_version_the_restore_still_names_stays_in_the_store_until_replaced(store, tmp_path):
    """DCP rewrites a folder in place (`.metadata` last): the settled version's objects stay
    while the new one is half-written, and go once it is whole."""
    roots = roots_at(tmp_path / "n0")
    code = roots.dirs["code"]
    write(code, "dcp/latest/__0_0.distcp", b"shard v1")
    write(code, "dcp/latest/.metadata", b"meta v1")
    sync = sync_for(store, 0, roots)
    sync.sync_once()
    (code / "dcp/latest/.metadata").unlink()
    write(code, "dcp/latest/__0_0.distcp", b"shard v2 (of a newer step)")
    sync.sync_once()
    files, _ = restored_paths(store, tmp_path)
    assert files == ["dcp/latest/.metadata", "dcp/latest/__0_0.distcp"]
    assert (tmp_path / "again/code/dcp/latest/__0_0.distcp").read_bytes() == b"shard v1"
    write(code, "dcp/latest/.metadata", b"meta v2")
    sync.sync_once()
    assert sorted(i.key.rsplit("/", 1)[1] for i in store.list("") if "/dcp/" in i.key) == [
        ".metadata",
        "__0_0.distcp",
    ], "the first version's objects are gone once nothing names them"
    files, _ = restored_paths(store, tmp_path, "third")
    assert (tmp_path / "third/code/dcp/latest/__0_0.distcp").read_bytes().startswith(b"shard v2")


def test_each_nodes_part_of_a_checkpoint_comes_back_only_with_the_whole(store, tmp_path):
    """Rank 1's node writes only its rng_state_1.pth into checkpoint-<n>/; rank 0's node the
    rest, trainer_state.json last. Killed while rank 0 writes checkpoint-15, the relaunch
    gets checkpoint-10 whole, and nothing of checkpoint-15 from either node."""
    n0, n1 = roots_at(tmp_path / "n0"), roots_at(tmp_path / "n1")
    trainer_checkpoint(n0.dirs["code"], 10)
    trainer_checkpoint(n0.dirs["code"], 15, whole=False)
    for step in (10, 15):
        write(n1.dirs["code"], f"out/checkpoint-{step}/rng_state_1.pth", zip_bytes(f"rng {step}"))
    for rank, roots in ((0, n0), (1, n1)):
        sync_for(store, rank, roots).sync_once()
    for rank in (0, 1):
        files, said = restored_paths(store, tmp_path, f"again-{rank}", rank)
        assert [f for f in files if "checkpoint-15" in f] == [], files
        assert "out/checkpoint-10/rng_state_1.pth" in files
        assert "out/checkpoint-10/trainer_state.json" in files
        assert "out/checkpoint-15/" in said


def test_the_checkpoint_dir_restores_no_checkpoint_without_its_last_file(tmp_path):
    """SageMaker's pattern: the Trainer's output_dir is SM_CHECKPOINT_DIR (synced as it is,
    every node's files together). A checkpoint-<n>/ that a lost node left without its
    trainer_state.json, and a DCP step without .metadata, stay out of the restore."""
    from trainctl.node.checkpoints import restore as restore_checkpoints

    store = open_store(f"file://{tmp_path / 'ckpt-store'}")
    for rel in (
        "checkpoint-5/model.safetensors", "checkpoint-5/trainer_state.json",
        "checkpoint-10/model.safetensors", "dcp/step-2/__0_0.distcp", "dcp/step-2/.metadata",
        "dcp/step-3/__0_0.distcp", "other/notes.txt",
    ):  # fmt: skip
        store.put_bytes(rel, b"x")
    left_out: list[str] = []
    logs: list[str] = []
    local = tmp_path / "checkpoints"
    restored = restore_checkpoints(store, local, logs.append, left_out=left_out)
    assert sorted(restored) == [
        "checkpoint-5/model.safetensors", "checkpoint-5/trainer_state.json",
        "dcp/step-2/.metadata", "dcp/step-2/__0_0.distcp", "other/notes.txt",
    ]  # fmt: skip
    assert left_out == ["checkpoint-10/", "dcp/step-3/"]
    assert not (local / "checkpoint-10").exists()
    assert any("checkpoint-10/ was being written" in line for line in logs), logs


def test_where_a_relaunch_starts_is_named_by_the_newest_state_it_restored(store, tmp_path):
    """`status`'s FROM: the Trainer's newest checkpoint-<n>/ (not its largest file, nor a
    tfevents file), or the newest saved file itself (Lightning's last.ckpt)."""
    from trainctl.record.models import NodeRestored, Restored

    roots = roots_at(tmp_path / "n0")
    code = roots.dirs["code"]
    trainer_checkpoint(code, 5)
    write(code, "out/runs/events.out.tfevents.1", b"x" * 5000)
    path = code / "out/checkpoint-5/optimizer.pt"
    os.utime(path, ns=(LONG_AGO + 10**9, LONG_AGO + 10**9))  # the newest file of it
    sync_for(store, 0, roots).sync_once()
    result = restore(store, 0, roots_at(tmp_path / "again"), lambda _: None)
    assert result.newest() == "out/checkpoint-5/"
    restored = Restored()
    restored.add(NodeRestored.from_message({"rank": 0, **result.summary()}))
    assert restored.files_short().startswith("out/checkpoint-5/ +")

    lightning = roots_at(tmp_path / "n1")
    for name, at in (("epoch=1.ckpt", 1), ("last.ckpt", 2)):
        write(lightning.dirs["code"], f"checkpoints/{name}", zip_bytes(name))
        when = LONG_AGO + at * 10**9
        os.utime(lightning.dirs["code"] / "checkpoints" / name, ns=(when, when))
    other = open_store(f"file://{tmp_path / 'store-1'}")
    sync_for(other, 0, lightning).sync_once()
    assert restore(other, 0, roots_at(tmp_path / "again-1"), print).newest() == (
        "checkpoints/last.ckpt"
    )
