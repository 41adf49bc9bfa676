"""Tuning from the command line: `tune -f tune.yaml` starts a tuning job (see
trainctl.tuning.HyperparameterTuner.from_config), `tuning [NAME]` lists them or shows one's
trials, the best marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trainctl.cli.app import (
    EXIT_FAILED,
    OutputOpt,
    app,
    check_output,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def tune(
    file: Path = typer.Option(
        ..., "-f", "--file", help="tune.yaml: the job's fields and a tuning: block."
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Return once started; `trainctl tuning NAME` follows."
    ),
    output: str = OutputOpt,
) -> None:
    """Start a tuning job: trials of the job with the tuned hyperparameters. `-o json`:
    its progress goes to stderr, the tuning job's summary to stdout."""
    import sys
    from contextlib import redirect_stdout

    from trainctl.cli.submit import load_job_file
    from trainctl.tuning import HyperparameterTuner

    check_output(output)
    tuner = HyperparameterTuner.from_config(load_job_file(file))
    with redirect_stdout(sys.stderr if output == "json" else sys.stdout):
        tuner.fit(wait=not detach)
    info = tuner.describe()
    if output == "json":
        print_json(info)
    if not detach and info["state"] != "Completed":
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def tuning(
    name: str | None = typer.Argument(None, help="A tuning job (none: list them)."),
    plot: bool = typer.Option(False, "--plot", help="The objective of each trial, charted."),
    output: str = OutputOpt,
) -> None:
    """List tuning jobs, or one's trials with their values (the best marked *)."""
    from trainctl.cli.jobs import _console, _fitted_table, _width
    from trainctl.store import default_store
    from trainctl.tuning import TuningAnalytics, tuning_summary
    from trainctl.tuning.record import TuningStore
    from trainctl.tuning.views import tuning_goodput

    check_output(output)
    store = default_store()
    if name is None:
        _list_tuning_jobs(store, output)
        return
    record = TuningStore(store, name).load()
    rows = TuningAnalytics(record, store).rows()
    goodput = tuning_goodput(store, record)
    if output == "json":
        print_json({**tuning_summary(record), "trials": rows, "goodput": goodput})
        return
    best = record.best()
    ranges = list(record.spec.ranges)
    # the job name whole (what `logs` and `status` take), the objective, then as many of
    # the tuned values as there is room for; START-UP: seconds from capacity asked for to
    # the first step ("warm": on a pool a trial left)
    columns: list[tuple[str, int | None]] = [
        ("", None), ("TRIAL", None), ("JOB", None), ("STATE", None),
        (record.spec.objective_metric_name, None),
        *((name, len(ranges) - i) for i, name in enumerate(ranges)),
        ("START-UP", 0),
    ]  # fmt: skip
    table_rows = [
        [
            "*" if best is not None and trial.number == best.number else "",
            str(trial.number),
            trial.job,
            trial.state,
            "-" if trial.objective is None else f"{trial.objective:.6g}",
            *(_value(trial.params.get(r)) for r in ranges),
            _start(row),
        ]
        for trial, row in zip(record.trials, rows, strict=True)
    ]
    console = _console()
    table = _fitted_table(columns, table_rows, _width(console))
    console.print(f"tuning job {record.name}: {record.state} ({record.spec.strategy}, "
                  f"{record.spec.objective_type} {record.spec.objective_metric_name})")  # fmt: skip
    console.print(table)
    if goodput is not None:
        console.print(f"goodput: {goodput['text']}", highlight=False)
    pruned = [t for t in record.trials if t.state == "Pruned"]
    for trial in pruned:
        console.print(f"trial {trial.number}: {trial.reason}", highlight=False)
    if plot:
        print(_objective_chart(record))


def _list_tuning_jobs(store: Any, output: str) -> None:
    """`trainctl tuning`: every tuning job, a line each (a table, or JSON)."""
    from trainctl.cli.jobs import _console, _fitted_table, _state_text, _width
    from trainctl.tuning import tuning_jobs, tuning_summary

    unreadable: list[tuple[str, str]] = []
    records = tuning_jobs(store, unreadable)
    if output == "json":
        print_json(
            [tuning_summary(r) for r in records]
            + [{"name": n, "state": "Unreadable", "problem": why} for n, why in unreadable]
        )
        return
    rows: list[list[Any]] = []
    for r in records:
        best = r.best()
        rows.append(
            [
                r.name,
                r.state,
                r.spec.strategy,
                f"{len([t for t in r.trials if t.state not in ('Pending', 'Running')])}"
                f"/{r.spec.max_jobs}",
                "-" if best is None else f"{best.objective:.6g} (trial {best.number})",
            ]
        )
    for tuning_name, _ in unreadable:  # the line saying why: `trainctl tuning NAME`
        rows.append([tuning_name, _state_text("Unreadable"), "-", "-", "-"])
    console = _console()
    columns = [("NAME", None), ("STATE", None), ("STRATEGY", 0), ("TRIALS", 2), ("BEST", 1)]
    console.print(_fitted_table(columns, rows, _width(console)))


def _start(row: dict[str, Any]) -> str:
    if row.get("StartSeconds") is None:
        return "-"
    return f"{row['StartSeconds']:.1f}s" + (" warm" if row.get("WarmStart") else "")


def _value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _objective_chart(record: Any, width: int = 80) -> str:
    """Each ended trial's objective against its number, the best so far as a line."""
    import plotext as plt

    done = [t for t in record.trials if t.objective is not None]
    if not done:
        return "no trial has an objective yet"
    plt.clear_figure()
    plt.plotsize(width, 16)
    plt.theme("clear")
    xs = [t.number for t in done]
    plt.scatter(xs, [t.objective for t in done], label="trial")
    sign = 1 if record.spec.objective_type == "Maximize" else -1
    best, running = [], None
    for t in done:
        value = t.objective if t.state == "Completed" else None
        if value is not None and (running is None or sign * value > sign * running):
            running = value
        best.append(running if running is not None else float("nan"))
    plt.plot(xs, best, label="best so far")
    if len(xs) <= 20:  # trials are numbered: whole ticks, not 2.5
        plt.xticks(xs)
    plt.xlabel("trial")
    plt.title(record.spec.objective_metric_name)
    return str(plt.uncolorize(plt.build()))
