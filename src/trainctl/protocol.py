"""The small contract between training scripts, node agents and the controller.

No dependencies: imported by the training helper library (inside the user's processes),
by the agent and by the controller.

- Control messages are single output lines `@@trainctl@@ {json}`. Scripts (through
  `trainctl.train`) send them on stdout; the agent forwards them to the controller and
  keeps them out of the node log.
- Checkpoints live in the node's checkpoint dir (SM_CHECKPOINT_DIR). Files still being
  written end in TMP_SUFFIX (or sit in a directory that does); the agent never uploads them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from typing import Any

from trainctl.clock import clock

CONTROL_PREFIX = "@@trainctl@@ "

# Exit codes with a meaning for the controller.
EXIT_PREEMPTED = 85  # the script saved an emergency checkpoint after SIGTERM and stopped
EXIT_INFRA = 70  # the agent could not stage or run the node (not the user's code)
# The agent refused the job (tampered code, a URI outside the job's data): never retried.
EXIT_REFUSED = 71

TMP_SUFFIX = ".tmp"

# Events a script may send (all optional; scripts that send none still run):
#   {"event": "step", "step": N}           progress (rank 0, throttled)
#   {"event": "checkpoint", "step": N}     a complete checkpoint of step N is on disk
#   {"event": "resumed", "step": N}        training resumed from the checkpoint of step N
#   {"event": "preempted", "step": N}      stopping after an emergency checkpoint of step N
#   {"event": "checkpoint_stall", "seconds": S}   a save held the training loop S seconds
#   {"event": "data_wait", "seconds": S}   the loop has waited S seconds for data so far
SCRIPT_EVENTS = ("step", "checkpoint", "resumed", "preempted", "checkpoint_stall", "data_wait")


def under_trainctl() -> bool:
    return "TRAINCTL_JOB" in os.environ


def message(event: str, **fields: Any) -> str:
    """A control message as one line (without its newline)."""
    return CONTROL_PREFIX + json.dumps({"event": event, **fields})


_send_lock = threading.RLock()  # re-entrant: a signal handler may send mid-send


def send(event: str, **fields: Any) -> None:
    """Send a control message from a training script (a no-op outside trainctl)."""
    if not under_trainctl():
        return
    line = message(event, **fields) + "\n"
    # One write: lines under PIPE_BUF stay whole between workers. Under a lock: sys.stdout
    # (a TextIOWrapper) is not safe for two threads at once (the background checkpoint
    # writer sends while the loop reports its steps).
    with _send_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The control message on this line, if it is one (prefixes like '[rank0]:' allowed)."""
    at = line.find(CONTROL_PREFIX)
    if at < 0 or at > 16:
        return None
    return _decode(line, at)


def _decode(line: str, at: int) -> dict[str, Any] | None:
    try:
        msg = json.loads(line[at + len(CONTROL_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return msg if isinstance(msg, dict) and "event" in msg else None


# Lines of several worker processes on one node. torchrun's tee (`--tee 3`, several
# processes per host) starts every piece of a worker's output it forwards with this tag
# (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE): a unit separator, which no one prints, so a piece
# is always told from the text. The node log keeps a line of rank R as `[rank R]<TAB>text`,
# printed as `[algo-N:R] text`.
RANK_MARK = "\x1f"
TORCHRUN_PREFIX_TEMPLATE = RANK_MARK + "${rank}" + RANK_MARK
RANKED_LINE = re.compile(r"^\[rank (\d+)\]\t")


def ranked_line(rank: int | None, text: str) -> str:
    """A line as the node log keeps it (see RANK_MARK)."""
    return text if rank is None else f"[rank {rank}]\t{text}"


def split_rank(line: str) -> tuple[int | None, str]:
    """(rank, text) of a node log line (rank None: not one of several processes')."""
    found = RANKED_LINE.match(line)
    return (int(found[1]), line[found.end() :]) if found else (None, line)


# Every line of a stored node log starts with the time its agent read it, UTC to the
# millisecond: `2026-11-27T02:20:45.123Z <line>` (kubectl --timestamps' form, and CloudWatch's
# time), so logs can be cut by time and nodes interleaved. Logs written before carry none.
STAMPED_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ")


def stamp(when: float) -> str:
    """A time as node logs keep it (UTC, milliseconds): such stamps sort as the times do."""
    millis = int(when * 1000) % 1000
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(when))}.{millis:03d}Z"


def stamped_line(text: str, when: float | None = None) -> str:
    return f"{stamp(clock().time() if when is None else when)} {text}"


def split_stamp(line: str) -> tuple[str | None, str]:
    """(time, text) of a stored node log line (time None: a line from before stamps)."""
    found = STAMPED_LINE.match(line)
    return (found[1], line[found.end() :]) if found else (None, line)


# What a launcher puts before each line of a worker: torchrun's "[rank0]:" or
# "[default0]:", OpenMPI's "[1,0]<stdout>:".
_LAUNCHER_TAG = re.compile(r"\s*(\[[\w,]+\](<std(out|err)>)?:)?\s*")


def split(line: str) -> tuple[str, dict[str, Any] | None]:
    """A line of a script's output as (the script's text, the control message on it).

    A message always ends its line (one write, newline included), but it need not start
    one: `print` writes its text and its newline separately, so a message sent by another
    thread of the script (the background checkpoint writer) can land between them. The
    text before the message is then the start of a line whose rest comes on the next line;
    a launcher's tag alone is not the script's text."""
    at = line.find(CONTROL_PREFIX)
    if at < 0:
        return line, None
    msg = _decode(line, at)
    if msg is None:
        return line, None
    before = line[:at]
    return ("" if _LAUNCHER_TAG.fullmatch(before) else before), msg
