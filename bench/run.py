"""`make bench`: every figure of the performance table, each against a baseline measured in
the same run on the same machine; writes bench/results.json and prints the table.

    python -m bench.run                  # all figures: 3 repetitions (launch 5, throughput
                                         # 4, stall 7); ~25 min on 2 busy cores (2026-12-06)
    python -m bench.run --quick          # fewer repetitions, shorter runs
    python -m bench.run --only upload    # one figure (repeatable)
    python -m bench.run --markdown       # print bench/results.json as a Markdown table

Exits 1 naming the figures whose goal was missed (2 if a figure could not be measured). A
figure whose real part is missing here (sshd for the cold start) is skipped, naming the part,
and the run goes on; under CI (CI=true) a missing part is an error, as in the tests.
Benchmarks are not tests: `make test` runs none of this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import coldstart, launch, recovery, scale, stall, throughput, upload
from bench.common import BENCH_DIR, WORKLOAD_ARGS, Procs, TrainctlRunner, log, machine_info
from bench.common import temp_dir as make_temp_dir

FIGURES = {
    "launch": launch.measure,
    "throughput": throughput.measure,
    "throughput-load": throughput.measure_under_load,
    "stall": stall.measure,
    "upload": upload.measure,
    "recovery": recovery.measure,
    "scale": scale.figures,
    "coldstart": coldstart.figures,
}


@dataclass
class Context:
    procs: Procs
    runner: TrainctlRunner
    workdir: Path
    reps: int
    quick: bool
    upload_inner: list[float] = field(default_factory=list)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _cell(s: dict[str, Any] | None, unit: str) -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{_num(s['median'])} {unit} [{_num(s['min'])}-{_num(s['max'])}]"


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for f in results["figures"]:
        if f.get("error"):
            out.append([f["name"], "-", "-", "-", f.get("goal", "-"), "ERROR"])
            continue
        if f.get("skipped"):
            out.append([f["name"], "-", "-", f["skipped"], f.get("goal", "-"), "skipped"])
            continue
        if f["ratio"] is not None:
            lo, hi = f["ratio_spread"] or (None, None)
            ratio = f"{f['ratio']:.2f}x [{_num(lo)}-{_num(hi)}]"
        elif f.get("ratio_text"):
            ratio = f["ratio_text"]
        else:
            ratio = "steps lost: " + ", ".join(str(n) for n in f.get("steps_lost", []))
        out.append(
            [
                f["title"],
                _cell(f["baseline"], f["unit"]),
                _cell(f["trainctl"], f["unit"]),
                ratio,
                f["goal"],
                "pass" if f["pass"] else "MISSED",
            ]
        )
    return out


HEADER = ["figure", "baseline: median [min-max]", "trainctl: median [min-max]", "ratio", "goal"]


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = results["machine"]
    table = Table(
        title=f"trainctl bench - {m['cores']} cores, torch {m['torch']}, {m['date']}",
        caption="ratio = median(trainctl) / median(baseline); \\[spread] = min-max "
        f"(ratio: of paired repetitions); {results['reps']} repetitions",
    )
    for name in [*HEADER, "result"]:
        table.add_column(name, overflow="fold")
    for row in rows(results):
        style = {"pass": "green", "skipped": "yellow"}.get(row[-1], "bold red")
        table.add_row(*row[:-1], f"[{style}]{row[-1]}[/{style}]")
    Console(width=max(140, shutil.get_terminal_size((140, 20)).columns)).print(table)
    for f in results["figures"]:
        base = f.get("baseline_name")
        if base:
            print(f"  {f['name']}: baseline = {base}")


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| " + " | ".join([*HEADER, "result"]) + " |",
        "|" + "---|" * (len(HEADER) + 1),
    ]
    for row in rows(results):
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def measure_figure(name: str, ctx: Context) -> list[dict[str, Any]]:
    """The figure's rows; one "skipped" row naming the part when a rig it needs is missing
    here (the test rigs' require_part skips as pytest does, a BaseException: a figure must
    not end the run with a traceback for it); one "error" row when it failed."""
    import pytest

    try:
        return FIGURES[name](ctx)
    except KeyboardInterrupt:
        raise
    except pytest.skip.Exception as exc:
        log(f"skipped {name}: {exc.msg}")
        return [{"name": name, "skipped": exc.msg, "pass": None}]
    except (Exception, pytest.fail.Exception) as exc:
        traceback.print_exc()
        why = exc.msg if isinstance(exc, pytest.fail.Exception) else f"{type(exc).__name__}: {exc}"
        return [{"name": name, "error": why, "pass": False}]


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench")
    p.add_argument("--only", action="append", choices=sorted(FIGURES), help="repeatable")
    p.add_argument("--quick", action="store_true", help="2 repetitions, shorter runs")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    p.add_argument("--out", default=str(BENCH_DIR / "results.json"))
    p.add_argument("--markdown", action="store_true", help="print --out as Markdown, run nothing")
    args = p.parse_args(argv)

    if args.markdown:
        print(markdown(json.loads(Path(args.out).read_text())))
        return 0

    signal.signal(signal.SIGTERM, _sigterm)
    reps = args.reps or (2 if args.quick else 3)
    names = args.only or list(FIGURES)
    started = time.monotonic()
    workdir = make_temp_dir("trainctl-bench-")
    procs = Procs()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "load_at_start": os.getloadavg(),
        "reps": reps,
        "quick": args.quick,
        "workload": WORKLOAD_ARGS,
        "figures": [],
    }
    try:
        ctx = Context(procs, TrainctlRunner(workdir / "home"), workdir, reps, args.quick)
        for name in names:
            log(f"--- {name}")
            t = time.monotonic()
            figures = measure_figure(name, ctx)
            for f in figures:
                f["seconds"] = round(time.monotonic() - t, 1)
            results["figures"] += figures
            # Written after each figure: a run cut short keeps the figures it finished.
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        leftovers = procs.cleanup()
        if leftovers:
            log(f"ended {len(leftovers)} leftover process(es): {leftovers}")
        shutil.rmtree(workdir, ignore_errors=True)
    results["duration_s"] = round(time.monotonic() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"results: {args.out} ({results['duration_s']:.0f} s)")
    errors = [f["name"] for f in results["figures"] if f.get("error")]
    missed = [
        f["name"]
        for f in results["figures"]
        if not f.get("error") and not f.get("skipped") and not f["pass"]
    ]
    for f in results["figures"]:
        if f.get("error"):
            print(f"ERROR {f['name']}: {f['error']}", file=sys.stderr)
        elif f.get("skipped"):
            print(f"SKIPPED {f['name']}: {f['skipped']}", file=sys.stderr)
        elif not f["pass"]:
            print(f"MISSED {f['name']}: goal {f['goal']}", file=sys.stderr)
    if errors:
        return 2
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
