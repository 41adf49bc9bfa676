"""A job's controller as a detached process of this machine (`submit --detach`, `fit(wait=
False)`, and the hand-off of a foreground controller whose terminal closed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from trainctl.procs import CONTROLLER_TAG
from trainctl.record import JobStore
from trainctl.spec.settings import get_settings
from trainctl.store import Store


def controller_log_path(name: str) -> Path:
    return get_settings().home / "controllers" / f"{name}.log"


def spawn_controller(store: Store, name: str) -> int:
    """Run the job's controller as a detached process; returns its pid."""
    log_path = controller_log_path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, CONTROLLER_TAG: name}
    # (owner-only: the controller prints its nodes' output, which is the job's business)
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainctl.controller", "--store", store.uri, name],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the terminal that submitted it
            env=env,
            close_fds=True,
        )
    JobStore(store, name).event("controller_spawned", pid=proc.pid, host=socket.gethostname())
    return proc.pid
