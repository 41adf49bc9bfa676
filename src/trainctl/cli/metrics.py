"""`trainctl metrics JOB` (a job's metric history as a table, JSON, CSV or terminal charts),
`trainctl ui` (the web dashboard) and `trainctl tensorboard` (TensorBoard over jobs' logs)."""

from __future__ import annotations

import csv
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import typer

from trainctl.cli.app import JobArg, app, handle_errors, print_json
from trainctl.ui import TOKEN_VARIABLE

FOLLOW_SECONDS = 2.0
COLUMNS = ["time", "name", "value", "step", "attempt", "rank", "redone"]


@app.command()
@handle_errors
def metrics(
    job: str = JobArg,
    metric: list[str] | None = typer.Option(
        None, "--metric", "-m", help="Only this metric; repeatable."
    ),
    output: str = typer.Option("text", "-o", "--output", help="text, json or csv."),
    plot: bool = typer.Option(False, "--plot", help="A terminal chart per metric."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Refresh until the job ends."),
) -> None:
    """Show a job's metrics: the latest value of each (with a sparkline), every value
    (-o json|csv), or charts (--plot) with each attempt's part of the curve."""
    from trainctl.errors import SpecError
    from trainctl.estimator import TrainingJob

    if output not in ("text", "json", "csv"):
        raise SpecError("--output", f"unknown format {output!r}; allowed: text, json, csv")
    handle = TrainingJob.attach(job)
    printed: set[tuple[Any, ...]] = set()  # -f with json/csv: each value once, as it comes
    live = None
    if follow and output == "text" and sys.stdout.isatty():
        from rich.live import Live

        from trainctl.terminal import console

        # redrawn in place on the terminal (the last view stays when the job ends)
        live = Live(console=console(highlight=False), auto_refresh=False)
        live.start()
    try:
        while True:
            ended = handle.state.is_terminal()
            points = handle.metric_history(metric)
            if not points and (ended or not follow):
                raise SpecError(
                    "JOB",
                    f"job {job} has no metrics (give metric_definitions, or call "
                    "report_step(step, loss=...) in the script)",
                )
            if follow and output in ("json", "csv"):
                _stream(points, output, printed)
            elif live is not None:
                live.update(_view(points, metric, plot), refresh=True)
            else:
                _show(points, metric, output, plot)
            if not follow or ended:
                return
            time.sleep(FOLLOW_SECONDS)
    finally:
        if live is not None:
            live.stop()


def _stream(points: list[dict[str, Any]], output: str, printed: set[tuple[Any, ...]]) -> None:
    """The values not printed yet: JSON lines, or CSV rows under one header."""
    import json

    fresh = []
    for point in points:
        key = _key(point)
        if key not in printed:
            printed.add(key)
            fresh.append(point)
    if output == "json":
        for point in fresh:
            sys.stdout.write(json.dumps(point) + "\n")
    else:
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore")
        if fresh and len(printed) == len(fresh):  # the first values: the header first
            writer.writeheader()
        writer.writerows(fresh)
    sys.stdout.flush()


def _key(point: dict[str, Any]) -> tuple[Any, ...]:
    return (point["time"], point["name"], point.get("rank"), point.get("step"))


def _show(points: list[dict[str, Any]], names: list[str] | None, output: str, plot: bool) -> None:
    if output == "json":
        print_json(points)
        return
    if output == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(points)
        return
    from trainctl.terminal import console

    view = _view(points, names, plot)
    console(highlight=False, soft_wrap=plot).print(view)


def _view(points: list[dict[str, Any]], names: list[str] | None, plot: bool) -> Any:
    """The text view (a rich renderable): a table of each metric's latest value and trend,
    or a chart per metric (--plot), coloured on a terminal."""
    from rich.table import Table
    from rich.text import Text

    from trainctl.metrics import latest, series, sparkline, terminal_chart

    shown = names or sorted({p["name"] for p in points})
    if plot:
        tty = sys.stdout.isatty()
        width = min(100, shutil.get_terminal_size().columns) if tty else 80
        charts = "\n".join(terminal_chart(points, name, width=width, colour=tty) for name in shown)
        return Text.from_ansi(charts)
    table = Table(box=None, header_style="bold")
    for col in ("METRIC", "LATEST", "STEP", "ATTEMPT", "VALUES", "TREND"):
        table.add_column(col, no_wrap=True)
    last = latest(points)
    for name in shown:
        point = last.get(name)
        curve = series(points, name)
        table.add_row(
            name,
            "-" if point is None else f"{point['value']:g}",
            "-" if point is None or point.get("step") is None else str(point["step"]),
            "-" if point is None else str(point.get("attempt")),
            str(len(curve)),
            sparkline([p["value"] for p in curve]),
        )
    return table


@app.command()
@handle_errors
def ui(
    port: int = typer.Option(8377, "--port", "-p", help="Port to listen on."),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on. Any but loopback needs a token (--token, else one is "
        "made and printed).",
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar=TOKEN_VARIABLE,
        show_envvar=True,
        help="Required on every request (?token=... once). On a shared machine give it in "
        f"{TOKEN_VARIABLE} or --token-file: a command line is every user's to read.",
    ),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="Read the token from this file (yours alone: mode 0600)."
    ),
) -> None:
    """A read-only web dashboard over the store: jobs, attempts, live logs, metric charts,
    artifacts."""
    from trainctl.store import default_store
    from trainctl.ui import check_bind, read_token_file, serve

    on_command_line = any(a == "--token" or a.startswith("--token=") for a in sys.argv)
    if token_file is not None:
        token = read_token_file(token_file)
    token = check_bind(host, port, token)

    def ready(url: str) -> None:
        sys.stderr.write(f"trainctl ui: {url} (Ctrl-C to stop)\n")
        if on_command_line and token_file is None:
            sys.stderr.write(
                "trainctl ui: warning: --token is visible to every user of this machine "
                f"(ps); give it in {TOKEN_VARIABLE} or --token-file\n"
            )
        sys.stderr.flush()

    serve(default_store(), host=host, port=port, token=token, ready=ready)


@app.command()
@handle_errors
def tensorboard(
    jobs: list[str] = typer.Argument(
        ..., metavar="JOB...", help="Jobs (or tuning jobs: each trial a run) to show side by side."
    ),
    port: int = typer.Option(6006, "--port", "-p", help="Port to listen on (0: a free one)."),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Loopback address to listen on (its token is sent in plain HTTP).",
    ),
    refresh: float = typer.Option(
        5.0, "--refresh", help="Seconds between copies of what running jobs wrote since."
    ),
) -> None:
    """TensorBoard over jobs' TensorBoard logs, running or ended: what their scripts write to
    TRAINCTL_TENSORBOARD_DIR (SageMaker's tensorboard_output_config), a run per job."""
    from trainctl.procs import sigterm_interrupts
    from trainctl.tensorboard import TensorBoard

    board = TensorBoard(jobs, host=host, port=port, refresh_seconds=refresh)
    sys.stderr.write(f"trainctl tensorboard: copying the logs of {len(board.sources)} run(s)\n")
    sys.stderr.flush()
    with sigterm_interrupts():
        try:
            url = board.start()
            sys.stderr.write(f"trainctl tensorboard: {url} (Ctrl-C to stop)\n")
            sys.stderr.flush()
            board.wait()
        finally:
            board.stop()
