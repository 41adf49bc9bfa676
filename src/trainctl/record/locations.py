"""Where a job's outputs, checkpoints, TensorBoard logs and source go: the job's own folder
of the store, or the locations its spec names (SageMaker's per-job layout)."""

from __future__ import annotations

from trainctl.record.keys import (
    JobKeys,
    source_key,
)
from trainctl.record.models import (
    JobRecord,
)
from trainctl.spec.checks import written_uris
from trainctl.spec.job import JobSpec
from trainctl.store import Store, open_store

# Where a job's outputs go: `output_path/<job>/output/` if given, else the job's store dir.


def output_store(record: JobRecord, *, pinned: bool = False) -> Store:
    """Where the job's model and output data go (on S3: encrypted with output_kms_key, and
    tagged with the job's tags; `pinned`: a node's, see LocalStore)."""
    if record.spec.output_path:
        store = per_job_store("output_path", record.spec.output_path, record.name, pinned=pinned)
    else:
        store = open_store(record.store_uri, pinned=pinned).child(JobKeys(record.name).output)
    spec = record.spec
    if spec.output_kms_key or spec.tags:
        return store.writing_with(kms_key=spec.output_kms_key, tags=spec.tags)
    return store


# Locations that hold a folder per job under the URI given (SageMaker's layout), not the URI
PER_JOB = {"output_path": "output", "code_location": "source"}


def per_job_store(field: str, uri: str, name: str, *, pinned: bool = False) -> Store:
    """Job `name`'s own folder under a PER_JOB location: <uri>/<name>/output, .../source."""
    return open_store(uri, field=field, pinned=pinned).child(f"{name}/{PER_JOB[field]}")


def source_target(spec: JobSpec, name: str, store: Store, sha256: str) -> tuple[Store, str]:
    """Where job `name`'s packaged source goes: SageMaker's code_location/<job>/source/
    sourcedir.tar.gz when given, else the store's content-addressed sources/<sha256>/
    (shared by every job with that source)."""
    if spec.code_location:
        return per_job_store("code_location", spec.code_location, name), "sourcedir.tar.gz"
    return store, source_key(sha256)


def written_locations(spec: JobSpec, name: str) -> list[tuple[str, str]]:
    """(field, URI) of each location outside its directory in the store that job `name`
    writes to: its checkpoint and TensorBoard URIs, and its own folders under output_path
    and code_location, if given."""
    return [
        (field, per_job_store(field, uri, name).uri if field in PER_JOB else uri)
        for field, uri in written_uris(spec)
    ]


def tensorboard_store(record: JobRecord) -> Store:
    """Where the job's nodes copy their TensorBoard logs: tensorboard_s3_uri, else
    jobs/<job>/tensorboard/."""
    if record.spec.tensorboard_s3_uri:
        return open_store(record.spec.tensorboard_s3_uri, field="tensorboard_s3_uri")
    return open_store(record.store_uri).child(JobKeys(record.name).tensorboard)


def checkpoint_store(record: JobRecord, *, pinned: bool = False) -> Store:
    """The job's checkpoint URI: checkpoint_s3_uri, else jobs/<job>/checkpoints/
    (`pinned`: a node's, which writes there; see LocalStore)."""
    if record.spec.checkpoint_s3_uri:
        uri = record.spec.checkpoint_s3_uri
        return open_store(uri, field="checkpoint_s3_uri", pinned=pinned)
    return open_store(record.store_uri, pinned=pinned).child(JobKeys(record.name).checkpoints)
