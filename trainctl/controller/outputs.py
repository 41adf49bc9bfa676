"""Where a job's outputs go: `output_path/<job>/output/` if given, else the job's store dir."""

from __future__ import annotations

from trainctl.controller.record import JobKeys, JobRecord
from trainctl.store import Store, open_store


def output_store(record: JobRecord) -> Store:
    if record.spec.output_path:
        base = open_store(record.spec.output_path, field="output_path")
        return base.child(f"{record.name}/output")
    return open_store(record.store_uri).child(JobKeys(record.name).output)


def checkpoint_store(record: JobRecord) -> Store:
    """The job's checkpoint URI: checkpoint_s3_uri, else jobs/<job>/checkpoints/."""
    if record.spec.checkpoint_s3_uri:
        return open_store(record.spec.checkpoint_s3_uri, field="checkpoint_s3_uri")
    return open_store(record.store_uri).child(JobKeys(record.name).checkpoints)
