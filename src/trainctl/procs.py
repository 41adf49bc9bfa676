"""Find and end the processes of a job on this machine.

torchrun starts every worker in a session of its own, and a killed agent's children are
re-parented, so neither process groups nor the parent chain find them all. Every process
of a job carries TRAINCTL_JOB (and TRAINCTL_NODE) in its environment, which children
inherit; scanning /proc for that tag finds them wherever they went, as EC2 finds a job's
instances by tag.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

JOB_TAG = "TRAINCTL_JOB"
NODE_TAG = "TRAINCTL_NODE"
ATTEMPT_TAG = "TRAINCTL_ATTEMPT"
CONTROLLER_TAG = "TRAINCTL_CONTROLLER"
# Whose nodes: the local provider's home (its nodes directory's parent). Job names are unique
# within a store, not on a machine: two homes (two users, two test runs) may both have a job
# `train-1`, and ending one must not end the other's processes.
HOME_TAG = "TRAINCTL_NODES_HOME"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"TRAINCTL_"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _pids() -> Iterable[int]:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            yield int(entry)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _tagged(tag: str, value: str, **more: str) -> Iterator[tuple[int, dict[str, str]]]:
    """Live processes whose environment has tag=value (and each of `more`), with their
    trainctl variables."""
    for pid in _pids():
        env = _environ(pid)
        if env.get(tag) == value and all(env.get(k) == v for k, v in more.items()):
            if not _is_zombie(pid):
                yield pid, env


def find_tagged(tag: str, value: str, **more: str) -> list[int]:
    """Live processes whose environment has tag=value (and each of `more`)."""
    return [pid for pid, _ in _tagged(tag, value, **more)]


def _ours(env: dict[str, str], home: str | None) -> bool:
    """Whether a tagged process belongs to the nodes of `home` (None: any home's). One
    without the tag (started before it existed) counts as anyone's, as it always did."""
    return home is None or env.get(HOME_TAG, home) == home


def job_processes(
    job: str, node: int | None = None, attempt: int | None = None, *, home: str | None = None
) -> list[int]:
    """The job's processes here: all of them, one node's, or one node's of one attempt (a
    node killed while its job relaunches must not take the next attempt's agent with it);
    `home`: only those of that home's nodes (HOME_TAG)."""
    more = {} if node is None else {NODE_TAG: str(node)}
    if attempt is not None:
        more[ATTEMPT_TAG] = str(attempt)
    return [pid for pid, env in _tagged(JOB_TAG, job, **more) if _ours(env, home)]


def nodes_running(job: str, attempt: int, *, home: str | None = None) -> set[int]:
    """The ranks of `job`'s nodes of `attempt` that have a live process here (one scan)."""
    found = _tagged(JOB_TAG, job, **{ATTEMPT_TAG: str(attempt)})
    return {
        int(env[NODE_TAG])
        for _, env in found
        if env.get(NODE_TAG, "").isdigit() and _ours(env, home)
    }


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in _pids():
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[-1].split()[1])
        kids.setdefault(ppid, []).append(p)
    return kids


def children(pid: int) -> list[int]:
    return _children_map().get(pid, [])


def descendants(pid: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_processes(find, grace: float) -> None:
    """SIGTERM what `find()` returns, wait up to `grace`, then SIGKILL until none is left."""
    pids = find()
    if not pids:
        return
    if grace > 0:
        signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(alive(p) for p in find()):
            return
        time.sleep(0.1)
    for _ in range(50):  # processes may fork while we kill: repeat until the scan is empty
        pids = find()
        if not pids:
            return
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.1)


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "?"


def end_descendants(pid: int, grace: float) -> list[tuple[int, str]]:
    """SIGTERM every live descendant of `pid`, SIGKILL what is left after `grace`, and reap
    those that are this process's children (re-parented to a subreaper). Returns the
    (pid, name) of each process found."""
    found = [(p, process_name(p)) for p in descendants(pid) if not _is_zombie(p)]
    if found:
        end_processes(lambda: [p for p in descendants(pid) if not _is_zombie(p)], grace)
    for child in descendants(pid):
        try:
            os.waitpid(child, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
    return found


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does (KeyboardInterrupt), so that what it started
    is ended by the same cleanup (a process that is only told to end, `kill PID`, leaves
    nothing behind). Only in the main thread, where signal handlers can be set."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
