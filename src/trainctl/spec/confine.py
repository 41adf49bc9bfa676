"""Which store locations a job may use: never the store's own records, never another job's.

The store holds every job's record, source and lease under a few top-level prefixes; a job
whose checkpoint or output URI were the store root (or inside `jobs/`) would restore other
jobs' records onto its nodes, and its checkpoint sync would overwrite or delete them. The
same check runs at submit (one line, before anything is made) and on every node before it
syncs anything (a record written by an older trainctl, or edited, is refused there too).
"""

from __future__ import annotations

from pathlib import Path

from trainctl.errors import SpecError
from trainctl.spec.uris import parse_uri

# Top-level prefixes of the store that belong to trainctl (record.JobKeys: jobs/<job>/...;
# record.source_key: sources/<sha>/...; controller.service: controllers/...; the write probe
# of preflight: .trainctl/; tuning jobs: tuning/). Everything else in a store (a SageMaker
# session's bucket/, say) is the user's.
RESERVED_PREFIXES = ("jobs", "sources", "controllers", "tuning", ".trainctl")
# What a job may read of another job's (its inputs): that job's results, nothing else.
READABLE_JOB_PARTS = ("output", "checkpoints")


def location(uri: str, field: str = "uri") -> tuple[str, tuple[str, ...]]:
    """(scheme, path parts) of a URI: a file:// path with its links resolved (a link to the
    store is the store), an S3 URI as bucket and key parts."""
    scheme, rest = parse_uri(uri, field)
    if scheme == "file":
        return scheme, Path(rest).resolve().parts[1:]
    return scheme, tuple(p for p in rest.split("/") if p)


def check_confined(uri: str, field: str, store_uri: str, *, reading: bool = False) -> None:
    """Raise SpecError naming `field` when `uri` is the store, holds it, or lies inside the
    store's reserved prefixes (`reading`: another job's output/ and checkpoints/ are fine)."""
    scheme, parts = location(uri, field)
    store_scheme, store = location(store_uri, "TRAINCTL_STORE")
    if scheme != store_scheme:
        return
    if parts[: len(store)] == store:
        rel = parts[len(store) :]
        if not rel:
            raise SpecError(field, f"{uri} is the store itself ({store_uri}); {_USE}")
        if rel[0] not in RESERVED_PREFIXES:
            return
        if reading and rel[0] == "jobs" and len(rel) >= 3 and rel[2] in READABLE_JOB_PARTS:
            return
        where = "/".join(rel[:2])
        raise SpecError(
            field, f"{uri} is inside the store's {where}/, which holds trainctl's records; {_USE}"
        )
    if store[: len(parts)] == parts:
        raise SpecError(field, f"{uri} holds the store ({store_uri}); {_USE}")


def overlaps(a: str, b: str) -> bool:
    """Whether one URI is the other or lies inside it."""
    (sa, pa), (sb, pb) = location(a), location(b)
    n = min(len(pa), len(pb))
    return sa == sb and pa[:n] == pb[:n]


_USE = "give a prefix of the job's own (e.g. s3://bucket/checkpoints/<job>/)"
