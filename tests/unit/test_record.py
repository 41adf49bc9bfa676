"""The job record read while another process creates or breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.errors import NotFoundError, UnreadableRecordError
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys, parse_iso
from trainctl.record.models import JobRecord
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


@pytest.mark.timeout(10)
def test_progress_is_the_steps_done_of_the_work_known_and_the_time_left_at_the_latest_pace(
    tmp_path: Path,
) -> None:
    from trainctl.record.models import Attempt
    from trainctl.state import JobState

    record = _record(LocalStore(tmp_path / "store"), "paced", tmp_path / "src")
    assert record.progress() is None  # no total: nothing claimed
    record.spec = record.spec.model_copy(update={"total_steps": 1000})
    record.state = JobState.TRAINING
    # attempt 1 reached step 300; attempt 2 started at 22:00:00, spent 20 s on capacity and
    # 50 s in all before its first step, resumed from 250 and is at 400 100 s after that
    first = Attempt(number=1, started_at="2026-12-02T21:00:00Z", last_step=300)
    second = Attempt(
        number=2,
        started_at="2026-12-02T22:00:00Z",
        resumed_from_step=250,
        last_step=400,
        startup={"capacity": 20.0, "total": 50.0},  # (as an older record names it)
    )
    record.attempts = [first, second]
    now = parse_iso("2026-12-02T22:00:30Z") + 100
    assert record.progress(now) == {
        "step": 400,
        "total_steps": 1000,
        "fraction": 0.4,
        "steps_per_second": 1.5,
        "seconds_left": 400.0,
    }
    record.total_steps_reported = 800  # the script's word over the spec's
    assert record.progress(now)["total_steps"] == 800


@pytest.mark.timeout(10)
def test_a_step_message_with_its_total_sets_the_work_the_job_has(tmp_path: Path) -> None:
    from trainctl.controller.telemetry import Telemetry
    from trainctl.record.models import Attempt

    store = LocalStore(tmp_path / "store")
    record = _record(store, "told", tmp_path / "src")
    record.attempts = [Attempt(number=1, started_at="2026-12-02T22:00:00Z")]
    telemetry = Telemetry(JobStore(store, "told"), record, info=print)
    assert telemetry.progress_message(record.attempts[0], 0, {"event": "step", "step": 5})
    assert record.total_steps is None
    telemetry.progress_message(
        record.attempts[0], 0, {"event": "step", "step": 6, "total_steps": 90}
    )
    assert (record.total_steps, record.attempts[0].last_step) == (90, 6)
