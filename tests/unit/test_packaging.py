"""Source packaging: reproducible archives, exclusions, symlinks, size limit, safe extraction."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from trainctl import packaging
from trainctl.errors import PackagingError, SpecError
from trainctl.node.extract import safe_extract
from trainctl.packaging import PackagedSource, list_included_files, package_source

BIG = 1 << 30


def write(path: Path, text: str = "x", *, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def make_tree(root: Path) -> Path:
    write(root / "train.py", "print('train')\n")
    write(root / "run.sh", "#!/bin/sh\necho hi\n", mode=0o755)
    write(root / "pkg" / "__init__.py", "")
    write(root / "pkg" / "model.py", "W = 1\n")
    write(root / "configs" / "base.yaml", "lr: 0.1\n")
    return root


def tar_names(archive: Path) -> list[str]:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.getnames()


def tar_files(archive: Path) -> list[str]:
    with tarfile.open(archive, "r:gz") as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


# --------------------------------------------------------------------------- reproducibility


def test_same_tree_gives_same_bytes_regardless_of_mtimes_and_permissions(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    first = package_source(src, tmp_path / "a.tar.gz", max_bytes=BIG)

    for p in src.rglob("*"):
        os.utime(p, (1_000_000_000, 1_234_567_890))
    (src / "train.py").chmod(0o600)  # permission change without the executable bit
    (src / "run.sh").chmod(0o700)  # still executable
    second = package_source(src, tmp_path / "b.tar.gz", max_bytes=BIG)

    assert isinstance(first, PackagedSource)
    assert first.sha256 == second.sha256
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()


def test_same_content_built_in_another_order_and_place_gives_same_bytes(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "one")
    b = tmp_path / "elsewhere" / "two"
    # Created in reverse order, so directory listing order differs.
    write(b / "configs" / "base.yaml", "lr: 0.1\n")
    write(b / "pkg" / "model.py", "W = 1\n")
    write(b / "pkg" / "__init__.py", "")
    write(b / "run.sh", "#!/bin/sh\necho hi\n", mode=0o755)
    write(b / "train.py", "print('train')\n")
    assert (
        package_source(a, tmp_path / "a.tgz", max_bytes=BIG).sha256
        == package_source(b, tmp_path / "b.tgz", max_bytes=BIG).sha256
    )


def test_content_change_changes_the_hash(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    before = package_source(src, tmp_path / "a.tar.gz", max_bytes=BIG)
    write(src / "pkg" / "model.py", "W = 2\n")
    after = package_source(src, tmp_path / "b.tar.gz", max_bytes=BIG)
    assert before.sha256 != after.sha256


def test_exec_bit_change_changes_the_hash(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    before = package_source(src, tmp_path / "a.tar.gz", max_bytes=BIG)
    (src / "run.sh").chmod(0o644)
    after = package_source(src, tmp_path / "b.tar.gz", max_bytes=BIG)
    assert before.sha256 != after.sha256


def test_archive_metadata_is_normalised(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    result = package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)

    raw = result.path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert raw[3] & 0x08 == 0  # FNAME flag: no file name in the gzip header
    assert raw[4:8] == b"\x00\x00\x00\x00"  # gzip mtime
    assert result.size == len(raw)
    assert result.sha256 == hashlib.sha256(raw).hexdigest()

    with tarfile.open(result.path, "r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert names == [
        "configs",
        "configs/base.yaml",
        "pkg",
        "pkg/__init__.py",
        "pkg/model.py",
        "run.sh",
        "train.py",
    ]
    for m in members:
        assert not m.name.startswith(("/", "./"))
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        if m.isdir() or m.name == "run.sh":
            assert m.mode == 0o755
        else:
            assert m.isfile()
            assert m.mode == 0o644
    assert result.file_count == 5
    assert result.source_bytes == sum(
        (src / n).stat().st_size for n in names if (src / n).is_file()
    )


def test_dest_may_be_a_directory_or_inside_the_source(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    into_dir = package_source(src, out_dir, max_bytes=BIG)
    assert into_dir.path == out_dir / "source.tar.gz"

    # A previous archive inside the tree must not end up in the next one.
    first = package_source(src, src / "source.tar.gz", max_bytes=BIG)
    second = package_source(src, src / "source.tar.gz", max_bytes=BIG)
    assert first.sha256 == second.sha256 == into_dir.sha256
    assert "source.tar.gz" not in tar_names(second.path)
    assert [p.name for p in src.iterdir() if p.name.endswith(".tmp")] == []


# --------------------------------------------------------------------------- exclusions


def test_builtin_exclusions(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    write(src / ".git" / "config")
    write(src / ".git" / "objects" / "ab" / "cdef")
    write(src / "pkg" / "__pycache__" / "model.cpython-311.pyc")
    write(src / "stray.pyc")
    write(src / "stray.pyo")
    write(src / ".DS_Store")
    write(src / "pkg" / ".DS_Store")
    write(src / "node_modules" / "left-pad" / "index.js")
    write(src / ".mypy_cache" / "x.json")
    write(src / ".pytest_cache" / "v" / "x")
    write(src / ".ruff_cache" / "x")
    write(src / ".ipynb_checkpoints" / "nb.ipynb")
    write(src / ".tox" / "py311" / "x")
    write(src / ".nox" / "x")
    write(src / ".hg" / "x")
    write(src / ".svn" / "x")
    write(src / "myenv" / "pyvenv.cfg", "home = /usr/bin\n")
    write(src / "myenv" / "lib" / "site.py")
    write(src / "tools" / "condaenv" / "conda-meta" / "history")
    write(src / "tools" / "condaenv" / "bin" / "python")
    write(src / "tools" / "keep.py")
    # Only directories with these names are excluded, not files.
    write(src / "docs" / "node_modules.md")

    assert list_included_files(src) == [
        "configs/base.yaml",
        "docs/node_modules.md",
        "pkg/__init__.py",
        "pkg/model.py",
        "run.sh",
        "tools/keep.py",
        "train.py",
    ]


def test_gitignore_patterns_negation_and_directory_patterns(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    write(src / ".gitignore", "# comment\n*.log\n!keep.log\nbuild/\n/data\nlogs/*\n!logs/a.txt\n")
    write(src / "run.log")
    write(src / "keep.log")
    write(src / "pkg" / "deep.log")
    write(src / "build" / "out.bin")
    write(src / "pkg" / "build" / "out.bin")
    write(src / "notes" / "build")  # a file: 'build/' only matches directories
    write(src / "data" / "big.bin")
    write(src / "pkg" / "data" / "small.txt")  # '/data' is anchored to the top
    write(src / "logs" / "a.txt")
    write(src / "logs" / "b.txt")

    assert list_included_files(src) == [
        ".gitignore",
        "configs/base.yaml",
        "keep.log",
        "logs/a.txt",
        "notes/build",
        "pkg/__init__.py",
        "pkg/data/small.txt",
        "pkg/model.py",
        "run.sh",
        "train.py",
    ]


def test_trainctlignore_applies_after_gitignore(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    write(src / ".gitignore", "*.ckpt\n")
    write(src / ".trainctlignore", "datasets/\n!best.ckpt\n.trainctlignore\n")
    write(src / "datasets" / "train.csv")
    write(src / "last.ckpt")
    write(src / "best.ckpt")

    assert list_included_files(src) == [
        ".gitignore",
        "best.ckpt",
        "configs/base.yaml",
        "pkg/__init__.py",
        "pkg/model.py",
        "run.sh",
        "train.py",
    ]


def test_nested_gitignore_is_relative_to_its_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / ".gitignore", "*.log\n")
    write(src / "top.tmp")
    write(src / "sub" / ".gitignore", "*.tmp\n!important.log\n/local.txt\n")
    write(src / "sub" / "x.tmp")
    write(src / "sub" / "important.log")
    write(src / "sub" / "other.log")
    write(src / "sub" / "local.txt")
    write(src / "sub" / "deeper" / "local.txt")
    write(src / "local.txt")

    assert list_included_files(src) == [
        ".gitignore",
        "local.txt",
        "sub/.gitignore",
        "sub/deeper/local.txt",
        "sub/important.log",
        "top.tmp",
    ]


def test_archive_holds_exactly_the_listed_files(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    write(src / ".gitignore", "*.log\n")
    write(src / "x.log")
    write(src / ".git" / "HEAD")
    result = package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)
    assert tar_files(result.path) == list_included_files(src)
    assert result.file_count == len(list_included_files(src))


# --------------------------------------------------------------------------- symlinks


def test_symlink_to_file_inside_is_archived_as_its_contents(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "alias.py").symlink_to("pkg/model.py")
    (src / "pkg" / "up.yaml").symlink_to("../configs/base.yaml")
    (src / "linked_dir").symlink_to("pkg", target_is_directory=True)
    outside_dir = tmp_path / "outside_dir"
    outside_dir.mkdir()
    (src / "outside_dir_link").symlink_to(outside_dir, target_is_directory=True)

    result = package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)
    with tarfile.open(result.path, "r:gz") as tar:
        alias = tar.getmember("alias.py")
        up = tar.getmember("pkg/up.yaml")
        assert alias.isfile() and up.isfile()
        assert tar.extractfile(alias).read() == b"W = 1\n"  # type: ignore[union-attr]
        assert tar.extractfile(up).read() == b"lr: 0.1\n"  # type: ignore[union-attr]
        names = tar.getnames()
    # Symlinked directories are not followed, inside or out.
    assert not any(n.startswith(("linked_dir", "outside_dir_link")) for n in names)


def test_symlink_to_file_outside_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    secret = write(tmp_path / "secret.txt", "hunter2")
    (src / "pkg" / "creds").symlink_to(secret)
    dest = tmp_path / "out.tar.gz"

    with pytest.raises(PackagingError, match="creds") as info:
        package_source(src, dest, max_bytes=BIG)
    assert "outside" in str(info.value)
    assert not dest.exists()
    assert list(tmp_path.glob("*.tmp")) == []


def test_symlink_outside_can_be_silenced_by_ignoring_it(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "creds").symlink_to(write(tmp_path / "secret.txt"))
    write(src / ".trainctlignore", "creds\n")
    assert "creds" not in list_included_files(src)


def test_broken_symlink_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "dangling").symlink_to("nope.txt")
    with pytest.raises(PackagingError, match="dangling"):
        package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)


# --------------------------------------------------------------------------- limits and errors


def test_size_limit_names_source_dir_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "train.py", "print(1)\n")
    (src / "data.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    dest = tmp_path / "out" / "source.tar.gz"

    with pytest.raises(SpecError) as info:
        package_source(src, dest, max_bytes=2 * 1024 * 1024)
    err = info.value
    assert err.field == "source_dir"
    assert str(src) in err.message
    assert "3.0 MiB" in err.message and "2.0 MiB limit" in err.message
    assert "TRAINCTL_MAX_SOURCE_MB" in err.message and ".trainctlignore" in err.message
    assert not dest.parent.exists()

    # Excluding the data brings it under the limit.
    write(src / ".trainctlignore", "*.bin\n")
    assert package_source(src, dest, max_bytes=2 * 1024 * 1024).file_count == 2


def test_ignored_files_do_not_count_towards_the_limit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "train.py")
    (src / ".git").mkdir()
    (src / ".git" / "pack").write_bytes(b"\0" * 4096)
    assert package_source(src, tmp_path / "o.tgz", max_bytes=100).source_bytes == 1


def test_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree(tmp_path / "src")
    target = str(src / "pkg" / "model.py")
    real_access = os.access
    # Root can read anything, so simulate the permission check instead of chmod 000.
    monkeypatch.setattr(
        packaging.os,
        "access",
        lambda p, m, **kw: False if str(p) == target else real_access(p, m, **kw),
    )
    dest = tmp_path / "out.tar.gz"
    with pytest.raises(PackagingError, match=r"model\.py"):
        package_source(src, dest, max_bytes=BIG)
    assert not dest.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a mode 000 file")
def test_unreadable_file_for_real(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "train.py").chmod(0)
    with pytest.raises(PackagingError, match=r"train\.py"):
        package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)


def test_source_dir_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="source_dir"):
        package_source(tmp_path / "missing", tmp_path / "out.tar.gz", max_bytes=BIG)


# --------------------------------------------------------------------------- extraction


def test_round_trip_preserves_files_and_exec_bits(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    write(src / ".gitignore", "*.log\n")
    write(src / "x.log")
    (src / "alias.py").symlink_to("pkg/model.py")
    result = package_source(src, tmp_path / "out.tar.gz", max_bytes=BIG)

    dest = tmp_path / "extracted"
    names = safe_extract(result.path, dest)
    assert names == tar_names(result.path)

    extracted = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert extracted == list_included_files(src)
    for rel in extracted:
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
        assert not (dest / rel).is_symlink()
    assert os.access(dest / "run.sh", os.X_OK) and (dest / "run.sh").stat().st_mode & 0o100
    assert not (dest / "train.py").stat().st_mode & 0o111


def crafted(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def reg(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), b"payload"


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, None


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([reg("ok.txt"), reg("/etc/evil")], "absolute path"),
        ([reg("ok.txt"), reg("../evil")], r"'\.\.'"),
        ([reg("ok.txt"), reg("sub/../../evil")], r"'\.\.'"),
        ([reg("ok.txt"), link("etc", "/etc")], "absolute"),
        ([reg("ok.txt"), link("up", "../../etc/passwd")], "escapes"),
        ([reg("ok.txt"), link("sub/up", "../..")], "escapes"),
        ([reg("ok.txt"), link("hard", "../outside.txt", tarfile.LNKTYPE)], "escapes"),
        ([reg("ok.txt"), link("hard", "/etc/passwd", tarfile.LNKTYPE)], "absolute"),
        # Each link looks contained on its own; together 'a/b' lands in dest's parent.
        ([link("a", "."), link("a/b", "..")], "through the link"),
        ([link("a", "."), reg("a/file")], "through the link"),
        ([link("a", "."), link("b", "a/..")], "through the link"),
        ([reg("ok.txt"), special("null", tarfile.CHRTYPE)], "device file"),
        ([reg("ok.txt"), special("disk", tarfile.BLKTYPE)], "device file"),
        ([reg("ok.txt"), special("pipe", tarfile.FIFOTYPE)], "fifo"),
    ],
)
def test_safe_extract_refuses_crafted_archives_before_writing(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], reason: str
) -> None:
    archive = crafted(tmp_path / "evil.tar.gz", *members)
    dest = tmp_path / "dest"
    with pytest.raises(PackagingError, match=r"refusing archive member .*" + reason):
        safe_extract(archive, dest)
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar.gz"]


def test_safe_extract_allows_links_that_stay_inside(tmp_path: Path) -> None:
    archive = crafted(
        tmp_path / "ok.tar.gz",
        reg("pkg/model.py"),
        link("alias.py", "pkg/model.py"),
        link("pkg/again.py", "../pkg/model.py"),
    )
    dest = tmp_path / "dest"
    assert safe_extract(archive, dest) == ["pkg/model.py", "alias.py", "pkg/again.py"]
    assert (dest / "alias.py").read_bytes() == b"payload"
    assert (dest / "pkg" / "again.py").read_bytes() == b"payload"


def test_safe_extract_reports_corrupt_archives(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(PackagingError, match=r"bad\.tar\.gz"):
        safe_extract(bad, tmp_path / "dest")
