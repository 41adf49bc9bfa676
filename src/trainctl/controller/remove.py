"""Deleting finished jobs: `trainctl rm`, `trainctl prune` and `TrainingJob.remove()`.

A job is removed with everything trainctl keeps of it: its store prefix (record, events,
logs, metrics, and the outputs and checkpoints kept there by default), its node
directories under `$TRAINCTL_HOME/nodes`, and its claims on local checkpoint directories.
What the user named as a destination outside the job's prefix (an `output_path`, a
`checkpoint_s3_uri`) is the user's and stays, as do the content-addressed source archives
other jobs may share. A job that has not ended is never removed.

A job whose record cannot be read (truncated, edited, another tool's or another version's)
has no state to judge it by: it is removed only when asked for by name with `unreadable`
(`trainctl rm --unreadable`), and never while a controller holds its lease.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from trainctl.controller.detached import (
    SUPERVISOR_LOG_PREFIX,
    controller_log_path,
    controller_logs,
    file_log,
)
from trainctl.errors import SpecError, TrainctlError, UnreadableRecordError
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys, parse_iso
from trainctl.record.models import JobRecord
from trainctl.record.search import scan_jobs, state_names
from trainctl.spec.settings import get_settings
from trainctl.state import JobState
from trainctl.store import Store


def refusal(store: Store, record: JobRecord) -> str | None:
    """Why `record` may not be removed now (None: it may)."""
    from trainctl.controller.lease import lease_is_live

    if not record.state.is_terminal():
        return (
            f"job {record.name} is {record.state.value}; only an ended job is removed "
            f"(`trainctl stop {record.name}` ends it)"
        )
    if lease_is_live(JobStore(store, record.name)):
        return f"job {record.name}'s controller is still tearing it down; try again shortly"
    return None


def removable_jobs(store: Store, names: list[str], *, unreadable: bool = False) -> list[str]:
    """`names` (each once) if every one may be removed: else NotFoundError for an unknown
    name, SpecError for a job that has not ended, or whose record cannot be read (unless
    `unreadable`: then only while no controller holds it)."""
    from trainctl.controller.lease import lease_is_live

    chosen = list(dict.fromkeys(names))
    for name in chosen:
        jobs = JobStore(store, name)
        try:
            record = jobs.load()
        except UnreadableRecordError as exc:
            if not unreadable:
                raise SpecError(
                    "JOB", f"{exc}; `trainctl rm --unreadable {name}` deletes it as it is"
                ) from None
            if lease_is_live(jobs):
                raise SpecError(
                    "JOB", f"job {name}'s record cannot be read but a controller holds it"
                ) from None
            continue
        if why := refusal(store, record):
            raise SpecError("JOB", why)
    return chosen


def remove_jobs(store: Store, names: list[str], *, unreadable: bool = False) -> list[str]:
    """Remove every job of `names`, or none (see removable_jobs: nothing is deleted when
    one may not be); `unreadable`: those whose record cannot be read too."""
    chosen = removable_jobs(store, names, unreadable=unreadable)
    for name in chosen:
        _remove(store, name)
    return chosen


def prune_candidates(
    store: Store, *, older_than: float | None = None, states: list[str] | None = None
) -> list[JobRecord]:
    """The ended jobs `prune` would remove: those that ended more than `older_than`
    seconds ago (None: any), in one of `states` (None: any ended state)."""
    allowed = [s.value for s in JobState if s.is_terminal()]
    wanted = state_names(states, allowed, "an ended state")
    now = time.time()
    chosen = []
    for record in scan_jobs(store)[0]:
        if record.state.value not in allowed or (wanted and record.state.value not in wanted):
            continue
        ended = record.ended_at or record.created_at
        if older_than is not None and now - parse_iso(ended) < older_than:
            continue
        if refusal(store, record) is None:
            chosen.append(record)
    return chosen


def _remove(store: Store, name: str) -> None:
    prefix = JobKeys(name).prefix
    record_key = JobKeys(name).record
    # The record goes last: a removal cut short leaves a job that is still listed, and
    # `trainctl rm` finishes it.
    for info in list(store.list(prefix)):
        if info.key != record_key:
            store.delete(info.key)
    store.delete(record_key)
    store.delete_prefix(prefix)  # what a file:// store keeps beside the objects (locks)
    home = get_settings().home
    shutil.rmtree(home / "nodes" / name, ignore_errors=True)
    controller_log_path(name).unlink(missing_ok=True)  # a controller ended before filing it
    _release_checkpoint_claims(home / "checkpoint-dirs", name)


def _release_checkpoint_claims(claims: Path, name: str) -> None:
    for claim in claims.glob("*.json") if claims.is_dir() else []:
        try:
            owner = json.loads(claim.read_text()).get("job")
        except (OSError, ValueError, AttributeError):
            continue
        if owner == name:
            claim.unlink(missing_ok=True)


def local_leftovers(store: Store) -> list[dict[str, str]]:
    """What ended jobs left on this machine, for `trainctl gc` (no cloud settings needed):
    node directories under `$TRAINCTL_HOME/nodes` of jobs that have ended (a controller
    killed before its teardown), and claims on locations (trainctl.claims) whose job has
    ended or never got its record. A job that has not ended, or that gc cannot judge (not
    in this store, unreadable), keeps what it has."""
    from trainctl.claims import stale_claims
    from trainctl.controller.lease import lease_is_live
    from trainctl.errors import NotFoundError

    found: list[dict[str, str]] = []
    nodes = get_settings().home / "nodes"
    for directory in sorted(nodes.iterdir()) if nodes.is_dir() else []:
        try:
            jobs = JobStore(store, directory.name)
            record = jobs.load()
        except (SpecError, NotFoundError, UnreadableRecordError):
            continue
        if record.state.is_terminal() and not lease_is_live(jobs):
            found.append({"kind": "node-dir", "id": str(directory), "job": record.name})
    holder = JobStore.claim_holder(store)
    for key, claim in stale_claims(store, holder):
        found.append({"kind": "claim", "id": str(claim.get("uri")), "job": str(claim.get("job")),
                      "key": key})  # fmt: skip
    return found + _stray_logs(store)


def _stray_logs(store: Store) -> list[dict[str, str]]:
    """Logs of detached controllers whose job has ended but that a process killed before
    its end left on this machine: `gc --yes` files each in the store, where the job's own
    would be (jobs/<job>/controller.log). (A tuning supervisor's: trainctl.tuning.loop.)"""
    from trainctl.controller.lease import lease_is_live
    from trainctl.errors import NotFoundError

    found = []
    for log in controller_logs():
        if log.stem.startswith(SUPERVISOR_LOG_PREFIX):
            continue
        try:
            jobs = JobStore(store, log.stem)
            if jobs.load().state.is_terminal() and not lease_is_live(jobs):
                where = {"kind": "controller-log", "key": jobs.keys.controller_log}
                found.append({**where, "id": str(log), "job": log.stem})
        except (SpecError, NotFoundError, UnreadableRecordError):
            continue  # not this store's, or not one gc can judge: it stays
    return found


def delete_local_leftovers(store: Store, found: list[dict[str, str]]) -> list[dict[str, str]]:
    """Delete what local_leftovers found (a node directory's processes are ended first);
    returns those that could not be deleted, each with its error."""
    from trainctl.provisioning.local import LocalProvider

    failed = []
    for item in found:
        try:
            if item["kind"] == "node-dir":
                LocalProvider().terminate(item["job"], grace=2.0)  # (may remove it too)
                if Path(item["id"]).exists():
                    shutil.rmtree(item["id"])
            elif item["kind"] == "claim":
                store.delete(item["key"])
            elif item["kind"] in ("controller-log", "supervisor-log"):
                file_log(store, Path(item["id"]), item["key"])
        except (OSError, TrainctlError) as exc:
            error = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            failed.append({**item, "error": error})
    return failed
