"""Reading and writing one job's record in the store (JobStore): job.json (atomic replace),
events.jsonl, metrics, the lease and its relayed notices, the stop marker, claims.

The controller that holds the lease is the only writer of job.json and events.jsonl; other
processes (status, stop, logs) read them, and ask for a stop by writing a marker."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any

from trainctl.clock import clock
from trainctl.errors import JobNotFoundError, NotFoundError
from trainctl.record.keys import (
    JobKeys,
    now_iso,
)
from trainctl.record.locations import written_locations
from trainctl.record.models import JobRecord
from trainctl.spec.job import JobSpec
from trainctl.state import JobState, can_transition
from trainctl.store import Store


def owner_id() -> str:
    try:
        user = os.getlogin()
    except OSError:
        user = os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class JobStore:
    """Reads and writes one job's record; the controller is the single writer."""

    def __init__(self, store: Store, name: str) -> None:
        from trainctl.errors import SpecError
        from trainctl.spec.checks import JOB_NAME_RE

        # Every command that names a job comes here: a path-like name ('d6/', '../x') is
        # bad input, never a store key of something else.
        if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name):
            raise SpecError(
                "job",
                f"{name!r} is not a job name: 1-63 letters, digits and hyphens, starting and "
                "ending with a letter or digit",
            )
        self.store = store
        self.name = name
        self.keys = JobKeys(name)

    def exists(self) -> bool:
        return self.store.exists(self.keys.record)

    def load(self) -> JobRecord:
        try:
            raw = self.store.get_bytes(self.keys.record)
        except NotFoundError:
            raw = self._record_after_remains()
        return parse_record(self.name, raw, self.store.url(self.keys.record))

    def _record_after_remains(self) -> bytes:
        """The record, read again when the job's directory holds files: a job being created
        writes its record first, so a reader that missed it may see its next files; only a
        record still missing then is unreadable."""
        if self._has_remains():
            try:
                return self.store.get_bytes(self.keys.record)
            except NotFoundError:
                from trainctl.errors import UnreadableRecordError

                raise UnreadableRecordError(
                    f"job {self.name!r}: its record {self.store.url(self.keys.record)} is "
                    "missing or not a file, but the job's directory holds files"
                ) from None
        raise JobNotFoundError(f"job {self.name!r} not found in {self.store.uri}") from None

    def _has_remains(self) -> bool:
        """Whether the job's directory holds anything though its record is gone (a record
        deleted or replaced by a directory): such a job is listed, and removed, as
        Unreadable rather than left in the store unseen. (A new job's record is its first
        object, and a removal deletes the record last.)"""
        prefix = self.keys.prefix
        if self.store.list_dirs(prefix):
            return True
        return next(iter(self.store.list(prefix)), None) is not None

    def save(self, record: JobRecord, *, prompt: bool = False) -> None:
        """Write the record; `prompt`: a periodic save that the next one repeats (see
        Store.prompt), which must not hold its caller in a long backoff."""
        record.updated_at = now_iso()
        store = self.store.prompt() if prompt else self.store
        store.put_text(self.keys.record, record.model_dump_json(indent=2))

    def create(self, record: JobRecord) -> bool:
        """Write a new job's record only if no job of that name exists (S3 If-None-Match: *,
        a lock locally): of two submits racing for one name exactly one wins. False: lost."""
        record.updated_at = now_iso()
        data = record.model_dump_json(indent=2).encode()
        return self.store.put_if(self.keys.record, data, version=None) is not None

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"time": now_iso(), "type": kind, **fields}, default=str)
        self.store.append_bytes(self.keys.events, (line + "\n").encode())

    def save_metric_points(self, points: list[dict[str, Any]], *, prompt: bool = False) -> None:
        """Add points ({"time", "name", "value", "rank"}) to the metric history: one new
        part object per call (no read-modify-write, whatever the store)."""
        if not points:
            return
        import os

        part = f"{self.keys.metrics}{int(clock().time() * 1000):015d}-{os.getpid()}.jsonl"
        store = self.store.prompt() if prompt else self.store
        store.put_text(part, "".join(json.dumps(p) + "\n" for p in points))

    def metric_history(self, record: JobRecord | None = None) -> list[dict[str, Any]]:
        """Every metric value in time order: {"time" (epoch seconds), "name", "value",
        "step", "attempt", "rank", "redone"} (see trainctl.metrics)."""
        from trainctl.metrics import mark_redone

        points = []
        for info in self.store.list(self.keys.metrics):
            try:
                raw = self.store.get_bytes(info.key)
            except NotFoundError:  # gone between list and get (a job deleted meanwhile)
                continue
            points.extend(p for p in json_lines(raw) if _metric_point(p))
        points.sort(key=lambda p: p["time"])
        record = record or self.load()
        mark_redone(points, {a.number: a.resumed_from_step for a in record.attempts})
        return points

    def events(self) -> list[dict[str, Any]]:
        try:
            raw = self.store.get_bytes(self.keys.events)
        except NotFoundError:
            return []
        return json_lines(raw)

    def transition(self, record: JobRecord, state: JobState, **detail: Any) -> None:
        """Move to `state`, recording the event; ignored if the record is already terminal."""
        if record.state == state:
            return
        if not can_transition(record.state, state):
            raise RuntimeError(f"invalid transition {record.state} -> {state}")
        previous = record.state
        record.state = state
        if state is JobState.PROVISIONING and record.started_at is None:
            record.started_at = now_iso()
        if state is JobState.TRAINING and record.training_started_at is None:
            record.training_started_at = now_iso()
        if state.is_terminal():
            record.ended_at = now_iso()
            # Before the record says it ended: a submit that finds the claim gone then
            # still finds this job running, never neither (see trainctl.claims). Best
            # effort: a claim left behind is stale once the record is terminal.
            from trainctl.errors import TrainctlError

            try:
                self.release_locations(record.spec)
            except TrainctlError:
                pass
        self.save(record)
        self.event("state", state=state.value, previous=previous.value, **detail)

    # -- the locations outside its directory that the job writes to ------------------------
    def claim_locations(self, spec: JobSpec) -> str:
        """Claim, create-if-absent, the locations `spec` writes to outside the job's
        directory: SpecError (the field, the job holding it) if a live job writes there or
        above or below it (see trainctl.claims). Returns the submit's claim token."""
        from trainctl.claims import take_claims

        return take_claims(
            self.store, self.name, written_locations(spec, self.name), self.claim_holder(self.store)
        )

    def release_locations(self, spec: JobSpec, *, token: str | None = None) -> None:
        """Give back the job's claims (`token`: only one submit's, before its record)."""
        from trainctl.claims import release_claims

        uris = [uri for _, uri in written_locations(spec, self.name)]
        release_claims(self.store, self.name, uris, token=token)

    @staticmethod
    def claim_holder(store: Store) -> Callable[[str], tuple[bool, str] | None]:
        """For trainctl.claims: (ended, state) of the job of `store` holding a claim;
        None: it has no record."""
        from trainctl.errors import SpecError, UnreadableRecordError

        def holder(name: str) -> tuple[bool, str] | None:
            try:
                record = JobStore(store, name).load()
            except JobNotFoundError:
                return None
            except SpecError:  # not a job name: a claim no job can hold
                return True, "not a job"
            except UnreadableRecordError:  # kept: `trainctl rm --unreadable` frees it
                return False, "Unreadable"
            return record.state.is_terminal(), record.state.value

        return holder

    # -- stop requests -------------------------------------------------------------------
    def request_stop(self, reason: str, *, keep_warm: bool = False) -> None:
        """Ask the job's controller to stop it; `keep_warm`: its capacity goes to a warm pool
        (with the job's keep_alive_period_in_seconds) rather than being terminated, as a
        tuning job's pruned trial hands its nodes to the next trial."""
        marker = {"time": now_iso(), "reason": reason, **({"keep_warm": True} if keep_warm else {})}
        self.store.put_text(self.keys.stop, json.dumps(marker))

    def stop_keeps_warm(self) -> bool:
        """Whether the stop asked for keeps the job's capacity warm (see request_stop)."""
        try:
            found = json.loads(self.store.get_bytes(self.keys.stop))
        except (NotFoundError, ValueError):
            return False
        return isinstance(found, dict) and found.get("keep_warm") is True

    def stop_requested(self) -> str | None:
        try:
            found = json.loads(self.store.get_bytes(self.keys.stop))
        except NotFoundError:
            return None
        except ValueError:  # a marker that is not JSON still asks for a stop
            return "stopped"
        return str(found.get("reason", "stopped")) if isinstance(found, dict) else "stopped"

    # -- lease ---------------------------------------------------------------------------
    def read_lease(self) -> dict[str, Any] | None:
        try:
            found = json.loads(self.store.get_bytes(self.keys.lease))
        except NotFoundError:
            return None
        except ValueError:  # unreadable: no one holds it (a new holder rewrites it)
            return {}
        return found if isinstance(found, dict) else {}


# The lease's field through which the controller relays interruption notices to the nodes
# (which read the lease anyway, for its liveness): {"attempt": k, "ranks": {rank: source}},
# "*" for every node of the attempt. One object read per node every control_poll_seconds,
# where a key per node polled by every node was most of a job's store requests.
NOTICES = "notices"
EVERY_NODE = "*"


def lease_notice(lease: dict[str, Any] | None, attempt: int, rank: int) -> str | None:
    """The interruption notice the controller's lease relays to node `rank` of `attempt`
    (what it is for), or None."""
    notices = lease.get(NOTICES) if isinstance(lease, dict) else None
    if not isinstance(notices, dict) or notices.get("attempt") != attempt:
        return None
    ranks = notices.get("ranks")
    if not isinstance(ranks, dict):
        return None
    source = ranks.get(str(rank), ranks.get(EVERY_NODE))
    return None if source is None else str(source)[:500] or "interruption notice"


def _metric_point(point: dict[str, Any]) -> bool:
    """Whether a stored metric point has the shape every reader relies on (a corrupt or
    hand-edited part is left out, not a traceback in `status` and `metrics`)."""

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    step, rank, attempt = point.get("step"), point.get("rank"), point.get("attempt")
    return (
        number(point.get("time"))
        and isinstance(point.get("name"), str)
        and number(point.get("value"))
        and (step is None or (isinstance(step, int) and not isinstance(step, bool)))
        and (rank is None or (isinstance(rank, int) and not isinstance(rank, bool)))
        and (attempt is None or (isinstance(attempt, int) and not isinstance(attempt, bool)))
    )


def json_lines(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl object; a line that is not one (a torn append, garbage)
    is left out rather than failing the whole history."""
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def parse_record(name: str, raw: bytes | str, where: str) -> JobRecord:
    """A job record from its stored text; UnreadableRecordError, one line naming the job
    and the problem, for anything else (truncated, binary, another schema or version)."""
    from pydantic import ValidationError

    from trainctl.errors import UnreadableRecordError
    from trainctl.spec.checks import RECORDED
    from trainctl.version import __version__

    def unreadable(problem: str) -> UnreadableRecordError:
        return UnreadableRecordError(f"job {name!r}: its record {where} {problem}")

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        what = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else "is not JSON"
        raise unreadable(f"{what} (truncated or overwritten?)") from None
    if not isinstance(data, dict):
        raise unreadable("is not a job record (not a JSON object)")
    try:
        record = JobRecord.model_validate(data, context={RECORDED: True})
    except ValidationError as exc:
        version = data.get("trainctl_version")
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "record"
        problem = f"does not match this trainctl's schema ({loc}: {first['msg']})"
        if isinstance(version, str) and version != __version__:
            problem += f"; it was written by trainctl {version[:40]}, this is {__version__}"
        raise unreadable(problem) from None
    except RecursionError:
        raise unreadable("is nested too deeply") from None
    if record.name != name:  # every command reaches the job's keys by the record's name
        raise unreadable(f"names another job ({record.name[:80]!r})")
    return record
