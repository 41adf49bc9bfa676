"""The job record read while another process creates or breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.errors import NotFoundError, UnreadableRecordError
from trainctl.record import JobKeys, JobRecord, JobStore
from trainctl.spec.job import JobSpec
from trainctl.store import open_store
from trainctl.store.local import LocalStore


def _record(store: LocalStore, name: str, source: Path) -> JobRecord:
    when = "2026-12-02T00:00:00Z"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text("pass\n")
    return JobRecord(
        name=name,
        spec=JobSpec(entry_point="train.py", source_dir=str(source)),
        store_uri=store.uri,
        source_uri=store.uri,
        source_sha256="0" * 64,
        owner="u",
        trainctl_version="0",
        created_at=when,
        updated_at=when,
    )


class _CreatedBetweenReads(LocalStore):
    """A store where the job is created by another process just after this reader's first
    read of the record missed it (seen in CI: a test polling a job an EC2 submit was
    creating)."""

    def __init__(self, root: Path, record: JobRecord) -> None:
        super().__init__(root)
        self._pending: JobRecord | None = record

    def get_bytes(self, key: str) -> bytes:
        try:
            return super().get_bytes(key)
        except NotFoundError:
            if self._pending is not None:
                record, self._pending = self._pending, None
                JobStore(LocalStore(self.root), record.name).create(record)
                JobStore(LocalStore(self.root), record.name).event("submitted")
            raise


@pytest.mark.timeout(10)
def test_a_record_created_while_it_is_read_is_read(tmp_path: Path) -> None:
    plain = LocalStore(tmp_path / "store")
    record = _record(plain, "new-job", tmp_path / "src")
    store = _CreatedBetweenReads(tmp_path / "store", record)
    assert JobStore(store, "new-job").load().name == "new-job"


@pytest.mark.timeout(10)
def test_a_missing_record_beside_files_is_unreadable_and_nothing_is_not_found(
    tmp_path: Path,
) -> None:
    from trainctl.errors import JobNotFoundError

    store = open_store(tmp_path.as_uri())
    store.put_text(JobKeys("gone-record").events, "{}\n")
    with pytest.raises(UnreadableRecordError, match="missing or not a file"):
        JobStore(store, "gone-record").load()
    with pytest.raises(JobNotFoundError):
        JobStore(store, "never-made").load()
