"""A job's files in the store, for `trainctl artifacts` and `TrainingJob`-side browsing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainctl.errors import NotFoundError, SpecError
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys, nodes_only
from trainctl.record.locations import output_store
from trainctl.store import ObjectInfo, Store, open_store


@dataclass(frozen=True)
class Listing:
    """What `trainctl ls URI` shows: the folders one level below `root` and its files
    (with `recursive`, every file below it and no folders); keys are relative to `root`."""

    root: Store
    folders: list[str]
    files: list[ObjectInfo]


def list_uri(uri: str, *, recursive: bool = False) -> Listing:
    """The folders and files at `uri` (a file:// or s3:// URI, or a local path), like
    `aws s3 ls`; `uri` may name one object. NotFoundError when nothing is there."""
    store = open_store(uri, field="URI")
    files = list(store.list(""))
    folders: list[str] = []
    if not recursive:
        folders = sorted({f.key.split("/", 1)[0] for f in files if "/" in f.key})
        files = [f for f in files if "/" not in f.key]
    if files or folders:
        return Listing(store, folders, files)
    parent, _, leaf = uri.rstrip("/").rpartition("/")
    if leaf and parent and parent not in ("file:/", "file://", "s3:/", "s3://"):
        parent_store = open_store(parent, field="URI")
        if (one := parent_store.info(leaf)) is not None:
            return Listing(parent_store, [], [one])
    raise NotFoundError(f"nothing at {uri}")


# What of a job's directory is shown (listed, served by the dashboard, fetched by `trainctl
# artifacts`): an allow-list, so a file added to the job's directory later stays hidden
# until it is named here. Not the lease, the stop marker, nor a node's remote-start endpoint
# and token (nodes_only); the record only redacted (RECORD_FILE).
SHOWN_FOLDERS = ("output", "checkpoints", "workdir", "logs", "metrics", "attempts")
SHOWN_FILES = ("job.json", "events.jsonl")
RECORD_FILE = "job.json"


def job_file_key(path: str) -> str:
    """The one spelling of `path` (as a user or a URL gives it) inside a job's directory:
    empty and `.` segments and doubled or trailing slashes dropped, so `./job.json`,
    `job.json/.` and `//job.json` are all `job.json`. SpecError (PATH) for a path that
    cannot name a file of the job: empty, with a `..` segment, a NUL or another control
    character. Callers decide with `shown` what the key may reach."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise SpecError("PATH", f"{path!r} must be a file inside the job, e.g. output/model.tar.gz")
    return "/".join(parts)


def shown(key: str) -> bool:
    """Whether a key of the job's directory (as job_file_key spells it) may be listed,
    served or fetched; compared exactly, so `JOB.JSON` or `Logs/x` is not (on a
    case-insensitive file system they would reach the record or another name)."""
    if nodes_only(key):
        return False
    top, _, rest = key.partition("/")
    return top in SHOWN_FOLDERS or (not rest and top in SHOWN_FILES)


def redacted_record(store: Store, name: str) -> bytes:
    """The job's record as shown in place of job.json: its secrets redacted."""
    import json

    return json.dumps(JobStore(store, name).load().redacted_dump(), indent=2).encode()


def job_artifacts(store: Store, name: str) -> list[tuple[str, list[ObjectInfo]]]:
    """(root URI, files relative to it) for the job's directory and, if elsewhere, outputs;
    only what is `shown` (never a running MPI node's remote-start token)."""
    record = JobStore(store, name).load()
    prefix = JobKeys(name).prefix
    job_root = store.child(prefix)
    groups = [(job_root.uri, _shown(job_root.list("")))]
    outputs = output_store(record)
    if not outputs.uri.startswith(job_root.uri + "/"):
        groups.append((outputs.uri, list(outputs.list(""))))
    return groups


def download_artifact(store: Store, name: str, path: str, dest: str | Path | None) -> list[Path]:
    """Copy one of the job's files, or a folder of them (path relative to the job's
    directory: `output/model.tar.gz`, `checkpoints/step-40`), to `dest`: a file is saved as
    `dest` unless `dest` is a directory (or ends in "/"), then inside it under its own name;
    a folder is copied whole, as `dest` or inside it likewise. Returns each file written."""
    record = JobStore(store, name).load()
    clean = job_file_key(path)
    leaf = clean.rsplit("/", 1)[-1]
    # (the text, not a Path: Path("models/") drops the "/" that says "into")
    into = dest is not None and (str(dest).endswith("/") or Path(dest).is_dir())
    target = Path(leaf) if dest is None else Path(dest) / leaf if into else Path(dest)
    if clean == RECORD_FILE:  # as the dashboard serves it: the secrets stay in the store
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(redacted_record(store, name))
        except OSError as exc:
            raise SpecError("DEST", f"{target}: cannot be written ({exc.strerror})") from None
        return [target]
    # (root, key there, whether the key is of the job's directory and so must be shown)
    candidates = [(store.child(JobKeys(name).prefix), clean, True)] if shown(clean) else []
    if clean == "output" or clean.startswith("output/"):
        candidates.append((output_store(record), clean[len("output/") :], False))
    for root, key, in_job_dir in candidates:
        if key and root.exists(key):
            target.parent.mkdir(parents=True, exist_ok=True)
            root.get_file(key, target)
            return [target]
        below = list(root.list(key))
        below = _shown(below) if in_job_dir else below
        if below:
            return _download_folder(root, key, below, target)
    raise NotFoundError(f"{path} not found in job {name!r}; see `trainctl artifacts {name}`")


def _shown(files: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    return [info for info in files if shown(info.key)]


def _download_folder(root: Store, key: str, files: list[ObjectInfo], target: Path) -> list[Path]:
    if target.exists() and not target.is_dir():
        raise SpecError("DEST", f"{target} is a file; a folder is copied into a directory")
    strip = len(key) + 1 if key else 0
    written = []
    for info in files:
        local = target / info.key[strip:]
        local.parent.mkdir(parents=True, exist_ok=True)
        root.get_file(info.key, local)
        written.append(local)
    return written
