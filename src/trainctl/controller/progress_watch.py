"""No silent hang: whether an attempt's nodes are making progress, and if not, why not.

Progress is a training step (a `step` or `checkpoint` control message), or a log line a node
has not printed before. A line that repeats an earlier one exactly is not new; nor is one
that says what is wrong in a shape seen before ("the same text with other numbers": c10d
retrying a name it cannot resolve, a watchdog's warning, a retry with a timestamp). A
training loop's lines (`epoch 3 | loss 0.41`) are progress. An attempt with no progress for
its bound has hung: it fails as the user's failure, with a reason that names the node, how
long, its last line, and what the line says when it is a known rendezvous or
name-resolution error.

The bound: `startup_timeout_seconds` before the first step and `progress_timeout_seconds`
after it; for a relaunch, the job's own pace (controller.hangs: a few times the longest quiet
stretch of its earlier attempts, with a floor) when that is shorter. The longest quiet
stretch of this attempt is measured here for the ones that follow.
"""

from __future__ import annotations

import re
from collections import OrderedDict

# Lines remembered per node to tell new from repeated (the oldest are forgotten first).
SEEN_LINES = 4096
_MASK = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")

# (pattern, summary): known reasons a distributed start hangs, in the words of c10d,
# torchelastic, gloo and NCCL. Named groups fill the summary.
DIAGNOSES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"addresses of \((?P<host>[^,()]+), (?P<port>\d+)\) cannot be retrieved"),
        "name resolution: {host} does not resolve (rendezvous at {host}:{port})",
    ),
    (
        re.compile(
            r"Name or service not known|Temporary failure in name resolution|"
            r"nodename nor servname provided|getaddrinfo failed"
        ),
        "name resolution failed",
    ),
    (
        re.compile(
            r"RendezvousTimeoutError|RendezvousConnectionError|rendezvous.*timed? ?out|"
            r"Timed out initializing process group|DistStoreError|wait timeout after",
            re.IGNORECASE,
        ),
        "rendezvous timed out",
    ),
    (
        re.compile(r"Connection refused|connect\(\) timed out|Connection timed out"),
        "cannot connect to a peer or the rendezvous",
    ),
    (
        re.compile(r"Watchdog caught collective operation timeout|NCCL.*timeout", re.I),
        "a collective operation timed out",
    ),
]


# A line that reports trouble: in a shape seen before, a repeat (a retry loop), not progress.
_COMPLAINT = re.compile(
    r"\b(warn(ing)?|error|exception|retry(ing)?|timed? ?out|waiting|failed|refused|unable)\b"
    r"|^\[?[WE]\d{4} ",
    re.IGNORECASE,
)


def diagnose(line: str) -> str | None:
    """What a log line says went wrong in a distributed start, or None."""
    for pattern, summary in DIAGNOSES:
        match = pattern.search(line)
        if match:
            return summary.format(**match.groupdict())
    return None


class ProgressWatch:
    """Follows one attempt's lines and steps; `hung(now)` says when it has stopped."""

    def __init__(self, startup_timeout: float, progress_timeout: float, now: float) -> None:
        """A timeout of 0 turns that check off."""
        self.startup_timeout = startup_timeout
        self.progress_timeout = progress_timeout
        self.last_progress = now
        self.stepped = False
        self._seen: dict[int, OrderedDict[str, None]] = {}
        self.last_line: dict[int, tuple[float, str]] = {}
        self.diagnosis: dict[int, str] = {}
        # The job's own pace, for a relaunch (controller.hangs): the bound in both phases
        # when shorter than the timeouts, and what it was made of (for the reason).
        self.pace_bound: float | None = None
        self.pace_reason = ""
        # The longest stretch without progress since the nodes' code started (None: not
        # started), what the next attempts' bound is made of.
        self.longest_quiet: float | None = None
        self._started = False

    def line(self, rank: int, line: str, now: float) -> None:
        text = line.strip()
        if not text:
            return
        self.last_line[rank] = (now, text)
        found = diagnose(text)
        if found:
            self.diagnosis[rank] = found
        seen = self._seen.setdefault(rank, OrderedDict())
        shape = _MASK.sub("#", text)
        repeat = text in seen or (shape in seen and (found or _COMPLAINT.search(text)))
        for key in (text, shape):
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > SEEN_LINES:
            seen.popitem(last=False)
        if not repeat:
            self._progress(now)

    def activity(self, now: float) -> None:
        """Something that is progress without being a step (a node's code started)."""
        self._started = True
        self.last_progress = now

    def step(self, now: float) -> None:
        self.stepped = True
        self._progress(now)
        self.diagnosis.clear()  # whatever a node complained of, it is training now

    def _progress(self, now: float) -> None:
        if self._started:
            quiet = now - self.last_progress
            self.longest_quiet = max(quiet, self.longest_quiet or 0.0)
        self.last_progress = now

    def bound(self) -> float:
        """How long the attempt may go without progress now (0: unbounded)."""
        timeout = self.progress_timeout if self.stepped else self.startup_timeout
        if self.pace_bound is not None and timeout:
            return min(timeout, self.pace_bound)
        return timeout

    def hung(self, now: float) -> str | None:
        """The failure reason once the attempt has made no progress for its bound."""
        timeout = self.bound()
        silent = now - self.last_progress
        if not timeout or silent < timeout:
            return None
        phase = "since its last step" if self.stepped else "before its first step"
        if self.pace_bound is not None and timeout == self.pace_bound:
            phase = f"({self.pace_reason})"
        rank = self._culprit()
        if rank is None:
            return f"no progress for {silent:.0f} s {phase}: no node printed anything new"
        line = self.last_line[rank][1]
        if len(line) > 200:
            line = line[:197] + "..."
        reason = f"algo-{rank + 1}: no progress for {silent:.0f} s {phase}; last line: {line}"
        if rank in self.diagnosis:
            reason += f" ({self.diagnosis[rank]})"
        return reason

    def _culprit(self) -> int | None:
        """The node to name: one whose lines say what is wrong, else the lowest rank that
        printed anything."""
        if self.diagnosis:
            return min(self.diagnosis)
        return min(self.last_line) if self.last_line else None
