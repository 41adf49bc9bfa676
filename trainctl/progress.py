"""Progress where work is long (a source upload, an image build, a wait for capacity): a rich
progress bar or spinner on a terminal and in a notebook; nothing when output is not a
terminal (a pipe, a log file, `-o json`).

    with progress_task("uploading source", total=size) as advance:
        store.put_file(key, path, progress=advance)

`quiet()` turns it off for the rest of the process (the CLI's `-o json`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_quiet = False


def quiet(on: bool = True) -> None:
    global _quiet
    _quiet = on


def shown() -> bool:
    """Whether progress is drawn: a terminal on stderr, or a notebook, and not quiet."""
    if _quiet:
        return False
    from trainctl.notebook import in_notebook

    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or in_notebook()


@contextmanager
def progress_task(
    description: str, *, total: float | None = None, bytes_: bool = True
) -> Iterator[Callable[[float], None]]:
    """A bar (with `total`, in bytes unless `bytes_` is False) or a spinner; yields
    `advance(n)`. A no-op where progress is not shown."""
    if not shown():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns: list = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns.append(BarColumn())
        columns += [DownloadColumn(), TransferSpeedColumn()] if bytes_ else []
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner with a message that can change (`update(text)`): for waits of unknown
    length (an image build's current step, capacity being retried)."""
    if not shown():
        yield lambda text: None
        return
    from rich.console import Console

    with Console(stderr=True).status(message) as spinner:
        yield lambda text: spinner.update(f"{message}: {text}")
