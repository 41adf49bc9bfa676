"""Printing and following node logs: one prefix and colour per node."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

# How the node agent starts the lines it writes itself (trainctl.node.agent's log).
AGENT_LINE = "[trainctl] "
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
        self,
        rank: int,
        line: str,
        *,
        attempt: int | None = None,
        stamp: str | None = None,
        prefix: bool = True,
    ) -> None:
        """`[algo-N] line`; a line of one of several processes `[algo-N:R] line` (R: its
        rank, see protocol.RANK_MARK); an attempt after the first `[algo-N#A] line`; with
        `stamp` (its time, --timestamps), `TIME [algo-N] line`; without `prefix`, the
        script's line alone (after its time, if asked)."""
        from rich.text import Text

        from trainctl.protocol import split_rank
        from trainctl.terminal import inert

        process, line = split_rank(line)
        label = f"algo-{rank + 1}" + ("" if process is None else f":{process}")
        if attempt is not None and attempt != 1:
            label += f"#{attempt}"
        text = Text() if stamp is None else Text(f"{stamp:<24} ", style="dim")
        if prefix:
            text.append(f"[{label}] ", style=f"bold {COLOURS[rank % len(COLOURS)]}")
        # A script's colours stay (parsed into rich's styles: NO_COLOR drops them); every
        # other control sequence is shown as text (trainctl.terminal.inert).
        text.append_text(Text.from_ansi(inert(line, keep_colour=True)))
        self.console.print(text)

    def json_line(self, fields: dict[str, object]) -> None:
        """One JSON object on its own line (`logs -o json`): no colour, no wrapping."""
        import json

        self.stream.write(json.dumps(fields) + "\n")
        self.stream.flush()

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
    tail: int | None = None  # only each node's last N lines of what is there now (then follow)
    merge: bool = False  # every node's lines interleaved by time, not node after node
    timestamps: bool = False  # print each line's time before it
    prefix: bool = True  # `[algo-N]` before each line
    output: str = "text"  # text | json (a JSON object a line: time, attempt, node, rank, line)

    def keeps(self, node: int, stamp: str | None, text: str, *, single: bool = False) -> bool:
        """Whether the line is printed; `single`: its node runs one worker process, whose
        global rank is the node's (its lines carry no `[rank R]` mark)."""
        if self.nodes is not None and node not in self.nodes:
            return False
        if self.ranks is not None and line_rank(node, text, single=single) not in self.ranks:
            return False
        # (stamps sort as times do; a line stored before stamps is not known to be recent)
        return self.since is None or (stamp is not None and stamp >= self.since)


def line_rank(node: int, text: str, *, single: bool) -> int | None:
    """The global rank of the worker that printed a node log line: its `[rank R]` mark, or
    on a node of one worker process the node's rank (that worker's); None: no worker's
    (the node agent's own `[trainctl] ...` lines among them)."""
    from trainctl.protocol import split_rank

    process = split_rank(text)[0]
    if process is None and single and not text.startswith(AGENT_LINE):
        return node
    return process


def since_time(value: str | float) -> float:
    """`--since` as a time (seconds since the epoch): a duration back from now (`10m`,
    `2h`, seconds as a number) or a time (`2026-12-02T10:00:00Z`, `2026-12-02 10:00`, a
    date; UTC unless it names its offset). Else SpecError naming --since."""
    from datetime import datetime, timezone

    from trainctl.errors import SpecError
    from trainctl.spec.durations import parse_duration

    if not isinstance(value, str):
        return time.time() - float(value)
    try:
        return time.time() - parse_duration(value, "--since")
    except SpecError:
        pass
    text = value.strip()
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
    except ValueError:
        raise SpecError(
            "--since",
            f"{value!r} is neither a duration (30s, 10m, 2h, 1d) nor a time "
            "(2026-12-02T10:00:00Z; UTC unless it says)",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def log_selection(
    *,
    nodes: list[int | str] | None = None,
    ranks: list[int] | None = None,
    attempts: list[int] | None = None,
    since: str | float | None = None,
    tail: int | None = None,
    merge: bool = False,
    timestamps: bool = False,
    prefix: bool = True,
    output: str = "text",
) -> LogSelection:
    """A LogSelection from what a user writes: nodes as ranks (0) or names (`algo-1`),
    `since` as a duration (`10m`, `2h`), seconds, or a time (see since_time); `output`
    text or json. Bad values: SpecError naming the option."""
    from trainctl.errors import SpecError
    from trainctl.protocol import stamp

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
    if output not in ("text", "json"):
        raise SpecError("--output", f"unknown format {output!r}; allowed: text, json")
    return LogSelection(
        nodes=None if not nodes else frozenset(node_rank(n) for n in nodes),
        ranks=None if not ranks else frozenset(ranks),
        attempts=None if not attempts else tuple(attempts),
        since=None if since is None else stamp(since_time(since)),
        tail=tail,
        merge=merge,
        timestamps=timestamps,
        prefix=prefix,
        output=output,
    )


@dataclass(frozen=True)
class _Line:
    stamp: str | None
    attempt: int
    node: int
    text: str
    rank: int | None = None  # the worker's global rank (None: no worker's line)


class LogFollower:
    """Prints every attempt's node logs from the store, each line once, as they grow
    (`selection`: which lines, in which order, with or without their times)."""

    def __init__(
        self, store, name: str, printer: LogPrinter, selection: LogSelection | None = None
    ) -> None:
        from trainctl.record.keys import JobKeys

        self.store, self.printer = store, printer
        self.selection = selection or LogSelection()
        self.keys = JobKeys(name)
        # per (attempt, rank): bytes printed as whole lines, and the line still incomplete
        self._printed: dict[tuple[int, int], int] = {}
        self._partial: dict[tuple[int, int], bytes] = {}
        self._first = True
        self._workers: dict[int, int] = {}  # attempt -> worker processes a node ran
        self._marked: set[tuple[int, int]] = set()  # (attempt, node) logs with [rank R] lines

    def _single(self, attempt: int, node: int) -> bool:
        """Whether the node ran one worker process in `attempt` (its cluster record says,
        and none of its lines so far carried another worker's mark)."""
        if (attempt, node) in self._marked:
            return False
        if attempt not in self._workers:
            from trainctl.cluster import ClusterInfo

            try:
                cluster = ClusterInfo.model_validate_json(
                    self.store.get_bytes(self.keys.cluster(attempt))
                )
                self._workers[attempt] = cluster.processes_per_host
            except Exception:  # (no record of it: the lines' marks alone tell)
                self._workers[attempt] = 0
        return self._workers[attempt] == 1

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
            lines = _last_of_each_node(lines, self.selection.tail)
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
                    if found_line := self._kept(attempt, node[1], stamp, text):
                        found.append(found_line)
        return found

    def _kept(self, attempt: int, node: int, stamp: str | None, text: str) -> _Line | None:
        from trainctl.protocol import split_rank

        # a line's rank only where it is asked for (--rank, -o json): following a job's logs
        # (attach, fit) reads no cluster record for it
        ranked = self.selection.ranks is not None or self.selection.output == "json"
        if ranked and split_rank(text)[0] is not None:
            self._marked.add((attempt, node))
        single = ranked and self._single(attempt, node)
        if not self.selection.keeps(node, stamp, text, single=single):
            return None
        rank = line_rank(node, text, single=single) if ranked else None
        return _Line(stamp, attempt, node, text, rank)

    def _print(self, line: _Line) -> None:
        from trainctl.protocol import split_rank

        if self.selection.output == "json":
            self.printer.json_line(
                {
                    "time": line.stamp,
                    "attempt": line.attempt,
                    "node": f"algo-{line.node + 1}",
                    "rank": line.rank,
                    "line": split_rank(line.text)[1],
                }
            )
            return
        # a line stored before stamps: its time is unknown
        stamp = (line.stamp or "-") if self.selection.timestamps else None
        self.printer.node_line(
            line.node, line.text, attempt=line.attempt, stamp=stamp, prefix=self.selection.prefix
        )

    def line_offsets(self) -> dict[tuple[int, int], int]:
        """(attempt, rank) -> bytes of that log printed as whole lines so far."""
        return dict(self._printed)

    def flush(self) -> None:
        """The last line of each log, if it has no newline (its node is gone)."""
        from trainctl.protocol import split_stamp

        for (attempt, node), rest in sorted(self._partial.items()):
            if rest:
                stamp, text = split_stamp(rest.decode("utf-8", errors="replace"))
                if kept := self._kept(attempt, node, stamp, text):
                    self._print(kept)
        self._partial.clear()


def _last_of_each_node(lines: list[_Line], count: int) -> list[_Line]:
    """Each node's last `count` lines (kubectl's --tail, per container), in their order."""
    per_node: dict[int, int] = {}
    kept: list[_Line] = []
    for line in reversed(lines):
        if per_node.get(line.node, 0) < count:
            per_node[line.node] = per_node.get(line.node, 0) + 1
            kept.append(line)
    return kept[::-1]


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
