"""Printing and following node logs: one prefix and colour per node."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


class LogPrinter:
    """Writes `[algo-N] line` to a terminal (coloured) or a plain stream."""

    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None) -> None:
        from rich.console import Console

        self.stream = stream or sys.stdout
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.console = Console(
            file=self.stream,
            force_terminal=colour if colour is not None else None,
            no_color=not (colour if colour is not None else is_tty),
            highlight=False,
            soft_wrap=True,
        )

    def node_line(self, rank: int, line: str, *, attempt: int | None = None) -> None:
        """`[algo-N] line`; a line of one of several processes `[algo-N:R] line` (R: its
        rank, see protocol.RANK_MARK); an attempt after the first `[algo-N#A] line`."""
        from rich.text import Text

        from trainctl.protocol import split_rank

        process, line = split_rank(line)
        label = f"algo-{rank + 1}" + ("" if process is None else f":{process}")
        if attempt is not None and attempt != 1:
            label += f"#{attempt}"
        text = Text(f"[{label}] ", style=f"bold {COLOURS[rank % len(COLOURS)]}")
        text.append(line)
        self.console.print(text)

    def info(self, message: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"[trainctl] {message}", style="bold"))


class LogFollower:
    """Prints every attempt's node logs from the store, each line once, as they grow."""

    def __init__(
        self, store, name: str, printer: LogPrinter, attempts: list[int] | None = None
    ) -> None:
        from trainctl.record import JobKeys

        self.store, self.printer, self.attempts = store, printer, attempts
        self.keys = JobKeys(name)
        # per (attempt, rank): bytes printed as whole lines, and the line still incomplete
        self._printed: dict[tuple[int, int], int] = {}
        self._partial: dict[tuple[int, int], bytes] = {}

    def _attempts_now(self) -> list[int]:
        found = []
        for d in self.store.list_dirs(f"{self.keys.prefix}/logs"):
            if d.startswith("attempt-") and d[8:].isdigit():
                found.append(int(d[8:]))
        found.sort()
        return found if self.attempts is None else [a for a in found if a in self.attempts]

    def drain(self) -> None:
        from trainctl.errors import NotFoundError

        for attempt in self._attempts_now():
            for info in self.store.list(self.keys.logs_dir(attempt)):
                leaf = info.key.rsplit("/", 1)[-1]
                if not (leaf.startswith("node-") and leaf.endswith(".log")):
                    continue
                node = (attempt, int(leaf[5:-4]))
                pending = self._partial.get(node, b"")
                start = self._printed.get(node, 0) + len(pending)
                if info.size <= start:
                    continue
                try:
                    chunk = self.store.get_range(info.key, start)
                except NotFoundError:
                    continue
                *lines, rest = (pending + chunk).split(b"\n")
                self._partial[node] = rest
                self._printed[node] = start + len(chunk) - len(rest)
                for line in lines:
                    text = line.decode("utf-8", errors="replace")
                    self.printer.node_line(node[1], text, attempt=attempt)

    def line_offsets(self) -> dict[tuple[int, int], int]:
        """(attempt, rank) -> bytes of that log printed as whole lines so far."""
        return dict(self._printed)

    def flush(self) -> None:
        for (_attempt, rank), rest in self._partial.items():  # a last line without newline
            if rest:
                self.printer.node_line(rank, rest.decode("utf-8", errors="replace"))
        self._partial.clear()


def follow_logs(
    store,
    name: str,
    printer: LogPrinter,
    *,
    follow: bool,
    is_done: Callable[[], bool],
    poll: float = 0.5,
    attempts: list[int] | None = None,
) -> None:
    """Print every attempt's node logs from the store; with `follow`, until `is_done()`."""
    follower = LogFollower(store, name, printer, attempts)
    while True:
        done = is_done()
        follower.drain()
        if not follow or done:
            break
        time.sleep(poll)
    follower.flush()
