"""What a job could do: `diagnose` (bounded derived runs of it, and what bounds it) and
`estimate` (its spot strategies replayed against a market's trace)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainctl.cli.app import (
    JobArg,
    OutputOpt,
    app,
    check_output,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def diagnose(
    job: str = JobArg,
    steps: int = typer.Option(50, help="Steps measured in each run, after the warm-up."),
    warmup: int = typer.Option(5, help="Steps run before measuring."),
    nodes: int | None = typer.Option(None, help="Nodes to diagnose (default: the job's)."),
    interruptions_per_hour: float | None = typer.Option(
        None,
        help="Interruptions per instance-hour for the checkpoint interval "
        "(default: the job's history, else an assumed rate for its market).",
    ),
    max_seconds: int = typer.Option(600, help="Longest any one run may take."),
    repeats: int = typer.Option(
        3, help="Runs of each configuration (interleaved), to tell a difference from noise."
    ),
    keep: bool = typer.Option(
        False, help="Keep the measurement runs (`trainctl jobs --all` lists them)."
    ),
    output: str = OutputOpt,
) -> None:
    """Find what bounds a job's throughput: runs its script briefly on N nodes, with
    synthetic data and on 1 node, each several times, printing a line per run as it ends,
    and says what to change (or that the differences are within the machine's noise)."""
    from trainctl.diagnose import diagnose as run_diagnosis
    from trainctl.progress import status as progress_status

    check_output(output)

    def say(text: str) -> None:
        # (sys.stdout looked up now: under the spinner rich has redirected it above the line)
        lines = sys.stderr if output == "json" else sys.stdout
        lines.write(text + "\n")
        lines.flush()

    def ended(run: Any) -> None:
        say(f"  {run.line()}")

    def header(nodes: int) -> None:
        say(
            f"diagnosing {job} on {nodes} node(s): each run {warmup} warm-up + {steps} "
            f"measured steps, at most {max_seconds} s; {repeats} run(s) of each "
            "configuration; a line as each ends"
        )

    with progress_status(f"diagnosing {job}") as running:
        result = run_diagnosis(
            job,
            steps=steps,
            warmup=warmup,
            nodes=nodes,
            interruptions_per_hour=interruptions_per_hour,
            max_seconds=max_seconds,
            repeats=repeats,
            keep=keep,
            on_start=header,
            on_run=lambda label, name: running(f"{label} ({name})"),
            on_result=ended,
        )
    if output == "json":
        print_json(result.model_dump())
        return
    sys.stdout.write("\n" + result.render(runs=False) + "\n")


@app.command()
@handle_errors
def estimate(
    job: str = JobArg,
    trace: str = typer.Option(
        ...,
        help="A spot trace: the name of one shipped with trainctl (aws-p3-16node-2023-08, "
        "aws-p3-4node-preemption-2023-08, aws-p3-1node-2023-02, synthetic-rare, "
        "synthetic-frequent) or a trace file (.json).",
    ),
    hours: float | None = typer.Option(
        None, help="Hours of training on demand at full size (default: the job's, once done)."
    ),
    nodes: int | None = typer.Option(None, help="Nodes (default: the job's)."),
    instance_type: str | None = typer.Option(None, help="EC2 type (default: the job's)."),
    starts: int = typer.Option(3, help="Points of the trace to start the job from."),
    save_seconds: float = typer.Option(
        5.0, help="Seconds a checkpoint holds training (trainctl diagnose measures it)."
    ),
    workers: int | None = typer.Option(
        None, help="Replays run side by side, each in a process (default: four per CPU)."
    ),
    output: str = OutputOpt,
) -> None:
    """What a job would take and cost on spot: its measured speed replayed through the
    controller against a spot trace, for each strategy (on-demand; spot; spot + elastic;
    spot + on-demand fallback at the deadline; both; Uniform Progress, the job's work
    known), against on-demand."""
    import contextlib
    import shutil

    from trainctl.progress import progress_task
    from trainctl.replay.estimate import estimate as run_estimate

    check_output(output)
    # a terminal's width (a pipe or a file: the table whole, a strategy a line)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    with contextlib.ExitStack() as stack:
        advance: list[Any] = []

        def started(head: Any, replays: int) -> None:
            # what is known before any replay, at once; then a bar over the replays
            if output != "json":
                sys.stdout.write(head.render(width, body=False) + "\n")
                sys.stdout.flush()
            task = progress_task(f"{replays} replays", total=replays, bytes_=False)
            advance.append(stack.enter_context(task))

        result = run_estimate(
            job,
            trace,
            hours=hours,
            nodes=nodes,
            instance_type=instance_type,
            starts=starts,
            save_seconds=save_seconds,
            workers=workers,
            on_replay=lambda _: advance[0](1) if advance else None,
            on_start=started,
        )
    if output == "json":
        print_json(result.model_dump())
        return
    sys.stdout.write(result.render(width, head=False) + "\n")
