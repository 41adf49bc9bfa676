"""Jobs after submit: `jobs`, `status`, `logs`, `stop`, `artifacts`, and `ls` of a store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from trainctl.cli.app import (
    EXIT_FAILED,
    OutputOpt,
    app,
    check_output,
    err,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def jobs(output: str = OutputOpt) -> None:
    """List jobs, newest first."""
    from rich.console import Console
    from rich.table import Table

    from trainctl.controller.submit import default_store
    from trainctl.controller.supervise import controller_view
    from trainctl.record import JobStore, scan_jobs

    check_output(output)
    store = default_store()
    records, unreadable = scan_jobs(store)
    views = {r.name: controller_view(JobStore(store, r.name), r) for r in records}
    if output == "json":
        print_json(
            [{**r.describe(), "controller": views[r.name]} for r in records]
            + [u.describe() for u in unreadable]
        )
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "STATE", "INSTANCES", "CREATED", "DURATION", "ATTEMPTS"):
        table.add_column(col, no_wrap=True)
    for r in records:
        table.add_row(
            r.name,
            _state_text(r.state.value, views[r.name]),
            f"{r.spec.instance_count} x {r.spec.instance_type}",
            r.created_at.replace("T", " ")[:19],
            _duration(r.duration_s),
            str(len(r.attempts)),
        )
    for u in unreadable:  # listed, not skipped: `status NAME` says what is wrong
        table.add_row(u.name, _state_text("Unreadable"), "-", "-", "-", "-")
    Console().print(table)


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
def status(job: str = typer.Argument(..., help="Job name."), output: str = OutputOpt) -> None:
    """Show a job's state, attempts, failure reason and model."""
    from rich.console import Console
    from rich.table import Table

    from trainctl.controller.submit import default_store
    from trainctl.controller.supervise import controller_view
    from trainctl.record import JobStore

    check_output(output)
    jobs = JobStore(default_store(), job)
    record = jobs.load()
    controller = controller_view(jobs, record)
    info = {**record.describe(), "controller": controller}
    if output == "json":
        print_json(info)
        return
    console = Console(highlight=False)
    table = Table(box=None, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
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
    if record.stop_reason:
        rows.append(("stopped", record.stop_reason))
    if record.failure_reason:
        rows.append(("failure", record.failure_reason))
    if (cost := info["cost"]) is not None:
        rows.append(("cost", _cost_text(cost)))
    if record.attempts:
        rows.append(("started from", record.attempts[-1].started_from()))
    if record.attempts and (startup := record.attempts[-1].startup):
        rows.append(("start-up", " · ".join(f"{k} {v:.1f} s" for k, v in startup.items())))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if record.failure_detail:
        console.print(record.failure_detail, markup=False)
    if record.attempts:
        attempts = Table(title="attempts", title_justify="left", box=None, header_style="bold")
        for col in ("#", "NODES", "STARTED", "ENDED", "OUTCOME"):
            attempts.add_column(col, no_wrap=True)
        # where it started ('step 120', 'snapshot.pt +1', 'scratch'; in full above)
        attempts.add_column("FROM", no_wrap=True, overflow="ellipsis", max_width=16)
        for col in ("STEP", "LOST"):
            attempts.add_column(col, no_wrap=True)
        attempts.add_column("CAUSE", overflow="fold")

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
                cause,
            )
        console.print(attempts)


def _cost_text(cost: dict[str, Any]) -> str:
    hours = cost["instance_seconds"] / 3600
    if cost["usd"] is None:
        return f"{hours:.2f} instance-hours (no price known)"
    text = f"${cost['usd']:.2f} for {hours:.2f} instance-hours"
    if cost.get("warm_seconds"):
        text += f" ({cost['warm_seconds'] / 3600:.2f} of them kept warm after the job)"
    if cost["spot_savings_usd"]:
        text += f"; spot saved ${cost['spot_savings_usd']:.2f} of ${cost['on_demand_usd']:.2f}"
    if cost["unpriced_instances"]:
        text += f" ({cost['unpriced_instances']} instance(s) without a price not counted)"
    return text


@app.command()
@handle_errors
def logs(
    job: str = typer.Argument(..., help="Job name."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends."),
) -> None:
    """Print every node's log (all attempts) from the store; -f follows until the job ends
    (or its controller is lost: `trainctl attach` then takes it over)."""
    from trainctl.estimator import TrainingJob

    handle = TrainingJob.attach(job)
    handle.logs(follow=follow)
    if follow and (controller := handle.describe()["controller"]) and controller["lost"]:
        err(
            f"job {job}'s controller is lost ({controller['silent_seconds']:.0f} s silent); "
            f"`trainctl attach {job}` takes it over"
        )
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def attach(job: str = typer.Argument(..., help="Job name.")) -> None:
    """Follow a job's logs to its end, like submit; if its controller is lost (killed, a
    closed laptop), take the job over: adopt its running nodes, or finish or relaunch it."""
    from trainctl.controller.logs import LogPrinter
    from trainctl.controller.submit import default_store
    from trainctl.controller.supervise import supervise
    from trainctl.estimator import TrainingJob, _print_summary
    from trainctl.state import JobState

    store = default_store()
    TrainingJob.attach(job)  # one line if there is no such job
    printer = LogPrinter(sys.stdout)
    final = supervise(store, job, printer=printer)
    _print_summary(printer, final)
    if final.state is not JobState.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def stop(job: str = typer.Argument(..., help="Job name.")) -> None:
    """Stop a running job: every node's processes are ended."""
    from trainctl.estimator import TrainingJob

    info = TrainingJob.attach(job).stop(wait=True)
    sys.stdout.write(f"{job}: {info['state']}\n")


@app.command()
@handle_errors
def diagnose(
    job: str = typer.Argument(..., help="Job name."),
    steps: int = typer.Option(50, help="Steps measured in each run, after the warm-up."),
    warmup: int = typer.Option(5, help="Steps run before measuring."),
    nodes: int | None = typer.Option(None, help="Nodes to diagnose (default: the job's)."),
    interruptions_per_hour: float | None = typer.Option(
        None,
        help="Interruptions per instance-hour for the checkpoint interval "
        "(default: the job's history, else an assumed rate for its market).",
    ),
    max_seconds: int = typer.Option(600, help="Longest any one run may take."),
    output: str = OutputOpt,
) -> None:
    """Find what bounds a job's throughput: runs its script briefly on N nodes, with
    synthetic data and on 1 node, and says what to change."""
    from trainctl.diagnose import diagnose as run_diagnosis
    from trainctl.progress import status as progress_status

    check_output(output)
    with progress_status(f"diagnosing {job}") as say:
        result = run_diagnosis(
            job,
            steps=steps,
            warmup=warmup,
            nodes=nodes,
            interruptions_per_hour=interruptions_per_hour,
            max_seconds=max_seconds,
            on_run=lambda label, name: say(f"{label} ({name})"),
        )
    if output == "json":
        print_json(result.model_dump())
        return
    sys.stdout.write(result.render() + "\n")


@app.command()
@handle_errors
def artifacts(
    job: str = typer.Argument(..., help="Job name."),
    action: str | None = typer.Argument(None, help="'get' to download one file."),
    path: str | None = typer.Argument(None, help="With get: the file, relative to the job."),
    dest: str | None = typer.Argument(None, help="With get: where to save it."),
    output: str = OutputOpt,
) -> None:
    """Browse a job's files in the store (model, outputs, logs, checkpoints); `get` one."""
    from trainctl.controller.artifacts import download_artifact, job_artifacts
    from trainctl.controller.submit import default_store
    from trainctl.errors import SpecError

    check_output(output)
    store = default_store()
    if action is None:
        groups = job_artifacts(store, job)
        if output == "json":
            print_json(
                [
                    {"root": root, "files": [{"path": i.key, "size": i.size} for i in infos]}
                    for root, infos in groups
                ]
            )
            return
        _print_tree(groups)
        return
    if action != "get":
        raise SpecError("action", f"unknown {action!r}; allowed: get")
    if not path:
        raise SpecError("PATH", "give the file to download, e.g. output/model.tar.gz")
    saved = download_artifact(store, job, path, Path(dest) if dest else None)
    sys.stdout.write(f"{saved}\n")


def _print_tree(groups: list[tuple[str, list[Any]]]) -> None:
    from rich.console import Console
    from rich.tree import Tree

    console = Console(highlight=False)
    for root, infos in groups:
        tree = Tree(f"[bold]{root}[/]")
        branches: dict[str, Tree] = {"": tree}
        for info in infos:
            parts = info.key.split("/")
            for depth in range(1, len(parts)):
                prefix = "/".join(parts[:depth])
                if prefix not in branches:
                    branches[prefix] = branches["/".join(parts[: depth - 1])].add(
                        f"[bold blue]{parts[depth - 1]}/[/]"
                    )
            branches["/".join(parts[:-1])].add(f"{parts[-1]}  [dim]{_size(info.size)}[/]")
        console.print(tree)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@app.command("ls")
@handle_errors
def ls_(
    uri: str = typer.Argument(..., help="file:// or s3:// URI."), output: str = OutputOpt
) -> None:
    """List the objects under a store URI with sizes."""
    from datetime import datetime

    from trainctl.store import open_store

    check_output(output)
    store = open_store(uri, field="URI")
    infos = list(store.list(""))
    if output == "json":
        print_json([{"key": i.key, "size": i.size, "mtime": i.mtime} for i in infos])
        return
    for info in infos:
        stamp = datetime.fromtimestamp(info.mtime).strftime("%Y-%m-%d %H:%M:%S")
        sys.stdout.write(f"{stamp}  {info.size:>12}  {store.url(info.key)}\n")
