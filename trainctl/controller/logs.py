"""Printing and following node logs: one prefix and colour per node."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


class LogPrinter:
    """Writes `[algo-N] line` to a terminal (coloured) or a plain stream."""

    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None) -> None:
        from trainctl.terminal import console

        self.stream = stream or sys.stdout
        # colour=None: rich decides, as everywhere else: a terminal gets colour unless
        # NO_COLOR is set or TERM=dumb; FORCE_COLOR colours a pipe too.
        self.console = console(
            file=self.stream,
            force_terminal=colour,
            no_color=None if colour is None else not colour,
            highlight=False,
            soft_wrap=True,
        )

    def node_line(
        self, rank: int, line: str, *, attempt: int | None = None, stamp: str | None = None
    ) -> None:
        """`[algo-N] line`; a line of one of several processes `[algo-N:R] line` (R: its
        rank, see protocol.RANK_MARK); an attempt after the first `[algo-N#A] line`; with
        `stamp` (its time, --timestamps), `TIME [algo-N] line`."""
        from rich.text import Text

        from trainctl.protocol import split_rank

        process, line = split_rank(line)
        label = f"algo-{rank + 1}" + ("" if process is None else f":{process}")
        if attempt is not None and attempt != 1:
            label += f"#{attempt}"
        text = Text() if stamp is None else Text(f"{stamp:<24} ", style="dim")
        text.append(f"[{label}] ", style=f"bold {COLOURS[rank % len(COLOURS)]}")
        text.append(line)
        self.console.print(text)

    def info(self, message: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"[trainctl] {message}", style="bold"))


@dataclass(frozen=True)
class LogSelection:
    """Which stored log lines to print and how (`trainctl logs`' filters)."""

    nodes: frozenset[int] | None = None  # node ranks (algo-N is rank N-1); None: every node
    ranks: frozenset[int] | None = None  # process ranks of `[rank R]` lines; None: all lines
    attempts: tuple[int, ...] | None = None  # None: every attempt
    since: str | None = None  # a stamp (protocol.stamp): lines stamped earlier are left out
    tail: int | None = None  # only the last N lines of what is there now (then follow)
    merge: bool = False  # every node's lines interleaved by time, not node after node
    timestamps: bool = False  # print each line's time before it

    def keeps(self, node: int, stamp: str | None, text: str) -> bool:
        from trainctl.protocol import split_rank

        if self.nodes is not None and node not in self.nodes:
            return False
        if self.ranks is not None and split_rank(text)[0] not in self.ranks:
            return False
        # (stamps sort as times do; a line stored before stamps is not known to be recent)
        return self.since is None or (stamp is not None and stamp >= self.since)


def log_selection(
    *,
    nodes: list[int | str] | None = None,
    ranks: list[int] | None = None,
    attempts: list[int] | None = None,
    since: str | float | None = None,
    tail: int | None = None,
    merge: bool = False,
    timestamps: bool = False,
) -> LogSelection:
    """A LogSelection from what a user writes: nodes as ranks (0) or names (`algo-1`),
    `since` as a duration (`10m`, `2h`) or seconds. Bad values: SpecError naming the option."""
    from trainctl.errors import SpecError
    from trainctl.protocol import stamp
    from trainctl.spec.durations import parse_duration

    def node_rank(value: int | str) -> int:
        text = str(value).strip()
        if text.startswith("algo-") and text[5:].isdigit() and int(text[5:]) >= 1:
            return int(text[5:]) - 1
        if text.isdigit():
            return int(text)
        raise SpecError("--node", f"{value!r} is not a node; allowed: its rank (0) or algo-N")

    for flag, values, low in (
        ("--rank", ranks, 0),
        ("--attempt", attempts, 1),
        ("--tail", [tail], 0),
    ):
        below = [v for v in values or [] if v is not None and v < low]
        if below:
            raise SpecError(flag, f"must be {low} or more, got {below[0]}")
    if isinstance(since, str):
        since = parse_duration(since, "--since")
    return LogSelection(
        nodes=None if not nodes else frozenset(node_rank(n) for n in nodes),
        ranks=None if not ranks else frozenset(ranks),
        attempts=None if not attempts else tuple(attempts),
        since=None if since is None else stamp(time.time() - since),
        tail=tail,
        merge=merge,
        timestamps=timestamps,
    )


@dataclass(frozen=True)
class _Line:
    stamp: str | None
    attempt: int
    node: int
    text: str


class LogFollower:
    """Prints every attempt's node logs from the store, each line once, as they grow
    (`selection`: which lines, in which order, with or without their times)."""

    def __init__(
        self, store, name: str, printer: LogPrinter, selection: LogSelection | None = None
    ) -> None:
        from trainctl.record import JobKeys

        self.store, self.printer = store, printer
        self.selection = selection or LogSelection()
        self.keys = JobKeys(name)
        # per (attempt, rank): bytes printed as whole lines, and the line still incomplete
        self._printed: dict[tuple[int, int], int] = {}
        self._partial: dict[tuple[int, int], bytes] = {}
        self._first = True

    def _attempts_now(self) -> list[int]:
        found = []
        for d in self.store.list_dirs(f"{self.keys.prefix}/logs"):
            if d.startswith("attempt-") and d[8:].isdigit():
                found.append(int(d[8:]))
        found.sort()
        wanted = self.selection.attempts
        return found if wanted is None else [a for a in found if a in wanted]

    def drain(self) -> None:
        """Print what the logs gained since the last call (the first call: what they hold,
        its last `tail` lines with a tail)."""
        lines = self._read()
        if self.selection.merge:  # stable: a node's own lines keep their order
            lines.sort(key=lambda line: line.stamp or "")
        if self._first and self.selection.tail is not None:
            lines = lines[-self.selection.tail :] if self.selection.tail > 0 else []
        self._first = False
        for line in lines:
            self._print(line)

    def _read(self) -> list[_Line]:
        from trainctl.errors import NotFoundError
        from trainctl.protocol import split_stamp

        found: list[_Line] = []
        for attempt in self._attempts_now():
            for info in self.store.list(self.keys.logs_dir(attempt)):
                leaf = info.key.rsplit("/", 1)[-1]
                if not (leaf.startswith("node-") and leaf.endswith(".log")):
                    continue
                if not leaf[5:-4].isdigit():
                    continue
                node = (attempt, int(leaf[5:-4]))
                if self.selection.nodes is not None and node[1] not in self.selection.nodes:
                    continue
                pending = self._partial.get(node, b"")
                start = self._printed.get(node, 0) + len(pending)
                if info.size <= start:
                    continue
                try:
                    chunk = self.store.get_range(info.key, start)
                except NotFoundError:
                    continue
                *whole, rest = (pending + chunk).split(b"\n")
                self._partial[node] = rest
                self._printed[node] = start + len(chunk) - len(rest)
                for raw in whole:
                    stamp, text = split_stamp(raw.decode("utf-8", errors="replace"))
                    if self.selection.keeps(node[1], stamp, text):
                        found.append(_Line(stamp, attempt, node[1], text))
        return found

    def _print(self, line: _Line) -> None:
        if self.selection.timestamps:
            stamp = line.stamp or "-"  # a line stored before stamps: its time is unknown
            self.printer.node_line(line.node, line.text, attempt=line.attempt, stamp=stamp)
        else:
            self.printer.node_line(line.node, line.text, attempt=line.attempt)

    def line_offsets(self) -> dict[tuple[int, int], int]:
        """(attempt, rank) -> bytes of that log printed as whole lines so far."""
        return dict(self._printed)

    def flush(self) -> None:
        """The last line of each log, if it has no newline (its node is gone)."""
        from trainctl.protocol import split_stamp

        for (attempt, node), rest in sorted(self._partial.items()):
            if rest:
                stamp, text = split_stamp(rest.decode("utf-8", errors="replace"))
                if self.selection.keeps(node, stamp, text):
                    self._print(_Line(stamp, attempt, node, text))
        self._partial.clear()


def follow_logs(
    store,
    name: str,
    printer: LogPrinter,
    *,
    follow: bool,
    is_done: Callable[[], bool],
    poll: float = 0.5,
    selection: LogSelection | None = None,
) -> None:
    """Print the job's node logs from the store (`selection`: which and how); with
    `follow`, until `is_done()`."""
    follower = LogFollower(store, name, printer, selection)
    while True:
        done = is_done()
        follower.drain()
        if not follow or done:
            break
        time.sleep(poll)
    follower.flush()
