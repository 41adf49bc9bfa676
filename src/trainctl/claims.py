"""Claims on the locations a job writes to, taken create-if-absent in the store.

Two jobs submitted at the same moment both pass a "does a running job use this URI?" scan
before either is recorded. A claim closes that window the way a job's name is claimed: an
object under `.trainctl/claims/`, named by the location, written only if absent (S3
`If-None-Match: *`, a lock for a file store), so of two submits for one URI one wins.
Locations above or below each other have different names: after taking its claims a submit
looks at the others, and gives its own back if one overlaps (two such submits at once may
then both be refused; never both accepted).

A claim is released when its job ends (before the record says so: a submit that finds no
claim then still finds the job running). One left behind (a submitter killed between its
claim and its record, a controller lost) is stale once its job has ended or has no record
CLAIM_GRACE_SECONDS after it was taken, and is then replaced create-if-version-matches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from trainctl.clock import clock
from trainctl.errors import NotFoundError, SpecError
from trainctl.spec.confine import location, overlaps
from trainctl.store import Store

CLAIMS_PREFIX = ".trainctl/claims/"
# A claim whose job has no record yet is a submit on its way to recording it (the record
# follows the claim within seconds; the upload comes before both).
CLAIM_GRACE_SECONDS = 600.0
# holder(job) -> None where the job has no record, else (whether it has ended, its state)
Holder = Callable[[str], "tuple[bool, str] | None"]


def claim_key(uri: str) -> str:
    """The claim's key: the location as confine.location spells it (links resolved, slashes
    normalised), hashed; one name for every spelling of one place."""
    scheme, parts = location(uri)
    digest = hashlib.sha256(f"{scheme}:{'/'.join(parts)}".encode()).hexdigest()
    return f"{CLAIMS_PREFIX}{digest}.json"


def take_claims(store: Store, job: str, uris: list[tuple[str, str]], holder: Holder) -> str:
    """Claim each (field, uri) for `job`, or raise SpecError naming the field and the job
    that holds it (or a location above or below it); on refusal nothing of this submit's
    stays. Returns the submit's token (two submits may race for one job name: each gives
    back only its own claims; see release_claims)."""
    import secrets

    token = secrets.token_hex(16)
    taken: list[str] = []
    try:
        for field, uri in uris:
            taken.append(_take(store, job, token, field, uri, holder))
        for info in store.list(CLAIMS_PREFIX):
            if info.key in taken:
                continue
            other = _read(store, info.key)
            if other is None or other.get("job") == job or not _live(other, holder):
                continue
            for field, uri in uris:
                if overlaps(uri, str(other.get("uri", ""))):
                    raise _refusal(field, uri, other, holder)
    except BaseException:
        release_claims(store, job, [uri for _, uri in uris], token=token)
        raise
    return token


def release_claims(store: Store, job: str, uris: list[str], *, token: str | None = None) -> None:
    """Give back `job`'s claims on `uris` (another job's stay); with `token`, only those
    that one submit took (its job is not recorded: the name may be another submit's)."""
    for uri in uris:
        key = claim_key(uri)
        found = _read(store, key)
        if found is None or found.get("job") != job:
            continue
        if token is None or found.get("token") == token:
            store.delete(key)


def stale_claims(store: Store, holder: Holder) -> list[tuple[str, dict[str, Any]]]:
    """(key, claim) of every claim no live job holds (its job ended, or never got a record
    within the grace; a corrupt claim as {}): what `trainctl gc` deletes."""
    found = []
    for info in store.list(CLAIMS_PREFIX):
        try:
            claim = _parse(store.get_bytes(info.key))
        except NotFoundError:
            continue
        if claim is None or not _live(claim, holder):
            found.append((info.key, claim or {}))
    return found


def _take(store: Store, job: str, token: str, field: str, uri: str, holder: Holder) -> str:
    key = claim_key(uri)
    claim = {"job": job, "token": token, "uri": uri, "field": field, "time": clock().time()}
    body = json.dumps(claim).encode()
    version: str | None = None
    for _ in range(5):  # (each loss is to a submit that took or freed it meanwhile)
        if store.put_if(key, body, version=version) is not None:
            return key
        try:
            raw, version = store.get_versioned(key)
        except NotFoundError:
            version = None  # released meanwhile: take it
            continue
        other = _parse(raw)
        if other is not None and _live(other, holder):
            raise _refusal(field, uri, other, holder)
        # stale (its job ended, or never got a record): replaced only as it was read
    raise SpecError(field, f"{uri} is being claimed by other submits; try again")


def _live(claim: dict[str, Any], holder: Holder) -> bool:
    job = claim.get("job")
    if not isinstance(job, str):
        return False
    found = holder(job)
    if found is None:
        taken = claim.get("time")
        age = clock().time() - taken if isinstance(taken, int | float) else float("inf")
        return age < CLAIM_GRACE_SECONDS
    return not found[0]


def _refusal(field: str, uri: str, claim: dict[str, Any], holder: Holder) -> SpecError:
    job = claim.get("job")
    found = holder(str(job))
    state = found[1] if found else "being submitted"
    return SpecError(
        field,
        f"{uri} overlaps {claim.get('uri')}, where job {job!r} ({state}) writes; give each "
        "running job a location of its own",
    )


def _read(store: Store, key: str) -> dict[str, Any] | None:
    try:
        return _parse(store.get_bytes(key))
    except NotFoundError:
        return None


def _parse(raw: bytes) -> dict[str, Any] | None:
    """A claim; None for a corrupt one (no job holds it: it is replaced)."""
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
