"""The job's rank processes on this node, as the worker hook (worker_site/sitecustomize.py)
registers them: their Python stacks when an attempt hangs, and the process groups they
formed.

The agent launches its command with the hook's directory first on PYTHONPATH and
TRAINCTL_RANKS_DIR pointing at a directory of its node; each rank process writes its
registration there at start-up. `dump_stacks` has faulthandler write every thread's stack of
each rank (a signal, nothing stopped), then reads them back and says where each rank's main
thread is: the call it waits in. `groups` says which process groups the ranks formed, and
`first_stepped` when a rank's optimizer first stepped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.procs import alive

HOOK_DIR = Path(__file__).resolve().parent / "worker_site"
RANKS_DIR_VARIABLE = "TRAINCTL_RANKS_DIR"
# The hook's (worker_site/sitecustomize.py: STACK_SIGNAL_OFFSET).
STACK_SIGNAL_OFFSET = 6
# How long the ranks get to write their stacks (faulthandler writes from its signal handler
# at once, even in a process stuck in C code: this is for a machine under load).
STACKS_SECONDS = 3.0

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+).*\(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')


def stack_signal() -> int:
    return signal.SIGRTMIN + STACK_SIGNAL_OFFSET


def prepare(directory: Path) -> None:
    """An empty registration directory (the node's root may be an earlier attempt's)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def first_stepped(directory: Path) -> float | None:
    """When a rank's optimizer first stepped (the hook's <pid>.stepped; epoch seconds), or
    None: not yet."""
    times = []
    for path in directory.glob("*.stepped"):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return min(times, default=None)


def hook_env(env: dict[str, str], directory: Path) -> dict[str, str]:
    """`env` with the hook first on PYTHONPATH (kept whatever else is there: the user's
    own entries follow) and the registration directory."""
    path = env.get("PYTHONPATH", "")
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HOOK_DIR), path) if p),
        RANKS_DIR_VARIABLE: str(directory),
    }


@dataclass
class RankProcess:
    pid: int
    ppid: int
    rank: int | None
    argv: list[str]


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def registered(directory: Path) -> list[RankProcess]:
    """The live rank processes that registered, without the processes they started (a
    DataLoader worker, a subprocess: they inherit the rank's environment). A pid whose
    command line changed since (reused, or exec'd into another program) is left out: it
    has no handler for the signal."""
    found: list[RankProcess] = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            process = RankProcess(
                int(data["pid"]), int(data["ppid"]), data.get("rank"), list(data["argv"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        cmdline = _cmdline(process.pid)
        if cmdline is not None and alive(process.pid) and cmdline[:4] == process.argv[:4]:
            found.append(process)
    pids = {p.pid for p in found}
    return [p for p in found if p.ppid not in pids]


@dataclass
class Frame:
    file: str
    line: int
    func: str

    def where(self, code_dir: str | None = None) -> str:
        return f"{self.func} ({short_path(self.file, code_dir)}:{self.line})"


@dataclass
class ThreadStack:
    name: str
    frames: list[Frame] = field(default_factory=list)  # innermost first


def parse_stacks(text: str) -> list[ThreadStack]:
    """faulthandler's dump: each thread's frames, innermost first."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        if (header := _HEADER.match(line)) is not None:
            threads.append(ThreadStack(f"{header.group(1)} {header.group(2)}"))
        elif (frame := _FRAME.match(line)) is not None and threads:
            threads[-1].frames.append(
                Frame(frame["file"], int(frame["line"]), frame["func"].strip())
            )
    return threads


def short_path(path: str, code_dir: str | None = None) -> str:
    """A frame's file as a reader knows it: relative to the job's code directory, or the
    part after site-packages/ ('torch/distributed/distributed_c10d.py'), or its name."""
    if code_dir and path.startswith(code_dir.rstrip("/") + "/"):
        return path[len(code_dir.rstrip("/")) + 1 :]
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread running the script: the one whose outermost frame is a module's top level
    (`<module>`), else the last listed (faulthandler lists the newest threads first)."""
    with_frames = [t for t in threads if t.frames]
    for thread in with_frames:
        if thread.frames[-1].func == "<module>":
            return thread
    return with_frames[-1] if with_frames else None


def waits_in(threads: list[ThreadStack], code_dir: str | None) -> str:
    """Where the script's thread is, in words: its innermost call, and the innermost line of
    the job's own code that led there ('broadcast (torch/distributed/distributed_c10d.py:
    2739), from train.py:72 in main')."""
    thread = main_thread(threads)
    if thread is None:
        return "no Python frame"
    inner = thread.frames[0]
    text = inner.where(code_dir)
    if code_dir:
        mine = next((f for f in thread.frames if f.file.startswith(code_dir)), None)
        if mine is not None and mine is not inner:
            text += f", from {short_path(mine.file, code_dir)}:{mine.line} in {mine.func}"
    return text


@dataclass
class RankStack:
    rank: int | None
    pid: int
    text: str  # faulthandler's dump, as written
    waits_in: str


def dump_stacks(directory: Path, code_dir: str | None, timeout: float = STACKS_SECONDS):
    """Every registered rank's stacks: signal each, wait until each has written a dump (or
    `timeout`), read them back. Ranks that wrote nothing are left out."""
    processes = registered(directory)
    sizes: dict[int, int] = {}
    for process in processes:
        path = directory / f"{process.pid}.stacks"
        sizes[process.pid] = path.stat().st_size if path.exists() else 0
        try:
            os.kill(process.pid, stack_signal())
        except OSError:
            continue
    # Done when every file has grown and then stayed the same for a moment (a dump is
    # written in one go, thread by thread).
    deadline = time.monotonic() + timeout
    last = dict(sizes)
    pending = {p.pid for p in processes}
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid in list(pending):
            try:
                size = (directory / f"{pid}.stacks").stat().st_size
            except OSError:
                continue
            if size > sizes[pid] and size == last[pid]:
                pending.discard(pid)
            last[pid] = size
    dumps: list[RankStack] = []
    for process in sorted(processes, key=lambda p: (p.rank is None, p.rank or 0, p.pid)):
        text = _tail(directory / f"{process.pid}.stacks", sizes[process.pid])
        if text.strip():
            where = waits_in(parse_stacks(text), code_dir)
            dumps.append(RankStack(process.rank, process.pid, text.rstrip("\n"), where))
    return dumps


def _tail(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Groups:
    """What the node's ranks said of process groups: how many ranks registered (the hook
    ran), and the largest world size any of them formed (0: none)."""

    ranks: int
    largest: int
    used: bool = False  # a rank trained through a group (DDP, a tensor collective)


def groups(directory: Path) -> Groups:
    """The registrations and process groups of the node's ranks, whether alive or not."""
    ranks = 0
    largest = 0
    used = False
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            ranks += 1
        for line in _lines(path.with_suffix(".groups")):
            try:
                entry = json.loads(line)
                used = used or entry.get("used") is True
                size = int(entry["world_size"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            largest = max(largest, size)
    return Groups(ranks, largest, used)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []
