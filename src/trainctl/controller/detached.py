"""A job's controller as a detached process of this machine (`submit --detach`, `fit(wait=
False)`, and the hand-off of a foreground controller whose terminal closed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from trainctl.procs import CONTROLLER_TAG
from trainctl.record.jobstore import JobStore
from trainctl.spec.settings import get_settings
from trainctl.store import Store

# A tuning supervisor's log is `<this><tuning name>.log` beside the controllers' (each
# kind's stray logs are found by its own package: trainctl.tuning.loop, controller.remove).
SUPERVISOR_LOG_PREFIX = "tuning-"


def _logs_folder() -> Path:
    return get_settings().home / "controllers"


def controller_log_path(name: str) -> Path:
    return _logs_folder() / f"{name}.log"


def controller_logs() -> list[Path]:
    """The logs of detached processes (controllers, tuning supervisors) on this machine."""
    folder = _logs_folder()
    return sorted(folder.glob("*.log")) if folder.is_dir() else []


def file_log(store: Store, log_path: Path, key: str) -> bool:
    """A detached process's log into the store at `key` once its job has ended, and off
    this machine (nothing of an ended job stays outside its store: `rm` and `prune` find it
    there); whether it was filed. A job still running (a controller handed off, or one that
    lost its lease to another) keeps it here: the next controller appends to it."""
    if not log_path.is_file():
        return False
    sys.stdout.flush()
    store.put_file(key, log_path)
    log_path.unlink(missing_ok=True)
    return True


def file_controller_log(store: Store, name: str) -> bool:
    """The job's controller log filed in its store prefix, once the job has ended."""
    jobs = JobStore(store, name)
    if not jobs.load().state.is_terminal():
        return False
    return file_log(store, controller_log_path(name), jobs.keys.controller_log)


def spawn_detached(argv: list[str], log_path: Path, tag: str) -> int:
    """Run `argv` as a process of its own session (it outlives the terminal or notebook
    that started it), tagged CONTROLLER_TAG=`tag`, its output appended to `log_path`
    (owner-only: a controller prints its nodes' output, which is the job's business)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, CONTROLLER_TAG: tag}
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    return proc.pid


def spawn_controller(store: Store, name: str) -> int:
    """Run the job's controller as a detached process; returns its pid."""
    argv = [sys.executable, "-m", "trainctl.controller", "--store", store.uri, name]
    pid = spawn_detached(argv, controller_log_path(name), name)
    JobStore(store, name).event("controller_spawned", pid=pid, host=socket.gethostname())
    return pid
