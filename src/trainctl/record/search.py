"""Finding jobs in a store: every record, those that cannot be read (listed, never
skipped), and the filters `jobs`, `prune` and `rm` share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from trainctl.errors import JobNotFoundError
from trainctl.record.jobstore import (
    JobStore,
)
from trainctl.record.models import (
    JobRecord,
)
from trainctl.state import JobState
from trainctl.store import Store


class UnreadableJob(BaseModel):
    """A job whose record cannot be read: listed (state Unreadable), never skipped."""

    model_config = ConfigDict(extra="forbid")
    name: str
    problem: str

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "state": "Unreadable", "problem": self.problem}


def scan_jobs(
    store: Store, *, measurements: bool = True
) -> tuple[list[JobRecord], list[UnreadableJob]]:
    """Every job in the store, newest first, and those whose record cannot be read;
    `measurements=False` leaves out `trainctl diagnose`'s measurement runs."""
    from trainctl.errors import SpecError, UnreadableRecordError

    records, unreadable = [], []
    for name in store.list_dirs("jobs"):
        try:
            records.append(JobStore(store, name).load())
        except JobNotFoundError:
            continue  # no record (yet): nothing to list
        except (UnreadableRecordError, SpecError) as exc:
            unreadable.append(UnreadableJob(name=name, problem=str(exc)))
    if not measurements:
        records = [r for r in records if r.measurement_of is None]
    return sorted(records, key=lambda r: r.created_at, reverse=True), unreadable


def state_names(given: list[str] | None, allowed: list[str], what: str) -> set[str]:
    """The states a `--state` option names, matched in any case against `allowed`; a name
    that is not one of them is a SpecError saying it is not `what` and listing them."""
    from trainctl.errors import SpecError

    by_name = {name.lower(): name for name in allowed}
    wanted = set()
    for state in given or []:
        match = by_name.get(state.strip().lower())
        if match is None:
            shown = ", ".join(sorted(allowed))
            raise SpecError("--state", f"{state!r} is not {what}; allowed: {shown}")
        wanted.add(match)
    return wanted


def find_jobs(
    store: Store,
    *,
    every: bool = False,
    states: list[str] | None = None,
    pattern: str | None = None,
    limit: int | None = None,
) -> tuple[list[JobRecord], list[UnreadableJob]]:
    """The jobs `trainctl jobs` lists, newest first, and those whose record cannot be read.

    Without `every`, diagnose's measurement runs and tuning jobs' trials are left out
    (`trainctl tuning NAME` lists a tuning job's trials). `states`: only jobs in these
    (any case; `Unreadable` for records that cannot be read); `pattern`: a shell glob on
    the name (`train-*`); `limit`: the newest N readable jobs. Bad values: SpecError naming
    the option (--state, --limit)."""
    from fnmatch import fnmatchcase

    from trainctl.errors import SpecError

    if limit is not None and limit < 1:
        raise SpecError("--limit", f"must be 1 or more, got {limit}")
    known = [state.value for state in JobState] + ["Unreadable"]
    wanted = state_names(states, known, "a job state")
    records, unreadable = scan_jobs(store, measurements=every)
    if not every:
        records = [r for r in records if r.tuning_job is None]
    if pattern:
        records = [r for r in records if fnmatchcase(r.name, pattern)]
        unreadable = [u for u in unreadable if fnmatchcase(u.name, pattern)]
    if wanted:
        records = [r for r in records if r.state.value in wanted]
        unreadable = unreadable if "Unreadable" in wanted else []
    return records[:limit], unreadable


def list_jobs(store: Store) -> list[JobRecord]:
    """Every readable job in the store, newest first (see scan_jobs for the others)."""
    return scan_jobs(store)[0]
