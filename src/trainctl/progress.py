"""Progress where work is long (a source upload, an image build, a wait for capacity): a rich
progress bar or spinner on a terminal; in a notebook one text line updated in place (rich's
live display needs ipywidgets there, which a notebook may not have: it would warn and leave
empty outputs), ending as what was done; nothing when output is not a terminal (a pipe, a
log file, `-o json`).

    with progress_task("uploading source", total=size) as advance:
        store.put_file(key, path, progress=advance)

`quiet()` turns it off for the rest of the process (the CLI's `-o json`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trainctl.clock import clock

# How often a notebook's progress line is redrawn (each redraw is a message to the browser).
NOTEBOOK_REDRAW_SECONDS = 0.5

_quiet = False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel running a cell (not a terminal IPython)."""
    import sys

    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def quiet(on: bool = True) -> None:
    global _quiet
    _quiet = on


@contextmanager
def silenced() -> Iterator[None]:
    """No progress drawn inside (a replay's simulated jobs package and upload too: their
    bars would fight the spinner of the command that runs them); as it was after."""
    global _quiet
    was, _quiet = _quiet, True
    try:
        yield
    finally:
        _quiet = was


def shown() -> bool:
    """Whether progress is drawn: a terminal on stderr, or a notebook, and not quiet."""
    if _quiet:
        return False
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
    if in_notebook():
        with _notebook_task(description, total, bytes_) as advance:
            yield advance
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    from trainctl.terminal import console

    columns: list = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns.append(BarColumn())
        columns += [DownloadColumn(), TransferSpeedColumn()] if bytes_ else []
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner with a message that can change (`update(text)`): for waits of unknown
    length (an image build's current step, capacity being retried)."""
    if not shown():
        yield lambda text: None
        return
    if in_notebook():
        line = _NotebookLine(message)
        try:
            yield lambda text: line.show(f"{message}: {text}")
        finally:
            line.show(f"{message}: done in {line.elapsed():.1f} s", force=True)
        return
    from trainctl.terminal import console

    with console(stderr=True).status(message) as spinner:
        yield lambda text: spinner.update(f"{message}: {text}")


class _NotebookLine:
    """One line of text in the cell's output, replaced in place (IPython's display_id)."""

    def __init__(self, text: str) -> None:
        from IPython.display import display

        self.started = clock().monotonic()
        self._drawn = 0.0
        self.handle: Any = display({"text/plain": text}, raw=True, display_id=True)

    def elapsed(self) -> float:
        return clock().monotonic() - self.started

    def show(self, text: str, *, force: bool = False) -> None:
        now = clock().monotonic()
        if self.handle is not None and (force or now - self._drawn >= NOTEBOOK_REDRAW_SECONDS):
            self.handle.update({"text/plain": text}, raw=True)
            self._drawn = now


@contextmanager
def _notebook_task(
    description: str, total: float | None, bytes_: bool
) -> Iterator[Callable[[float], None]]:
    from rich.filesize import decimal

    done = [0.0]

    def amount() -> str:
        if not bytes_:
            return f"{done[0]:g}" + ("" if total is None else f"/{total:g}")
        return decimal(int(done[0])) + ("" if total is None else f"/{decimal(int(total))}")

    line = _NotebookLine(f"{description} ...")

    def advance(n: float) -> None:
        done[0] += n
        line.show(f"{description}: {amount()}")

    try:
        yield advance
    finally:
        line.show(f"{description}: {amount()} in {line.elapsed():.1f} s", force=True)
