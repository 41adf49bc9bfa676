"""One safe way into a store (trainctl.store.safefs, used by LocalStore): no link below the
root followed for a read, a listing, a write or a delete; no special file opened; reads
bounded; and a model tarball that holds no link (issue 58)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from trainctl.errors import NotFoundError, StoreError
from trainctl.node.staging import pack_directory
from trainctl.store import LocalStore, safefs

SECRET = b'{"password": "hunter2"}'


@pytest.fixture
def planted(tmp_path: Path) -> tuple[LocalStore, Path]:
    """A store whose job `a` has a link to job `b`'s record, a folder link to `b`'s folder,
    a FIFO and a link to /dev/zero in its logs, and job `alias` that is a link to `b`."""
    root = tmp_path / "store"
    store = LocalStore(root)
    store.put_bytes("jobs/b/job.json", SECRET)
    store.put_bytes("jobs/a/logs/node-0.log", b"line\n")
    logs = root / "jobs" / "a" / "logs"
    (logs / "leak.json").symlink_to(root / "jobs" / "b" / "job.json")
    (logs / "dir").symlink_to(root / "jobs" / "b", target_is_directory=True)
    os.mkfifo(logs / "fifo")
    (logs / "zero").symlink_to("/dev/zero")
    (root / "jobs" / "alias").symlink_to(root / "jobs" / "b", target_is_directory=True)
    return store, root


def test_reads_never_follow_a_link_or_open_a_special_file(planted):
    store, _ = planted
    for key in ("leak.json", "dir/job.json", "fifo", "zero"):
        with pytest.raises(NotFoundError, match=r"does not exist|link or a special file"):
            store.get_bytes(f"jobs/a/logs/{key}")
        with pytest.raises(NotFoundError):
            store.get_range(f"jobs/a/logs/{key}", 0)
        assert not store.exists(f"jobs/a/logs/{key}")
        assert store.info(f"jobs/a/logs/{key}") is None
    with pytest.raises(NotFoundError):
        store.get_bytes("jobs/alias/job.json")
    assert store.child("jobs/alias").list() is not None
    assert list(store.child("jobs/alias").list()) == []


def test_listings_show_only_the_regular_files_under_real_folders(planted):
    store, _ = planted
    keys = [i.key for i in store.list("")]
    assert keys == ["jobs/a/logs/node-0.log", "jobs/b/job.json"], keys
    assert store.list_dirs("jobs") == ["a", "b"]
    assert list(store.list("jobs/alias")) == []


def test_writes_through_a_link_land_nowhere_else(planted):
    store, root = planted
    with pytest.raises(StoreError):
        store.put_bytes("jobs/a/logs/dir/job.json", b"overwritten")
    with pytest.raises(StoreError):
        store.append_bytes("jobs/alias/job.json", b"appended")
    with pytest.raises(StoreError):
        store.append_bytes("jobs/a/logs/fifo", b"x")  # (no reader: would block)
    assert (root / "jobs" / "b" / "job.json").read_bytes() == SECRET
    # A whole-object write replaces a link at the key itself; the target is untouched.
    store.put_bytes("jobs/a/logs/leak.json", b"mine")
    assert store.get_bytes("jobs/a/logs/leak.json") == b"mine"
    assert (root / "jobs" / "b" / "job.json").read_bytes() == SECRET


def test_deleting_an_alias_removes_the_link_not_the_job(planted):
    store, root = planted
    store.delete_prefix("jobs/alias")
    assert not (root / "jobs" / "alias").is_symlink()
    assert (root / "jobs" / "b" / "job.json").read_bytes() == SECRET
    store.delete("jobs/a/logs/dir/job.json")
    store.delete_prefix("jobs/a")
    assert not (root / "jobs" / "a").exists()
    assert (root / "jobs" / "b" / "job.json").read_bytes() == SECRET


def test_put_if_and_claims_take_no_fifo(planted):
    store, root = planted
    claims = root / ".trainctl" / "claims"
    claims.mkdir(parents=True)
    os.mkfifo(claims / "x.json")
    assert store.put_if(".trainctl/claims/x.json", b"{}", version=None) is not None
    assert store.get_bytes(".trainctl/claims/x.json") == b"{}"


def test_a_read_is_bounded_by_the_files_size_at_open(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = safefs.open_file(tmp_path, "f")
    try:
        with open(path, "ab") as grow:
            grow.write(b"y" * 100)
        assert safefs.read_fd(fd, 0) == b"x" * 100 + b"y" * 100  # what fstat says now
        assert safefs.read_fd(fd, 150, limit=10) == b"y" * 10
        assert safefs.read_fd(fd, 2**63 - 1) == b""
    finally:
        os.close(fd)
    with pytest.raises(safefs.RefusedPathError):
        safefs.parts_of("a/../b")


def test_get_file_copies_the_object_not_what_a_link_leads_to(planted, tmp_path):
    store, _ = planted
    with pytest.raises(NotFoundError):
        store.get_file("jobs/a/logs/leak.json", tmp_path / "out" / "x")
    assert not (tmp_path / "out" / "x").exists()
    store.get_file("jobs/a/logs/node-0.log", tmp_path / "out" / "log")
    assert (tmp_path / "out" / "log").read_bytes() == b"line\n"
    with pytest.raises(StoreError):
        store.get_file("jobs/a/logs/node-0.log", Path("/proc/self/mem"))


def test_a_model_tarball_holds_no_link(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "model.pt").write_bytes(b"weights")
    (model / "sub" / "latest.pt").symlink_to(model / "model.pt")
    (model / "root").symlink_to("/", target_is_directory=True)
    (model / "passwd").symlink_to("../../etc/passwd")
    (model / "outside").symlink_to("/etc/hostname")
    os.mkfifo(model / "fifo")
    said: list[str] = []
    dest = tmp_path / "model.tar.gz"
    assert pack_directory(model, dest, said.append)
    with tarfile.open(dest) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["model.pt", "sub/latest.pt"]
        assert all(m.isfile() for m in members.values())
        assert tar.extractfile("sub/latest.pt").read() == b"weights"
    assert len(said) == 1 and all(n in said[0] for n in ("root", "passwd", "outside", "fifo"))


def test_a_restore_writes_through_no_link_an_earlier_attempt_left(tmp_path: Path):
    """A persistent checkpoint_local_path outlives its attempt: a script there may leave
    `sub -> <another job's folder>` (which its own view hides) and `b.pt -> <a file>`. The
    next attempt's restore (the agent's, outside that view) replaces both with what was
    stored and writes nothing where they led."""
    from trainctl.node.checkpoints import restore

    store = LocalStore(tmp_path / "ckpts")
    store.put_bytes("sub/a.pt", b"saved a")
    store.put_bytes("b.pt", b"saved b")
    store.put_bytes("deep/er/c.pt", b"saved c")
    victim = tmp_path / "other-job"
    victim.mkdir()
    (victim / "a.pt").write_bytes(b"theirs")
    (victim / "b.pt").write_bytes(b"theirs too")
    local = tmp_path / "persistent"
    local.mkdir()
    (local / "sub").symlink_to(victim, target_is_directory=True)
    (local / "b.pt").symlink_to(victim / "b.pt")
    (local / "deep").write_bytes(b"a file where a folder belongs")
    restored = restore(store, local, lambda line: None)
    assert sorted(restored) == ["b.pt", "deep/er/c.pt", "sub/a.pt"]
    assert (victim / "a.pt").read_bytes() == b"theirs"
    assert (victim / "b.pt").read_bytes() == b"theirs too"
    assert sorted(p.name for p in victim.iterdir()) == ["a.pt", "b.pt"]
    for rel, data in (("sub/a.pt", b"saved a"), ("b.pt", b"saved b"), ("deep/er/c.pt", b"saved c")):
        assert not (local / rel).is_symlink() and (local / rel).read_bytes() == data
    assert not (local / "sub").is_symlink()
