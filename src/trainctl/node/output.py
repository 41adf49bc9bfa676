"""What a node says: lines to the controller's pipe (user lines verbatim, control messages as
`@@trainctl@@ {json}`), the node's log file shipped to the store, and the failure reason
read from a worker's output."""

from __future__ import annotations

import random
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.clock import clock
from trainctl.node.priority import yield_cpu_to_training
from trainctl.protocol import RANK_MARK, message, stamped_line

if TYPE_CHECKING:
    from trainctl.store import Store

# The forwarding thread and the heartbeat both write (re-entrant: a signal handler on the
# main thread may write while that thread is writing)
_console_lock = threading.RLock()


def console(text: str) -> None:
    """Write to the controller's pipe; once the controller is gone, the log file still has it."""
    with _console_lock:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass


def yielding(work: Callable[[], None]) -> Callable[[], None]:
    """`work`, run at the agent's lower priority (see trainctl.node.priority)."""

    def run() -> None:
        yield_cpu_to_training()
        work()

    return run


class NodeStatus:
    """What a node has said so far, kept as one small object that the agent writes to the
    store when it changes and now and then (`attempts/attempt-<k>/node-<r>.status.json`,
    see Agent.keep_status): how a
    controller that did not start the node (a takeover) knows it is alive and where it is."""

    def __init__(self, rank: int) -> None:
        self._lock = threading.Lock()
        self.fields: dict[str, Any] = {"rank": rank}
        self._stored: dict[str, Any] = {}  # the fields as last written (see written)

    def observe(self, msg: dict[str, Any]) -> None:
        event, step = msg.get("event"), msg.get("step")
        with self._lock:
            f = self.fields
            if event in ("launched", "idle", "uploading", "notice", "state_stored", "first_step"):
                f[event] = True
            elif event == "resumed" and isinstance(step, int):
                f.setdefault("resumed", step)
            elif event in ("step", "checkpoint", "preempted") and isinstance(step, int):
                f["step"] = max(step, f.get("step", step))
                if event == "checkpoint":
                    f["checkpoint"] = step
                if event == "preempted":
                    f["preempted"] = step

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.fields, "time": time.time()}

    def written(self, snapshot: dict[str, Any]) -> None:
        """`snapshot` is in the store now."""
        with self._lock:
            self._stored = {k: v for k, v in snapshot.items() if k != "time"}

    def changed(self) -> bool:
        """Whether anything but the step was said since the last write (a new step alone
        waits for the next refresh: rank 0 reports one every few seconds)."""
        with self._lock:
            return _but_step(self.fields) != _but_step(self._stored)


def _but_step(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "step"}


def emit(event: str, **fields: Any) -> None:
    """A control message for the controller, on the agent's own output."""
    console(message(event, **fields) + "\n")


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")
_LAUNCHER_ERRORS = ("ChildFailedError", "torch.distributed.elastic")
_CHAINED = ("During handling", "The above exception")
# What the C++ runtime prints when torch aborts a process as it ends: torch 2.13's gloo
# process group can abort in its teardown, at exit or in destroy_process_group(), after the
# training finished (pytorch/pytorch#190489; some runs, not all). The abort is all the output
# says, so the reason says what it is.
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_ABORT_REASON = (
    f"{TEARDOWN_ABORT}: the process aborted as it ended; torch's gloo process group can do "
    "this in its teardown after training finished; end the script with "
    "trainctl.train.finish(), which exits without that teardown"
)
# The last line of a traceback: `ValueError: ...`, `pkg.module.Error: ...`, `KeyboardInterrupt`.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")


# mpirun --tag-output's tag of a piece of a process's output (`[1,3]<stdout>:`: job 1, rank
# 3), after the time when the user's options add --timestamp-output (trainctl stamps lines).
_MPIRUN_TAG = re.compile(
    r"(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})?"
    r"\[\d+,(\d+)\]<std(?:out|err|diag)>:"
)


class RankedLines:
    """The lines of several worker processes from one launcher's output, whole and with
    their ranks. torchrun's tee reads each worker's log file as it grows and writes what it
    read with the worker's tag, and mpirun forwards what each process wrote as it comes,
    each piece tagged (`mpirun`): a piece of a line that is still being written ends with no
    newline, and another worker's piece may follow it on the same output line. The pieces
    of each rank are joined here until its line ends."""

    def __init__(self, *, mpirun: bool = False) -> None:
        self.partial: dict[int, str] = {}
        self.mpirun = mpirun

    def feed(self, line: str) -> list[tuple[int | None, str]]:
        if self.mpirun:
            line = _MPIRUN_TAG.sub(lambda tag: f"{RANK_MARK}{tag[1]}{RANK_MARK}", line)
        if RANK_MARK not in line:
            return [(None, line)]
        head, *pieces = line.split(RANK_MARK)
        out: list[tuple[int | None, str]] = [(None, head)] if head else []
        pairs = list(zip(pieces[0::2], pieces[1::2], strict=False))
        for index, (tag, text) in enumerate(pairs):
            if not tag.isdigit():  # not a tag of ours after all: keep the text as it was
                out.append((None, RANK_MARK + tag + RANK_MARK + text))
                continue
            rank = int(tag)
            joined = self.partial.pop(rank, "") + text
            if index == len(pairs) - 1:  # the output line ended: so did this piece's line
                out.append((rank, joined))
            else:
                self.partial[rank] = joined
        return out

    def flush(self) -> list[tuple[int | None, str]]:
        """Pieces of lines that never ended (the process is gone)."""
        out: list[tuple[int | None, str]] = [(r, t) for r, t in sorted(self.partial.items()) if t]
        self.partial.clear()
        return out


class LauncherNoise:
    """torchrun's own account of being stopped: once trainctl stops a node on purpose (a lost
    peer, the user's stop), its 'death signal' warnings and its SignalException traceback
    tell nothing and make the node look guilty. The worker's own output stays."""

    SHUTDOWN = re.compile(
        r"torch/distributed/elastic/\S+\] (?:Received \S+ death signal|"
        r"Sending process \d+ closing signal)"
    )
    MAX_BLOCK = 400  # a traceback longer than this is shown whatever it is
    # After every worker of a node succeeded, torchrun waits at an exit barrier in the store
    # that the first node's torchrun holds; when that one has ended first, ~40 lines of
    # c10d's C++ frames and torchelastic's traceback say so. One line says it instead.
    C10D_START = re.compile(r"^\[[WE]\d{4} [\d:.]+ \S+\] \[c10d\] ")
    C10D_MORE = re.compile(r"^(Exception raised from |frame #\d+: |<omitting python frames>$|$)")
    EXIT_BARRIER = re.compile(r"^([EW]\d{4} [\d:.]+ \d+ \S+\]) Error waiting on exit barrier")
    EXIT_BARRIER_SAID = (
        "[trainctl] torchrun could not wait for its peers at its exit barrier (a peer's "
        "torchrun ended first); every worker of this node had finished"
    )

    def __init__(self) -> None:
        self.block: list[str] | None = None
        self.c10d: list[str] | None = None  # c10d's C++ frames, held until what follows
        self.barrier: str | None = None  # the log prefix of the exit barrier's traceback

    def feed(self, line: str, stopping: bool) -> list[str]:
        """The lines to keep, now (a traceback is held until its exception line)."""
        if self.barrier is not None:
            if line.startswith(self.barrier):
                return []
            self.barrier = None
        if self.c10d is not None:
            if self.C10D_MORE.match(line) and len(self.c10d) < self.MAX_BLOCK:
                self.c10d.append(line)
                return []
            held, self.c10d = self.c10d, None
            if self.EXIT_BARRIER.match(line):
                return self.feed(line, stopping)
            return held + self.feed(line, stopping)
        if self.C10D_START.match(line):
            self.c10d = [line]
            return []
        if found := self.EXIT_BARRIER.match(line):
            self.barrier = found[1]
            return [self.EXIT_BARRIER_SAID]
        if self.block is not None:
            self.block.append(line)
            body = line.rstrip()
            at_margin = bool(body) and not body[0].isspace()
            if at_margin and not body.startswith(("Traceback", *_CHAINED)):
                if _EXCEPTION_LINE.match(body):
                    block, self.block = self.block, None
                    return [] if "SignalException" in body else block
            if len(self.block) >= self.MAX_BLOCK:
                return self.flush()
            return []
        if not stopping:
            return [line]
        if self.SHUTDOWN.search(line):
            return []
        if line.startswith("Traceback (most recent call last):"):
            self.block = [line]
            return []
        return [line]

    def flush(self) -> list[str]:
        block, self.block = self.block or [], None
        held, self.c10d = self.c10d or [], None
        return held + block


def failure_from_output(lines: list[str]) -> tuple[str | None, str | None]:
    """(one-line reason, last traceback lines) from a worker's output.

    Under torchrun the user's traceback is followed by torchrun's own (ChildFailedError);
    the user's is the one worth showing, so launcher tracebacks are skipped.
    """
    clean = [_RANK_PREFIX.sub("", line) for line in lines]
    blocks: list[list[str]] = []
    i = 0
    while i < len(clean):
        if clean[i].lstrip().startswith("Traceback (most recent call last):"):
            indent = len(clean[i]) - len(clean[i].lstrip())
            block = [clean[i]]
            i += 1
            while i < len(clean):
                body = clean[i][indent:] if len(clean[i]) > indent else clean[i].strip()
                at_margin = bool(body) and not body[0].isspace()
                if at_margin and not body.startswith(("Traceback", *_CHAINED)):
                    if _EXCEPTION_LINE.match(body.rstrip()):
                        block.append(clean[i])
                        break
                    # Not the exception: another process's output, interleaved with this
                    # traceback (mpirun forwards each process's stdout and stderr apart).
                    i += 1
                    continue
                block.append(clean[i])
                i += 1
            blocks.append(block)
        i += 1
    user_blocks = [b for b in blocks if not any(m in b[-1] for m in _LAUNCHER_ERRORS)]
    aborts = [line for line in clean if line.strip().endswith(TEARDOWN_ABORT)]
    if blocks and not user_blocks and aborts:
        # under torchrun: the abort, then the launcher's ChildFailedError about it
        return TEARDOWN_ABORT_REASON, "\n".join([*aborts, *blocks[-1][-6:]])
    chosen = (user_blocks or blocks or [None])[-1]
    if chosen is None:
        # No traceback: the script chose its exit code (sys.exit(3)), and its last line is
        # whatever it printed last ("step 7"), context rather than a cause: the caller says
        # "exit code N" with these lines as the detail. (Lines with words in them: mpirun
        # frames its reports in rules of dashes.)
        tail = [line for line in clean if any(c.isalnum() for c in line)][-12:]
        if any(line.strip().endswith(TEARDOWN_ABORT) for line in tail):
            return TEARDOWN_ABORT_REASON, "\n".join(tail)
        return _mpirun_report(clean), "\n".join(tail) or None
    reason = explained(chosen[-1].strip())[:500]
    return reason, "\n".join(line.rstrip() for line in chosen[-12:])


# Errors whose words do not say what to do, and what they mean on a trainctl node.
EXPLAINED = (
    (
        ("operator torchvision::", "does not exist"),
        "torchvision does not match the installed torch (a CUDA torchvision beside a CPU "
        "torch, or another release): pin the torchvision made for that torch, from the same "
        "wheel index, or leave torchvision to the environment",
    ),
    (
        ("Torch not compiled with CUDA enabled",),
        "the script needs CUDA and this node's torch has none: run it on a GPU instance type, "
        "or let it fall back to the CPU (torch.cuda.is_available())",
    ),
    (
        ("no NVIDIA driver",),
        "the script needs a GPU and this node has none: run it on a GPU instance type, or let "
        "it fall back to the CPU (torch.cuda.is_available())",
    ),
    (
        ("No CUDA GPUs are available",),
        "the script needs a GPU and this node has none: run it on a GPU instance type, or let "
        "it fall back to the CPU (torch.cuda.is_available())",
    ),
)


def explained(reason: str) -> str:
    """`reason`, and what it means where its words do not say (EXPLAINED)."""
    for words, meaning in EXPLAINED:
        if all(word in reason for word in words):
            return f"{meaning} ({reason})"
    return reason


_MPI_PROCESS = re.compile(r"^\s*Process name:\s*\[\[\d+,\d+\],(\d+)\]")


_MPI_EXIT = re.compile(r"^\s*Exit code:\s*(-?\d+)")


def _mpirun_report(lines: list[str]) -> str | None:
    """Open MPI's own account of the first process that failed, when the process's output
    (its traceback) did not make it through: mpirun may abort before it forwards it all."""
    rank = code = None
    for line in lines:
        if found := _MPI_PROCESS.match(line):
            rank = found[1]
        elif rank is not None and (found := _MPI_EXIT.match(line)):
            code = found[1]
    if rank is None or code is None:
        return None
    return f"mpirun: MPI rank {rank} exited with code {code} (its error output did not arrive)"


class LogShipper:
    """Tees lines to the console and a log file, copying the file to the store now and then."""

    def __init__(
        self, path: Path, store: Store, key: str, interval: float, redact=lambda line: line
    ) -> None:
        self.path = path
        self.store = store
        self.key = key
        self.interval = interval
        self.redact = redact  # the job's secret values, hidden in every line (trainctl.redact)
        self._file = path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._shipped = -1
        # The clock's event (on a node, a plain one): a stand-in node under a simulated clock
        # (bench/scale.py) copies by that clock's time, and its copying thread counts as at
        # work there (waiting in wall seconds, niced, it held the lock a node's `write` needs
        # while the clock took the node for idle and moved past its heartbeats).
        self._stop = clock().event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def write(self, line: str, *, shown: bool = True) -> None:
        """A line of the log; `shown=False`: of the stored log only, not on the controller's
        pipe (a hung rank's stack: the failure says where it waits, the log has the rest)."""
        line = self.redact(line)
        with self._lock:
            if shown:
                console(line + "\n")
            self._file.write(stamped_line(line) + "\n")  # the stored log has each line's time

    def ship(self, store: Store | None = None) -> None:
        with self._lock:
            if self._file.closed:  # a pass that close() did not wait for (a starved thread)
                return
            self._file.flush()
            size = self.path.stat().st_size
        if size != self._shipped:
            try:
                (store or self.store).put_file(self.key, self.path)
                self._shipped = size
            except Exception as exc:  # the store retries; a log copy must never kill training
                sys.stderr.write(f"[trainctl] log upload failed: {exc}\n")

    def _run(self) -> None:
        yield_cpu_to_training()
        prompt = self.store.prompt()  # the next copy retries (see Store.prompt); close()'s waits
        # The first copy at a random point of the interval: nodes started together spread
        # their copies over it instead of all writing in the same second.
        wait = random.uniform(0.0, self.interval)
        while not self._stop.wait(wait):
            self.ship(prompt)
            wait = self.interval

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.ship()
        with self._lock:
            self._file.close()
