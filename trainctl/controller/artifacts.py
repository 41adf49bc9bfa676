"""A job's files in the store, for `trainctl artifacts` and `TrainingJob`-side browsing."""

from __future__ import annotations

from pathlib import Path

from trainctl.errors import NotFoundError, SpecError
from trainctl.record import JobKeys, JobStore, output_store
from trainctl.store import ObjectInfo, Store


def job_artifacts(store: Store, name: str) -> list[tuple[str, list[ObjectInfo]]]:
    """(root URI, files relative to it) for the job's directory and, if elsewhere, outputs."""
    record = JobStore(store, name).load()
    prefix = JobKeys(name).prefix
    job_root = store.child(prefix)
    groups = [(job_root.uri, list(job_root.list("")))]
    outputs = output_store(record)
    if not outputs.uri.startswith(job_root.uri + "/"):
        groups.append((outputs.uri, list(outputs.list(""))))
    return groups


def download_artifact(store: Store, name: str, path: str, dest: Path | None) -> Path:
    """Copy one of the job's files (path relative to the job's directory) to `dest`."""
    record = JobStore(store, name).load()
    clean = path.strip("/")
    if not clean or ".." in clean.split("/"):
        raise SpecError("PATH", f"{path!r} must be a file inside the job, e.g. output/model.tar.gz")
    target = dest or Path(clean.rsplit("/", 1)[-1])
    if target.is_dir():
        target = target / clean.rsplit("/", 1)[-1]
    candidates = [(store.child(JobKeys(name).prefix), clean)]
    if clean.startswith("output/"):
        candidates.append((output_store(record), clean[len("output/") :]))
    for root, key in candidates:
        try:
            root.get_file(key, target)
            return target
        except NotFoundError:
            continue
    raise NotFoundError(f"{path} not found in job {name!r}; see `trainctl artifacts {name}`")
