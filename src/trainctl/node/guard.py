"""What a node checks before it runs anything of a job: that the code is the code submitted,
and that the job's data stays the job's. Each failed check is a RefusedError: the attempt
fails, named, and is not retried (new capacity would find the same)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from trainctl.errors import RefusedError, SpecError
from trainctl.record.models import JobRecord
from trainctl.store import Store
from trainctl.store.local import file_sha256


def verify_source(archive: Path, record: JobRecord) -> None:
    """The downloaded source archive must hash to the record's source_sha256: a source
    object replaced in the store (content addressing makes every later submit of the same
    directory reuse it) must not run."""
    actual = file_sha256(archive)
    if actual != record.source_sha256:
        raise RefusedError(
            f"the source archive {record.source_uri} has sha256 {actual[:16]}..., not the "
            f"{record.source_sha256[:16]}... recorded at submit: the stored code was changed "
            "after the job was submitted (tampered?); resubmit to package it again"
        )


def check_job_uris(record: JobRecord) -> None:
    """The job's checkpoint, output and input URIs again (submit checked them): a record from
    an older trainctl, or one edited in the store, may not reach other jobs' data."""
    from trainctl.spec.checks import written_uris
    from trainctl.spec.confine import check_confined

    spec = record.spec
    try:
        for field, uri in written_uris(spec):
            check_confined(uri, field, record.store_uri)
        for name, uri in sorted(spec.inputs.items()):
            check_confined(uri, f"inputs.{name}", record.store_uri, reading=True)
    except SpecError as exc:
        raise RefusedError(str(exc)) from None


def check_claimed_locations(record: JobRecord) -> None:
    """Each location outside the store that the job writes to must still be the place
    claimed for it at submit: a file:// location is claimed by its path with links
    resolved (trainctl.claims), so one that resolves elsewhere now (a folder swapped for a
    link to a running job's checkpoints, or a user's `latest` link moved to another run)
    has no claim of this job's, and nothing is restored, written or pruned there."""
    from trainctl.record.locations import written_locations

    for field, uri in written_locations(record.spec, record.name):
        _check_claimed(record, field, uri)


def claimed_output_store(record: JobRecord) -> Store:
    """The job's output location (pinned: see LocalStore), checked as above: for what the
    controller writes there at the end (SageMaker's `failure` file), hours after the node
    checked it."""
    from trainctl.record.locations import output_store, per_job_store

    out = output_store(record, pinned=True)
    if record.spec.output_path:
        uri = per_job_store("output_path", record.spec.output_path, record.name).uri
        _check_claimed(record, "output_path", uri)
    return out


def _check_claimed(record: JobRecord, field: str, uri: str) -> None:
    from trainctl.claims import claim_key
    from trainctl.errors import NotFoundError
    from trainctl.store import open_store, parse_uri

    scheme, path = parse_uri(uri, field)
    if scheme != "file":
        return  # an S3 key has no links
    try:
        claim = json.loads(open_store(record.store_uri).get_bytes(claim_key(uri)))
    except (NotFoundError, ValueError):
        claim = None
    holder = claim.get("job") if isinstance(claim, dict) else None
    if holder != record.name:
        now = Path(path).resolve()
        raise RefusedError(
            f"{field}: {uri} now leads to {now}, not the place claimed for this job at "
            "submit (a link swapped in, or moved?); nothing is written there"
        )


def claim_checkpoint_dir(path: Path, record: JobRecord, home: Path, layout_root: Path) -> None:
    """A local checkpoint directory outside the node's own layout must be fresh (missing or
    empty) or this job's (claimed by an earlier attempt): the node uploads what it holds,
    and restores into it. The claim is kept under `home`, not in the directory, so a script
    that empties its checkpoint directory does not lose it."""
    from trainctl.spec.limits import system_path

    if path.resolve().is_relative_to(layout_root.resolve()):
        return
    # Its text was checked at submit; where it leads is checked here (a link to /usr, made
    # before or after submit, would have the node restore checkpoints into it).
    for spelling in dict.fromkeys((str(path), str(path.resolve()))):
        if (why := system_path(spelling)) is not None:
            shown = path if spelling == str(path) else f"{path} (a link to {spelling})"
            raise RefusedError(f"checkpoint_local_path: {shown} {why}")
    claims = home / "checkpoint-dirs"
    claim = claims / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32] + ".json")
    try:
        owner = json.loads(claim.read_text()).get("job")
    except (OSError, ValueError, AttributeError):
        owner = None
    if owner == record.name:
        return
    try:
        holds = any(path.iterdir())
    except FileNotFoundError:
        holds = False
    except OSError as exc:
        raise RefusedError(
            f"checkpoint_local_path: {path} cannot be read ({exc.strerror})"
        ) from None
    if holds:
        whose = f"job {owner!r}'s" if owner else "not made by this job"
        raise RefusedError(
            f"checkpoint_local_path: {path} is not empty and {whose}: the node would upload "
            "what it holds as this job's checkpoints; use an empty directory"
        )
    claims.mkdir(parents=True, exist_ok=True)
    tmp = claim.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"job": record.name, "path": str(path)}))
    os.replace(tmp, claim)
