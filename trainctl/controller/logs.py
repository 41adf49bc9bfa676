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
        from rich.text import Text

        label = (
            f"algo-{rank + 1}" if attempt is None or attempt == 1 else f"algo-{rank + 1}#{attempt}"
        )
        text = Text(f"[{label}] ", style=f"bold {COLOURS[rank % len(COLOURS)]}")
        text.append(line)
        self.console.print(text)

    def info(self, message: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"[trainctl] {message}", style="bold"))


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
    """Print every attempt's node logs from the store; with `follow`, until the job ends."""
    from trainctl.errors import NotFoundError
    from trainctl.record import JobKeys

    keys = JobKeys(name)
    offsets: dict[str, int] = {}
    partial: dict[str, str] = {}

    def attempts_now() -> list[int]:
        found = []
        for d in store.list_dirs(f"{keys.prefix}/logs"):
            if d.startswith("attempt-") and d[8:].isdigit():
                found.append(int(d[8:]))
        return sorted(found) if attempts is None else [a for a in sorted(found) if a in attempts]

    def drain() -> None:
        for attempt in attempts_now():
            for info in store.list(keys.logs_dir(attempt)):
                leaf = info.key.rsplit("/", 1)[-1]
                if not (leaf.startswith("node-") and leaf.endswith(".log")):
                    continue
                rank = int(leaf[5:-4])
                start = offsets.get(info.key, 0)
                if info.size <= start:
                    continue
                try:
                    chunk = store.get_range(info.key, start)
                except NotFoundError:
                    continue
                offsets[info.key] = start + len(chunk)
                text = partial.pop(info.key, "") + chunk.decode("utf-8", errors="replace")
                lines = text.split("\n")
                if lines[-1]:
                    partial[info.key] = lines[-1]
                for line in lines[:-1]:
                    printer.node_line(rank, line, attempt=attempt)

    while True:
        done = is_done()
        drain()
        if not follow or done:
            break
        time.sleep(poll)
    for key, rest in partial.items():  # a last line without newline
        rank = int(key.rsplit("/", 1)[-1][5:-4])
        printer.node_line(rank, rest)
