"""Submitting, stopping and waiting for jobs: the calls the Estimator and the CLI share."""

from __future__ import annotations

import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainctl.controller.detached import spawn_controller
from trainctl.controller.lease import lease_is_live
from trainctl.errors import SpecError, TrainctlError
from trainctl.progress import progress_task
from trainctl.progress import status as progress_status
from trainctl.record.jobstore import JobStore, owner_id
from trainctl.record.keys import now_iso
from trainctl.record.locations import source_target
from trainctl.record.models import JobRecord
from trainctl.spec.checks import written_uris
from trainctl.spec.controller import ControllerTarget, controller_target
from trainctl.spec.job import JobSpec
from trainctl.spec.settings import get_settings
from trainctl.spec.uris import parse_uri
from trainctl.state import JobState
from trainctl.store import Store, default_store, open_store
from trainctl.version import __version__


def generate_job_name(entry_point: str) -> str:
    stem = "".join(c if c.isalnum() else "-" for c in Path(entry_point).stem).strip("-") or "job"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stem[:36].strip('-')}-{stamp}-{secrets.token_hex(2)}"


def validate_offline(spec: JobSpec, store_uri: str) -> None:
    """The checks that need no cloud call (a dry run makes these and no others)."""
    from trainctl.provisioning import get_provider
    from trainctl.provisioning.base import FaultInjection

    provider = get_provider(spec.instance_type, spec.region)
    provider.check_offline(spec, store_uri)
    if spec.faults and not isinstance(provider, FaultInjection):
        raise SpecError("faults", f"the {provider.name} provider cannot inject faults")
    target_of(spec, store_uri)
    if spec.image_uri or spec.build_image or spec.framework_version:
        from trainctl.image.preflight import check_container_runtime

        check_container_runtime(spec)
    for name, uri in spec.inputs.items():
        scheme, rest = parse_uri(uri, field=f"inputs.{name}")
        if scheme == "file" and not Path(rest).exists():
            raise SpecError(f"inputs.{name}", f"{uri} does not exist")
    if spec.provider == "local":
        check_channel_copies(spec, get_settings().home / "nodes")
        if spec.launcher == "mpi":
            check_mpirun()
    check_isolation(spec, store_uri)


def check_isolation(spec: JobSpec, store_uri: str) -> None:
    """The job's URIs stay out of the store's own records (see spec.confine)."""
    from trainctl.spec.confine import check_confined

    for field, uri in written_uris(spec):
        check_confined(uri, field, store_uri)
    for name, uri in sorted(spec.inputs.items()):
        check_confined(uri, f"inputs.{name}", store_uri, reading=True)


CONTINUED = {("checkpoint_s3_uri", "checkpoints"), ("tensorboard_s3_uri", "TensorBoard logs")}


def check_locations_apart(spec: JobSpec, name: str, store: Store) -> None:
    """Jobs cannot reach each other's data: job `name` never writes where another job of
    the store writes (its output or checkpoint location: the same, above or below), nor
    reads where a running one is writing. What an ended job made may be handed on: read
    as an input channel (`--inputs model=<its output>`), or its checkpoint URI continued
    as is (SageMaker's pattern of resuming from a prefix). Racing submits are kept apart
    by the claims their records take (JobStore.claim_locations)."""
    from trainctl.record.locations import (
        checkpoint_store,
        output_store,
        tensorboard_store,
        written_locations,
    )
    from trainctl.record.search import list_jobs
    from trainctl.spec.confine import location, overlaps

    writes = written_locations(spec, name)
    reads = [(f"inputs.{channel}", uri) for channel, uri in sorted(spec.inputs.items())]
    if not writes and not reads:
        return
    for other in list_jobs(store):
        ended = other.state.is_terminal()
        theirs = [
            ("output", output_store(other).uri),
            ("checkpoints", checkpoint_store(other).uri),
            ("TensorBoard logs", tensorboard_store(other).uri),
        ]
        for field, uri in writes + reads:
            for kind, their in theirs:
                if not overlaps(uri, their):
                    continue
                reading = field.startswith("inputs.")
                if reading and ended:
                    continue
                same = location(uri, field) == location(their)
                # an ended job's checkpoints or TensorBoard logs may be continued as they are
                if (field, kind) in CONTINUED and ended and same:
                    continue
                raise SpecError(field, _apart(uri, kind, other, their, reading=reading))


def _apart(uri: str, kind: str, other: JobRecord, their: str, *, reading: bool) -> str:
    job = f"job {other.name!r} ({other.state.value})"
    if reading:
        return f"{uri} overlaps the {kind} of {job} at {their}; read it once that job has ended"
    if kind == "output":
        return (
            f"{uri} overlaps the output of {job} at {their}: a job never writes another's "
            f"output; read it as an input channel (--inputs model={their})"
        )
    if other.state.is_terminal():
        return (
            f"{uri} overlaps the {kind} of {job} at {their}; an ended job's {kind} "
            "are continued at exactly their URI, or give a prefix of the job's own"
        )
    return (
        f"{uri} overlaps the {kind} of {job} at {their}; give each running job a prefix of its own"
    )


def check_mpirun() -> None:
    import shutil

    if shutil.which("mpirun") is None:
        raise SpecError(
            "distribution",
            "mpi needs mpirun on this machine, and none is on PATH (install Open MPI, e.g. "
            "apt install openmpi-bin), or use torch_distributed",
        )


def check_channel_copies(spec: JobSpec, nodes_dir: Path) -> None:
    """Each local node gets its own copy of a file:// channel (File mode): refuse a job whose
    copies the disk under `nodes_dir` cannot hold, naming the channel that does not fit."""
    import shutil

    from rich.filesize import decimal

    where = nodes_dir
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    need = 0
    for name, uri in sorted(spec.inputs.items()):
        config = spec.channel_config.get(name)
        scheme, rest = parse_uri(uri, field=f"inputs.{name}")
        if scheme != "file" or (config is not None and config.input_mode == "FastFile"):
            continue
        sharded = config is not None and config.distribution == "ShardedByS3Key"
        need += _tree_size(Path(rest)) * (1 if sharded else spec.instance_count)
        if need > free:
            raise SpecError(
                f"inputs.{name}",
                f"a copy per node needs {decimal(need)} and {where} has {decimal(free)} free; "
                f"link the channel instead with input mode FastFile (--input-mode "
                f"{name}=FastFile, or TrainingInput(..., input_mode='FastFile'))",
            )


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _, files in os.walk(path):
        for leaf in files:
            try:
                total += os.stat(os.path.join(dirpath, leaf)).st_size
            except OSError:
                continue
    return total


def preflight(spec: JobSpec, store_uri: str) -> None:
    """Checks that need the outside world, done before anything is uploaded or started."""
    from trainctl.provisioning import get_provider
    from trainctl.spec.request import CapacityRequest

    validate_offline(spec, store_uri)
    check_reachable(store_uri, "TRAINCTL_STORE")
    check_controller_reachable(target_of(spec, store_uri))
    get_provider(spec.instance_type, spec.region).preflight(CapacityRequest.of(spec))
    for name, uri in sorted(spec.inputs.items()):
        if uri.startswith("s3://"):
            check_readable(uri, f"inputs.{name}")
    for field, uri in written_uris(spec):
        check_writable(uri, field)


def target_of(spec: JobSpec, store_uri: str) -> ControllerTarget:
    """Where the job's controller runs (SpecError naming `controller` when it cannot)."""
    region = spec.region
    if spec.controller == "ec2" and region is None:
        from trainctl.provisioning.aws.clients import configured_region

        region = configured_region()
    return controller_target(spec.controller, store_uri=store_uri, region=region)


def check_controller_reachable(target: ControllerTarget) -> None:
    from trainctl.controller.remote import check_reachable
    from trainctl.errors import StoreError

    try:
        check_reachable(target)
    except (OSError, TrainctlError, StoreError) as exc:
        raise SpecError("controller", f"{target.label}: {exc}") from None


def check_reachable(uri: str, field: str) -> bool:
    """One quick listing (Store.probe): credentials that cannot reach `uri`, or an endpoint
    that does not answer, are one line before anything is made, not a node's failure.
    Returns whether anything is stored under `uri`."""
    from trainctl.errors import StoreError

    try:
        return open_store(uri, field=field).probe("")
    except (OSError, StoreError) as exc:
        raise SpecError(field, f"{uri} cannot be reached with your credentials: {exc}") from None


def check_readable(uri: str, field: str) -> None:
    """An s3:// input must be reachable and hold something: objects under the prefix, or
    the one object it names (the URI of a single file)."""
    from trainctl.errors import StoreError

    if check_reachable(uri, field):
        return
    parent, _, leaf = uri.rstrip("/").rpartition("/")
    try:
        found = "/" in uri.removeprefix("s3://").strip("/") and open_store(parent).exists(leaf)
    except (OSError, StoreError) as exc:
        raise SpecError(field, f"{uri} cannot be read: {exc}") from None
    if not found:
        raise SpecError(field, f"{uri} holds no object (an empty or mistyped prefix?)")


def check_writable(uri: str, field: str) -> None:
    """Write and delete a probe object, so a job does not train for hours to fail at upload.
    A folder is checked without making anything in it: a submit refused later (its
    location overlaps another job's) leaves nothing behind, in the other job's least."""
    from trainctl.errors import StoreError
    from trainctl.spec.uris import parse_uri

    scheme, path = parse_uri(uri, field)
    if scheme == "file":
        here = Path(path)
        while not here.exists() and here != here.parent:
            here = here.parent  # (what the job's first write makes)
        if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK):
            what = "is not a folder" if not here.is_dir() else "is not yours to write"
            raise SpecError(field, f"{uri} is not writable: {here} {what}")
        return
    check_reachable(uri, field)
    store = open_store(uri, field=field)
    key = f".trainctl/write-test-{secrets.token_hex(4)}"
    try:
        store.put_bytes(key, b"")
        store.delete(key)
    except (OSError, StoreError) as exc:
        raise SpecError(field, f"{uri} is not writable: {exc}") from None


def image_build_target(spec: JobSpec) -> tuple[str | None, bool]:
    """(repository, push) for the image a job builds: remote hosts pull it from the
    `image_repository` setting, so it is pushed there; a local job runs it where it is."""
    if spec.provider in ("ssh", "aws"):
        return get_settings().image_repository, True
    return None, False


def resolve_image(spec: JobSpec) -> JobSpec:
    """`spec` with the image its nodes run in `image_uri`, built here (cached by content
    hash) on the base image or the framework image; unchanged when it has one or needs none."""
    if not spec.builds_image:
        return spec
    from trainctl.image.build import job_image

    repository, push = image_build_target(spec)
    image = job_image(spec, repository=repository, push=push)
    return spec.model_copy(update={"image_uri": image})


def create_job(
    spec: JobSpec, store: Store | None = None, *, tuning_job: str | None = None
) -> JobRecord:
    """Validate, build the image, preflight, package and upload the source, and record the
    job (state Pending): each step its own function, in the order nothing is made before
    every check that can refuse the job has passed. `tuning_job`: the tuning job it is a
    trial of."""
    store = store or default_store()
    validate_offline(spec, store.uri)
    spec = resolve_image(spec)
    preflight(spec, store.uri)
    jobs = claimable_name(store, spec.job_name or generate_job_name(spec.entry_point))
    check_locations_apart(spec, jobs.name, store)
    source = upload_source(spec, store, name=jobs.name)
    return _record_new_job(
        jobs,
        spec.model_copy(update={"job_name": jobs.name}),
        source.uri,
        source.sha256,
        tuning_job=tuning_job,
        files=source.files,
        bytes=source.size,
    )


def claimable_name(store: Store, name: str) -> JobStore:
    """The new job's keys, refused (before anything is uploaded) if the name is taken."""
    jobs = JobStore(store, name)
    if jobs.exists():
        raise SpecError("job_name", f"a job named {name!r} already exists in {store.uri}")
    return jobs


@dataclass(frozen=True)
class UploadedSource:
    uri: str
    sha256: str
    files: int
    size: int


def upload_source(spec: JobSpec, store: Store, *, name: str = "") -> UploadedSource:
    """Package source_dir and put it in the store under its content hash: an unchanged
    source is not sent again, if what is stored under its name still has its content (a
    replaced object is overwritten, not reused). With code_location, job `name`'s folder
    there instead (record.source_target)."""
    from trainctl.errors import PackagingError
    from trainctl.packaging import package_source

    settings = get_settings()
    with tempfile.TemporaryDirectory(prefix="trainctl-pkg-") as tmp:
        with progress_status(f"packaging {spec.source_dir}"):
            try:
                packaged = package_source(
                    Path(spec.source_dir),
                    Path(tmp) / "sourcedir.tar.gz",
                    max_bytes=int(settings.max_source_mb * 1024 * 1024),
                )
            except PackagingError as exc:  # what is in source_dir: the user's input
                raise SpecError("source_dir", str(exc)) from None
        target, key = source_target(spec, name, store, packaged.sha256)
        if not target.matches(key, packaged.path):
            with progress_task("uploading source", total=packaged.size) as advance:
                target.put_file(key, packaged.path, progress=advance)
    return UploadedSource(target.url(key), packaged.sha256, packaged.file_count, packaged.size)


@dataclass(frozen=True)
class RunOutcome:
    """How `run_job` ended: `record` is the job's last state seen (its start, when
    detached); `handed_off`: the terminal closed and a detached controller runs the job;
    `interrupted`: the user pressed Ctrl-C (the job was stopped)."""

    record: JobRecord
    detached: bool = False
    handed_off: bool = False
    interrupted: bool = False

    @property
    def completed(self) -> bool:
        return self.record.state is JobState.COMPLETED


def run_job(
    store: Store,
    record: JobRecord,
    *,
    printer: Any = None,
    wait: bool = True,
    follow_after_hand_off: bool = True,
) -> RunOutcome:
    """Run a recorded job, the one way both front doors (Estimator.fit, `trainctl submit`)
    do: without `wait`, start a detached controller and return; with a remote controller,
    start it and follow the job (taking it over should that controller be lost); else run
    the controller in this process. A closed terminal hands the job to a detached
    controller; with `follow_after_hand_off` this process then follows it, silently, to the
    job's end. `printer` (LogPrinter-like, or None) gets the logs and a closing summary."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.supervise import supervise

    spec = record.spec
    if not wait or spec.controller != "local":
        start_detached(store, record)
        if not wait:
            return RunOutcome(record, detached=True)
        if printer:
            printer.info(f"job {record.name} submitted (controller {spec.controller})")
        final = supervise(store, record.name, printer=printer)
        if printer:
            print_summary(printer, final)
        return RunOutcome(final)
    if printer:
        printer.info(f"job {record.name} submitted (store {store.uri})")
    controller = Controller(store, record.name, printer=printer)
    final = controller.run()
    if controller.handed_off:
        if not follow_after_hand_off:
            return RunOutcome(final, handed_off=True)
        printer = None  # the terminal is gone
        final = supervise(store, record.name, printer=None)
    if printer:
        print_summary(printer, final)
    return RunOutcome(
        final, handed_off=controller.handed_off, interrupted=controller.interrupted_by_user
    )


def print_summary(printer: Any, record: JobRecord) -> None:
    """The lines that close a followed job: its end, model, failure, and how to see it."""
    duration = f"{record.duration_s:.1f} s" if record.duration_s is not None else "-"
    printer.info(f"job {record.name}: {record.state.value} in {duration}")
    if record.model_data:
        printer.info(f"model: {record.model_data}")
    if record.failure_reason:
        printer.info(f"failure: {record.failure_reason}")
        if record.failure_detail:
            for line in record.failure_detail.splitlines():
                printer.info(f"  {line}")
    if record.stop_reason:
        printer.info(f"stopped: {record.stop_reason}")
    printer.info(f"see it again: trainctl status {record.name} · trainctl logs {record.name}")


def create_derived_job(
    store: Store,
    record: JobRecord,
    name: str,
    updates: dict[str, object],
    *,
    measurement: bool = False,
) -> JobRecord:
    """A new job (state Pending) that runs `record`'s packaged source with its spec changed
    by `updates`: nothing is packaged again (the source_dir may be gone, or have changed).
    A `measurement` run of `record` (diagnose's) is hidden from job lists."""
    from pydantic import ValidationError

    from trainctl.spec.build import spec_error
    from trainctl.spec.checks import RECORDED

    fields = {**record.spec.model_dump(), **updates, "job_name": name}
    try:
        spec = JobSpec.model_validate(fields, context={RECORDED: True})
    except ValidationError as exc:
        raise spec_error(exc) from None
    preflight(spec, store.uri)
    jobs = claimable_name(store, name)
    check_locations_apart(spec, name, store)
    return _record_new_job(
        jobs,
        spec,
        record.source_uri,
        record.source_sha256,
        measurement_of=record.name if measurement else None,
        of=record.name,
    )


def _record_new_job(
    jobs: JobStore,
    spec: JobSpec,
    source_uri: str,
    source_sha256: str,
    *,
    measurement_of: str | None = None,
    tuning_job: str | None = None,
    **source: object,
) -> JobRecord:
    """Record a job (state Pending) whose source is in the store."""
    now = now_iso()
    record = JobRecord(
        measurement_of=measurement_of,
        tuning_job=tuning_job,
        name=jobs.name,
        spec=spec,
        store_uri=jobs.store.uri,
        source_uri=source_uri,
        source_sha256=source_sha256,
        owner=owner_id(),
        trainctl_version=__version__,
        created_at=now,
        updated_at=now,
    )
    token = jobs.claim_locations(spec)  # (a submit racing for a location loses here)
    try:
        created = jobs.create(record)
    except BaseException:
        jobs.release_locations(spec, token=token)
        raise
    if not created:  # another submit took the name since we checked
        jobs.release_locations(spec, token=token)
        raise SpecError("job_name", f"a job named {jobs.name!r} already exists in {jobs.store.uri}")
    jobs.event("state", state=JobState.PENDING.value, previous=None)
    jobs.event("source", uri=source_uri, sha256=source_sha256, **source)
    return record


def start_detached(store: Store, record: JobRecord) -> None:
    """Start the job's controller away from this process: a detached local process, or the
    remote controller its spec names; returns once it is started (a remote one: once it
    holds the job's lease, so this machine may go away)."""
    target = target_of(record.spec, store.uri)
    if target.remote:
        from trainctl.controller.remote import start_remote_controller

        start_remote_controller(store, record.name, target)
    else:
        spawn_controller(store, record.name)


def job_is_live(store: Store, name: str) -> bool:
    """Whether `name` may still be using its resources, for `trainctl gc`: unknown jobs
    (another store's, say) and jobs whose record cannot be read count as live, so gc never
    deletes what it cannot judge (and one bad record does not stop it judging the rest)."""
    from trainctl.errors import NotFoundError, UnreadableRecordError

    jobs = JobStore(store, name)
    try:
        record = jobs.load()
    except NotFoundError:
        return _controller_is_live(store, name)
    except UnreadableRecordError:
        return True
    if record.state.is_terminal():
        return False
    return lease_is_live(jobs) or record.state is JobState.PENDING


def _controller_is_live(store: Store, name: str) -> bool:
    """For gc: an EC2 controller's resources (tagged as job `controller-ec2-<region>`) are
    live while its service is, or while a job assigned to it has not ended (it may be
    booting to take that job). A controller of another store (none of its keys here), like
    any other unknown name, counts as live."""
    from trainctl.controller.service import ServiceKeys, assigned_jobs, service_is_live
    from trainctl.errors import NotFoundError, UnreadableRecordError
    from trainctl.provisioning.aws.controller import is_controller_job, service_of

    if not is_controller_job(name):
        return True
    service = service_of(name)
    if not any(True for _ in store.list(ServiceKeys(service).prefix + "/")):
        return True
    if service_is_live(store, service):
        return True
    for job in assigned_jobs(store, service):
        try:
            if not JobStore(store, job).load().state.is_terminal():
                return True
        except NotFoundError:
            continue
        except UnreadableRecordError:
            return True  # a job it may be booting for, for all gc can tell
    return False


def stop_job(store: Store, name: str, *, wait: bool = True, timeout: float = 120.0) -> JobRecord:
    """Ask the job's controller to stop it; take over if no controller is alive. With `wait`,
    return once the job has ended and its controller let go of it: the record turns Stopped
    before the teardown (nodes, containers, instances) is done, and a stop that returned must
    not mean they still exist (a teardown slower than `timeout` goes on in the controller)."""
    jobs = JobStore(store, name)
    record = jobs.load()
    if not record.state.is_terminal():
        jobs.request_stop("stopped by the user")
        _wake_controller(jobs)
    if not wait:
        return record
    deadline = time.monotonic() + timeout
    grace_until = time.monotonic() + 5.0  # a freshly spawned controller may not hold the lease yet
    while time.monotonic() < deadline:
        record = jobs.load()
        controlled = lease_is_live(jobs)
        if record.state.is_terminal() and not controlled:
            return record
        if not record.state.is_terminal() and not controlled and time.monotonic() > grace_until:
            return _stop_orphaned(store, jobs)
        time.sleep(0.25)
    if record.state.is_terminal():
        return record
    raise TrainctlError(f"job {name!r} did not stop within {timeout:.0f} s")


def _wake_controller(jobs: JobStore) -> None:
    """SIGTERM a controller on this machine that handles it: it stops the job at once
    instead of at its next poll of the store."""
    from trainctl.controller.lease import same_machine

    lease = jobs.read_lease()
    if lease and same_machine(lease) and lease.get("handles_sigterm"):
        try:
            os.kill(int(lease["pid"]), signal.SIGTERM)
        except (ProcessLookupError, PermissionError, KeyError, ValueError):
            pass


def _stop_orphaned(store: Store, jobs: JobStore) -> JobRecord:
    """No controller is alive: end what the job left behind and record it Stopped."""
    from trainctl.provisioning import get_provider

    record = jobs.load()
    provider = get_provider(record.spec.instance_type, record.spec.region)
    provider.terminate(record.name, grace=get_settings().stop_grace_seconds)
    if not record.state.is_terminal():
        record.stop_reason = "stopped by the user (no controller was running)"
        if record.attempts and record.attempts[-1].ended_at is None:
            record.attempts[-1].ended_at = now_iso()
            record.attempts[-1].outcome = "stopped"
        jobs.transition(record, JobState.STOPPED, stop_reason=record.stop_reason)
    return record
