"""Jobs after submit: `jobs`, `status`, `logs`, `events`, `attach`, `stop`, `rm`, `prune`."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from trainctl.cli.app import (
    EXIT_FAILED,
    JobArg,
    OutputOpt,
    app,
    check_output,
    complete_job_names,
    err,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def jobs(
    pattern: str | None = typer.Argument(
        None, metavar="[PATTERN]", help="Only names that match this glob (train-*)."
    ),
    state: list[str] | None = typer.Option(
        None, "--state", "-s", help="Only jobs in this state (Training, Failed...); repeatable."
    ),
    limit: int | None = typer.Option(None, "--limit", "-l", help="Only the newest N."),
    watch: bool = typer.Option(
        False, "--watch", "-w", help="Keep the list up to date until Ctrl-C."
    ),
    every: bool = typer.Option(
        False,
        "--all",
        "-a",
        help="Also tuning trials (`trainctl tuning NAME` lists them) and `trainctl "
        "diagnose`'s measurement runs (--keep).",
    ),
    output: str = OutputOpt,
) -> None:
    """List jobs, newest first: name, state, instances, created (UTC), duration, attempts,
    cost. Columns a narrow terminal has no room for are left out, the least needed first;
    `-o json` has every field."""
    from trainctl.record.search import find_jobs
    from trainctl.store import default_store

    check_output(output)
    store = default_store()

    def listed() -> tuple[list[Any], list[Any], dict[str, Any]]:
        from trainctl.controller.supervise import controller_view
        from trainctl.record.jobstore import JobStore

        records, unreadable = find_jobs(
            store, every=every, states=state, pattern=pattern, limit=limit
        )
        views = {r.name: controller_view(JobStore(store, r.name), r) for r in records}
        return records, unreadable, views

    records, unreadable, views = listed()
    if output == "json":
        print_json(
            [{**r.describe(), "controller": views[r.name]} for r in records]
            + [u.describe() for u in unreadable]
        )
        return
    if watch:
        _watch_jobs(listed)
        return
    if not records and not unreadable:
        # say where it looked: a demo or a test may have used another TRAINCTL_HOME
        from trainctl.spec.settings import get_settings

        home = get_settings().home
        narrowed = " matching" if (pattern or state or limit) else ""
        sys.stderr.write(f"No{narrowed} jobs in {store.uri} (TRAINCTL_HOME={home}).\n")
        return
    console = _console()
    console.print(_jobs_table(records, unreadable, views, _width(console)))
    for u in unreadable:  # why, one line each, beside the table (a pipe gets the table)
        sys.stderr.write(f"{u.problem}; `trainctl rm --unreadable {u.name}` deletes it\n")
    lost = [name for name, view in views.items() if view and view.get("lost")]
    if lost:  # the way out, where the problem is seen
        sys.stderr.write(
            f"A lost controller's job is taken over by `trainctl attach JOB` "
            f"(here: trainctl attach {lost[0]}).\n"
        )


# How often `jobs --watch` looks at the store again.
WATCH_SECONDS = 2.0


def _watch_jobs(listed: Any) -> None:
    """The list, redrawn in place on a terminal; to a pipe, printed again whenever it
    changes (kubectl get -w). Until Ctrl-C or SIGTERM (exit 130)."""
    import signal
    import time

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # both, whatever was inherited: a shell's background job starts with SIGINT ignored
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    console = _console()
    if console.is_terminal:
        from rich.live import Live

        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                records, unreadable, views = listed()
                live.update(_jobs_table(records, unreadable, views, _width(console)), refresh=True)
                time.sleep(WATCH_SECONDS)
    shown = None
    while True:
        records, unreadable, views = listed()
        table = _jobs_table(records, unreadable, views, None)
        with console.capture() as captured:
            console.print(table)
        text = captured.get()
        if text != shown:
            sys.stdout.write(("\n" if shown is not None else "") + text)
            sys.stdout.flush()
            shown = text
        time.sleep(WATCH_SECONDS)


def _jobs_table(records: list[Any], unreadable: list[Any], views: dict[str, Any], width: Any):
    """`trainctl jobs`' table, fitted to `width` columns (None: every column)."""
    rows = [
        [
            r.name,
            _state_text(r.state.value, views[r.name]),
            f"{r.spec.instance_count} x {r.spec.instance_type}",
            _created(r.created_at),
            _duration(r.duration_s),
            str(len(r.attempts)),
            _cost_cell(r),
        ]
        for r in records
    ]
    rows += [[u.name, _state_text("Unreadable"), "-", "-", "-", "-", "-"] for u in unreadable]
    # the name is what every other command takes: always whole, as are a time's digits;
    # a column with no room is left out, the least needed first (never cut inside)
    columns = [
        ("NAME", None),
        ("STATE", None),
        ("INSTANCES", 2),
        ("CREATED", 4),
        ("DURATION", 3),
        ("ATTEMPTS", 0),
        ("COST", 1),
    ]
    return _fitted_table(columns, rows, width)


def _fitted_table(columns: list[tuple[str, int | None]], rows: list[list[Any]], width: Any):
    """A table of `rows` under `columns` (header, drop order: lowest first; None: always
    kept) that fits `width` terminal columns (None: all), every cell on one line and
    whole. Only a column that is always kept may still be wider than the terminal (a long
    name): the terminal then wraps its line."""
    from rich.table import Table
    from rich.text import Text

    def cell_len(value: Any) -> int:
        return Text(value).cell_len if isinstance(value, str) else value.cell_len

    gap = 2
    widths = [
        max([len(header), *(cell_len(row[i]) for row in rows)])
        for i, (header, _) in enumerate(columns)
    ]
    kept = list(range(len(columns)))

    def says_nothing(i: int) -> bool:  # every cell `-` (a cost where nothing is priced)
        return all(_plain(row[i]) == "-" for row in rows)

    droppable = sorted(
        (i for i, (_, order) in enumerate(columns) if order is not None),
        key=lambda i: (not says_nothing(i), columns[i][1]),
    )
    while (
        width is not None
        and droppable
        and (sum(widths[i] for i in kept) + gap * (len(kept) - 1) > width)
    ):
        kept.remove(droppable.pop(0))
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, gap // 2))
    for i in kept:
        table.add_column(columns[i][0], no_wrap=True, min_width=widths[i])
    for row in rows:
        table.add_row(*(_one_line(row[i]) for i in kept))
    return table


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else value.plain


def _cost_cell(record: Any) -> str:
    """What the job's instances cost ($), `-` where nothing is priced (this machine)."""
    from trainctl.record.costs import cost_summary

    cost = cost_summary(record.instances)  # (describe()'s cost, without the rest of it)
    if not cost or cost["usd"] is None:
        return "-"
    return f"${cost['usd']:.2f}"


def _console() -> Any:
    """A console as wide as the terminal; piped, as wide as the lines are (a pipe or a file
    gets every column whole, never the 80 columns rich assumes)."""
    from trainctl.terminal import console

    out = console(highlight=False)
    if not out.is_terminal:
        out = console(highlight=False, width=100_000)
    return out


def _width(console: Any) -> int | None:
    """The columns a table may fill: the terminal's; None for a pipe or a file (every
    column whole)."""
    return console.width if console.is_terminal else None


def _one_line(value: Any) -> Any:
    from rich.text import Text

    text = value.copy() if isinstance(value, Text) else Text(" ".join(str(value).split()))
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _created(iso: str) -> str:
    """`11-26 15:25` (UTC): the year and seconds only cost width."""
    return f"{iso[5:10]} {iso[11:16]}"


def _state_text(state: str, controller: dict[str, Any] | None = None) -> Any:
    """The state; for a job whose controller is lost, how long ago it went silent (the
    record says Training, but nobody is watching it: `trainctl attach` takes it over)."""
    from rich.text import Text

    colour = {"Completed": "green", "Failed": "red", "Stopped": "yellow", "Unreadable": "red"}
    colour = colour.get(state, "cyan")
    text = Text(state, style=colour)
    if controller and controller.get("lost"):
        text.append(f" — controller lost {controller['silent_seconds']:.0f} s ago", style="red")
    return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


@app.command()
@handle_errors
def status(job: str = JobArg, output: str = OutputOpt) -> None:
    """Show a job's state, attempts, failure reason and model."""
    from trainctl.controller.supervise import controller_view
    from trainctl.record.jobstore import JobStore
    from trainctl.store import default_store

    check_output(output)
    jobs = JobStore(default_store(), job)
    record = jobs.load()
    controller = controller_view(jobs, record)
    info = {**record.describe(), "controller": controller}
    if output == "json":
        print_json(info)
        return
    console = _console()
    _print_fields(console, _status_rows(jobs, record, info))
    if record.failure_detail:
        console.print(record.failure_detail, markup=False)
    if record.attempts:
        console.print(_attempts_table(record))


def _status_rows(jobs: Any, record: Any, info: dict[str, Any]) -> list[tuple[str, Any]]:
    """`status`' fields of a job (its record and describe())."""
    controller = info["controller"]
    rows = [
        ("name", record.name),
        ("state", _state_text(record.state.value, controller)),
        ("instances", f"{record.spec.instance_count} x {record.spec.instance_type}"),
        ("launcher", record.spec.launcher),
        ("entry point", f"{record.spec.entry_point} (in {record.spec.source_dir})"),
        ("created", record.created_at),
        ("duration", _duration(record.duration_s)),
        ("exit code", "-" if record.exit_code is None else str(record.exit_code)),
        ("model", record.model_data or "-"),
        ("store", info["store"]),
    ]
    if record.metrics:
        from trainctl.metrics import series, sparkline

        history = jobs.metric_history(record)
        rows.append(
            (
                "metrics",
                ", ".join(
                    f"{k}={v:g} {sparkline([p['value'] for p in series(history, k)])}".rstrip()
                    for k, v in record.metrics.items()
                ),
            )
        )
    if (progress := info["progress"]) is not None:
        from trainctl.record.models import progress_text

        rows.append(("progress", progress_text(progress)))
    if record.waiting and not record.state.is_terminal():
        rows.append(("waiting", record.waiting))
    if controller and controller.get("lost"):
        rows.append(("take over", f"trainctl attach {record.name}"))
    if record.stop_reason:
        rows.append(("stopped", record.stop_reason))
    if record.failure_reason:
        rows.append(("failure", record.failure_reason))
    rows += [("warning", text) for text in record.warnings]
    if (cost := info["cost"]) is not None:
        from trainctl.record.costs import cost_text

        rows.append(("cost", cost_text(cost)))
    if (goodput := info["goodput"]) is not None:
        rows.append(("goodput", goodput["text"]))
    if record.attempts:
        latest = record.attempts[-1]
        rows.append(("started from", latest.started_from()))
        by_node = latest.restored_by_node()
        if len(by_node) > 1:
            rows.append(("restored", " · ".join(f"{k}: {v}" for k, v in by_node.items())))
        if latest.restored is not None and latest.restored.split:
            rows.append(("split resume", latest.restored.split))
    if record.attempts and (startup := record.attempts[-1].startup):
        rows.append(
            ("start-up", " · ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in startup.items()))
        )
    if record.attempts and (recovery := record.attempts[-1].recovery):
        # since what interrupted the attempt before: each stage, as bench/recovery.py has them
        rows.append(("recovery", " · ".join(f"{k.replace('_', ' ')} {v:.1f} s"
                                             for k, v in recovery.items())))  # fmt: skip
    return rows


def _attempts_table(record: Any) -> Any:
    """`status`' table of a job's attempts, one line each."""
    from rich.table import Table

    attempts = Table(title="attempts", title_justify="left", box=None, header_style="bold")
    for col in ("#", "NODES", "STARTED", "ENDED", "OUTCOME"):
        attempts.add_column(col, no_wrap=True)
    # where it started ('step 120', 'snapshot.pt +1', 'scratch'; in full above)
    attempts.add_column("FROM", no_wrap=True, overflow="ellipsis", max_width=16)
    for col in ("STEP", "LOST"):
        attempts.add_column(col, no_wrap=True)
    ids = any(a.capacity_id for a in record.attempts)  # the provider's (Slurm job ids)
    if ids:
        attempts.add_column("ID", no_wrap=True)
    attempts.add_column("CAUSE")  # one line: the full reason is above the table

    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    for a in record.attempts:
        # an elastic job's size change is where the attempt began: shown before its end
        cause = "; ".join(text for text in (a.resized, a.cause) if text) or "-"
        attempts.add_row(
            str(a.number),
            str(len(a.nodes)) if a.nodes else "-",
            a.started_at[11:19],
            (a.ended_at or "")[11:19] or "-",
            a.outcome or "running",
            a.started_from(short=True),
            num(a.last_step),
            num(a.steps_lost),
            *([a.capacity_id or "-"] if ids else []),
            _one_line(cause),
        )
    return attempts


def _print_fields(console: Any, rows: list[tuple[str, Any]]) -> None:
    """`key  value` lines. Prose wraps at words under its value's column; a value of one
    word (a URI, a path) is never broken: the terminal wraps it, so a copy gets it whole."""
    from rich.table import Table
    from rich.text import Text

    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        text = value if isinstance(value, Text) else Text(str(value))
        if " " not in text.plain:
            console.print(Text.assemble((key.ljust(width), "bold"), text), soft_wrap=True)
            continue
        grid = Table.grid()
        grid.add_column(style="bold", width=width, no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row(key, text)
        console.print(grid)


@app.command()
@handle_errors
def logs(
    job: str = JobArg,
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends."),
    node: list[str] | None = typer.Option(
        None, "--node", "-n", help="Only this node: its rank (0) or algo-N; repeatable."
    ),
    rank: list[int] | None = typer.Option(
        None,
        "--rank",
        help="Only this worker process (its global rank; a node of one process has its "
        "node's); repeatable.",
    ),
    attempt: list[int] | None = typer.Option(
        None, "--attempt", "-a", help="Only this attempt; repeatable."
    ),
    tail: int | None = typer.Option(
        None, "--tail", help="Only each node's last N lines (then follow)."
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        help="Only lines from the last 30s, 10m, 2h, 1d, or since a time "
        "(2026-12-02T10:00:00Z; UTC unless it says).",
    ),
    timestamps: bool = typer.Option(
        False, "--timestamps", "-t", help="Each line's time (UTC) before it."
    ),
    merge: bool = typer.Option(False, "--merge", help="Every node's lines interleaved by time."),
    no_prefix: bool = typer.Option(
        False, "--no-prefix", help="The script's lines alone, without [algo-N]."
    ),
    output: str = typer.Option(
        "text",
        "-o",
        "--output",
        help="text, or json: a JSON object a line (time, attempt, node, rank, line).",
    ),
) -> None:
    """Print every node's log (all attempts) from the store, node after node (--merge:
    interleaved by time); -f follows until the job ends and then, like `attach`, prints its
    verdict and exits non-zero unless it Completed (or, when its controller is lost, says
    so: `trainctl attach` then takes it over)."""
    from trainctl.controller.logs import LogPrinter
    from trainctl.controller.submit import print_summary
    from trainctl.estimator import TrainingJob
    from trainctl.state import JobState

    check_output(output)
    handle = TrainingJob.attach(job)
    handle.logs(
        follow=follow,
        node=node,
        rank=rank,
        attempt=attempt,
        tail=tail,
        since=since,
        timestamps=timestamps,
        merge=merge,
        prefix=not no_prefix,
        output=output,
    )
    if not follow:
        return
    if (controller := handle.describe()["controller"]) and controller["lost"]:
        err(
            f"job {job}'s controller is lost ({controller['silent_seconds']:.0f} s silent); "
            f"`trainctl attach {job}` takes it over"
        )
        raise typer.Exit(EXIT_FAILED)
    record = handle._record()
    if output == "text":  # (JSON lines are the lines alone; the exit code is the verdict)
        print_summary(LogPrinter(sys.stdout), record)
    if record.state is not JobState.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def events(
    job: str = JobArg,
    kind: list[str] | None = typer.Option(
        None, "--type", "-t", help="Only events of this type (state, startup...); repeatable."
    ),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until it ends."),
    output: str = typer.Option(
        "text", "-o", "--output", help="text, or json: a JSON object a line, as stored."
    ),
) -> None:
    """A job's timeline: every state change, attempt, start-up, restore, relaunch and
    teardown, with its time (UTC) and how long after the job's first event."""
    from trainctl.estimator import TrainingJob
    from trainctl.terminal import inert

    check_output(output)
    handle = TrainingJob.attach(job)
    first: list[str] = []

    def show(event: dict[str, Any]) -> None:
        if output == "json":
            sys.stdout.write(json.dumps(event, default=str) + "\n")
        else:
            first[:] = first or [str(event.get("time", ""))]
            sys.stdout.write(inert(_event_line(event, first[0])) + "\n")
        sys.stdout.flush()

    handle.follow_events(show, types=kind, follow=follow)


def _event_line(event: dict[str, Any], first: str) -> str:
    """`16:36:23.703  +0.0s  state  Pending -> Provisioning  attempt=1`: its time (UTC),
    since the first event shown, its type and its fields."""
    from trainctl.record.keys import parse_iso

    when = str(event.get("time", ""))
    try:
        since = f"+{parse_iso(when) - parse_iso(first):.1f}s"
    except Exception:
        since = "-"
    fields = {k: v for k, v in event.items() if k not in ("time", "type")}
    if event.get("type") == "state":
        head = f"{fields.pop('previous', None) or '-'} -> {fields.pop('state', '-')}"
    else:
        head = ""
    detail = " ".join(
        f"{k}={v if isinstance(v, (int, float, str)) else json.dumps(v, default=str)}"
        for k, v in fields.items()
        if v is not None
    )
    text = " ".join(part for part in (head, detail) if part)
    line = f"{when[5:10]} {when[11:23]}  {since:>8}  {event.get('type', '?'):<16} {text}"
    if not sys.stdout.isatty():
        return line  # a pipe or a file: one event a line
    import shutil
    import textwrap

    # a terminal: the fields wrap under their column (a URI, one word, stays whole)
    indent = " " * (len(line) - len(text))
    width = shutil.get_terminal_size().columns
    return "\n".join(
        textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False) or [line]
    )


@app.command()
@handle_errors
def attach(job: str = JobArg, output: str = OutputOpt) -> None:
    """Follow a job's logs to its end, like submit; if its controller is lost (killed, a
    closed laptop), take the job over: adopt its running nodes, or finish or relaunch it.
    A tuning job is followed trial by trial, and taken over the same way. `-o json`: the
    logs go to stderr, the ended job's record to stdout."""
    from contextlib import redirect_stdout

    from trainctl.controller.logs import LogPrinter
    from trainctl.controller.submit import print_summary
    from trainctl.controller.supervise import supervise
    from trainctl.estimator import TrainingJob
    from trainctl.record.jobstore import JobStore
    from trainctl.state import JobState
    from trainctl.store import default_store
    from trainctl.tuning.record import MAX_TUNING_NAME, TuningStore

    check_output(output)
    store = default_store()
    tuning = len(job) <= MAX_TUNING_NAME and not JobStore(store, job).exists()
    if tuning and TuningStore(store, job).exists():
        from trainctl.tuning import HyperparameterTuner

        with redirect_stdout(sys.stderr if output == "json" else sys.stdout):
            info = HyperparameterTuner.attach(job).wait()
        if output == "json":
            print_json(info)
        if info["state"] != "Completed":
            raise typer.Exit(EXIT_FAILED)
        return
    TrainingJob.attach(job)  # one line if there is no such job
    printer = LogPrinter(sys.stderr if output == "json" else sys.stdout)
    final = supervise(store, job, printer=printer)
    print_summary(printer, final)
    if output == "json":
        print_json(final.describe())
    if final.state is not JobState.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def stop(job: str = JobArg, output: str = OutputOpt) -> None:
    """Stop a running job; returns once its nodes have ended and its capacity is released."""
    from trainctl.estimator import TrainingJob

    check_output(output)
    info = TrainingJob.attach(job).stop(wait=True)
    if output == "json":
        print_json(info)
    else:
        sys.stdout.write(f"{job}: {info['state']}\n")


@app.command("rm")
@handle_errors
def rm(
    names: list[str] = typer.Argument(
        ...,
        help="Jobs to delete (TAB completes).",
        metavar="JOB...",
        autocompletion=complete_job_names,
    ),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    unreadable: bool = typer.Option(
        False,
        "--unreadable",
        help="Also delete named jobs whose record cannot be read (listed as Unreadable), "
        "unless a controller holds them.",
    ),
    output: str = OutputOpt,
) -> None:
    """Delete ended jobs: their store prefix (record, logs, metrics, and the outputs and
    checkpoints kept there) and node directories. A job that has not ended is refused and
    nothing is deleted."""
    from trainctl.controller.remove import removable_jobs, remove_jobs
    from trainctl.store import default_store

    check_output(output)
    store = default_store()
    removable_jobs(store, names, unreadable=unreadable)  # every refusal before the question
    _confirm(f"Delete {_some_jobs(names)}?", yes)
    _removed(remove_jobs(store, names, unreadable=unreadable), output)


def _removed(names: list[str], output: str) -> None:
    if output == "json":
        print_json({"removed": names})
        return
    for name in names:
        sys.stdout.write(f"removed {name}\n")


@app.command()
@handle_errors
def prune(
    older_than: str | None = typer.Option(
        None, "--older-than", help="Only jobs that ended longer ago than this: 30m, 12h, 7d."
    ),
    state: list[str] | None = typer.Option(
        None, "--state", help="Only jobs in this state (Completed, Failed, Stopped); repeatable."
    ),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    output: str = OutputOpt,
) -> None:
    """Delete every ended job (with --older-than, --state: those that match), as `rm` does;
    running jobs are never touched."""
    from trainctl.controller.remove import prune_candidates, remove_jobs
    from trainctl.spec.durations import parse_duration
    from trainctl.store import default_store

    check_output(output)
    store = default_store()
    seconds = parse_duration(older_than, "--older-than") if older_than is not None else None
    chosen = [r.name for r in prune_candidates(store, older_than=seconds, states=state)]
    if not chosen:
        if output == "json":
            print_json({"removed": []})
            return
        ended = len(prune_candidates(store))
        matching = " and ".join(
            part
            for part in (
                f"that ended more than {older_than} ago" if older_than else "",
                f"in state {' or '.join(state)}" if state else "",
            )
            if part
        )
        if matching:
            sys.stderr.write(
                f"No ended jobs {matching} in {store.uri} ({ended} ended job(s) in all).\n"
            )
        else:
            sys.stderr.write(f"No ended jobs to delete in {store.uri}.\n")
        return
    _confirm(f"Delete {_some_jobs(chosen)}?", yes)
    _removed(remove_jobs(store, chosen), output)


def _some_jobs(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} job(s): {shown}"


def _confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; elsewhere (a script, CI) only --yes deletes."""
    from trainctl.errors import SpecError

    if yes:
        return
    if not sys.stdin.isatty():
        raise SpecError("--yes", "not on a terminal: pass --yes to delete without asking")
    if not typer.confirm(question, default=False):
        raise typer.Exit(EXIT_FAILED)
