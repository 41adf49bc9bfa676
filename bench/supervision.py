"""What supervising a job costs: one controller service (`python -m trainctl.controller
serve`, the process a remote controller runs) supervising K jobs of 2 nodes each, K = 1, 10,
50; its resident memory and CPU per job at steady state.

The nodes are real node agents of the local provider running a script that prints a
training-like line every second and does no work (the "simulated" part: no model, no
torch), so the service does exactly what it does for real jobs: takes and renews each job's
lease, follows every node's output, saves progress, checks for stop requests. The store is
file:// (an S3 store adds its client's memory once, not per job).

Measured from /proc of the service process only: RSS (VmRSS) once every job is Training,
and CPU (utime + stime) over a window of steady state. The baseline is the same service
supervising nothing (K = 0), measured in the same run; per-job figures are
(K-job value - baseline) / K. Reported next to SkyPilot's published figure for its managed
jobs controller: about 1 GB of memory per job's launch process (a controller VM of 8 vCPUs
is its default).

    python -m bench.supervision [--ks 1,10,50] [--window 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PYTHON, Procs, log, temp_dir

SKYPILOT_MB_PER_JOB = 1024.0  # SkyPilot docs: ~1 GB of memory per managed job's process
GOAL_MB_PER_JOB = 30.0
GOAL_CORE_PERCENT_PER_JOB = 1.0
SERVICE_ID = "bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

SCRIPT = """\
import itertools, sys, time
for step in itertools.count():
    print(f"step {step} loss={1.0 / (step + 1):.4f}", flush=True)
    time.sleep(1.0)
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def measure_k(k: int, workdir: Path, procs: Procs, window: float) -> dict[str, Any]:
    """Start a service, give it `k` jobs, wait until all train, then measure it."""
    from trainctl.controller.service import assign
    from trainctl.controller.submit import create_job, stop_job
    from trainctl.record.jobstore import JobStore
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    store = open_store(f"file://{workdir / f'store-{k}'}")
    source = workdir / "source"
    source.mkdir(exist_ok=True)
    (source / "ticker.py").write_text(SCRIPT)
    service = procs.spawn(
        [PYTHON, "-m", "trainctl.controller", "serve", "--store", store.uri, "--id", SERVICE_ID],
        stdout=open(workdir / f"service-{k}.log", "wb"),  # noqa: SIM115  (the child owns it)
        stderr=subprocess.STDOUT,
    )
    names = []
    try:
        for i in range(k):
            spec = build_spec(
                entry_point="ticker.py",
                source_dir=str(source),
                instance_count=2,
                job_name=f"sup-{k}-{i}",
                max_run=3600,
            )
            names.append(create_job(spec, store).name)
            assign(store, SERVICE_ID, names[-1])
        deadline = time.monotonic() + 120 + 6 * k
        while True:
            states = [JobStore(store, n).load().state.value for n in names]
            if all(s == "Training" for s in states):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"K={k}: jobs not all Training: {states}")
            if service.poll() is not None:
                raise RuntimeError(f"K={k}: the service exited ({service.returncode})")
            time.sleep(1.0)
        time.sleep(min(10.0, window / 3))  # past start-up allocations
        cpu0, t0 = cpu_seconds(service.pid), time.monotonic()
        rss_samples = []
        while time.monotonic() - t0 < window:
            time.sleep(1.0)
            rss_samples.append(rss_mb(service.pid))
        cpu = cpu_seconds(service.pid) - cpu0
        wall = time.monotonic() - t0
        result = {
            "k": k,
            "rss_mb": max(rss_samples),
            "core_percent": 100.0 * cpu / wall,
            "threads": threads(service.pid),
            "window_s": round(wall, 1),
        }
    finally:
        for name in names:
            try:
                stop_job(store, name, wait=False)
            except Exception as exc:
                log(f"stop {name}: {exc}")
        deadline = time.monotonic() + 60 + k
        while names and time.monotonic() < deadline:
            if all(JobStore(store, n).load().state.is_terminal() for n in names):
                break
            time.sleep(1.0)
        procs.end(service, grace=5.0)
    log(
        f"K={k}: RSS {result['rss_mb']:.1f} MB, {result['core_percent']:.2f} % of a core, "
        f"{result['threads']} threads"
    )
    return result


def measure(ks: list[int], window: float) -> dict[str, Any]:
    workdir = temp_dir("trainctl-bench-supervision-")
    procs = Procs()
    os.environ["TRAINCTL_HOME"] = str(workdir / "home")
    os.environ.pop("TRAINCTL_STORE", None)
    try:
        base = measure_k(0, workdir, procs, window)
        runs = [measure_k(k, workdir, procs, window) for k in ks]
    finally:
        left = procs.cleanup()
        if left:
            log(f"ended {len(left)} leftover process(es)")
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for run in runs:
        k = run["k"]
        mb = (run["rss_mb"] - base["rss_mb"]) / k
        core = (run["core_percent"] - base["core_percent"]) / k
        rows.append(
            {
                **run,
                "mb_per_job": round(mb, 2),
                "total_mb_per_job": round(run["rss_mb"] / k, 2),
                "core_percent_per_job": round(core, 3),
                "vs_skypilot_memory": round(mb / SKYPILOT_MB_PER_JOB, 4),
                "pass": mb < GOAL_MB_PER_JOB and core < GOAL_CORE_PERCENT_PER_JOB,
            }
        )
    return {"baseline": base, "runs": rows, "skypilot_mb_per_job": SKYPILOT_MB_PER_JOB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.supervision")
    parser.add_argument("--ks", default="1,10,50")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = measure([int(k) for k in args.ks.split(",")], args.window)
    base = result["baseline"]
    print(
        f"service supervising nothing (baseline): RSS {base['rss_mb']:.1f} MB, "
        f"{base['core_percent']:.2f} % of a core"
    )
    print(
        f"{'K':>4} {'RSS MB':>8} {'MB/job':>8} {'%core/job':>10} {'threads':>8} "
        f"{'vs SkyPilot mem':>16} goal"
    )
    for r in result["runs"]:
        print(
            f"{r['k']:>4} {r['rss_mb']:>8.1f} {r['mb_per_job']:>8.2f} "
            f"{r['core_percent_per_job']:>10.3f} {r['threads']:>8} "
            f"{r['vs_skypilot_memory']:>15.4f}x {'pass' if r['pass'] else 'MISSED'}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["pass"] for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
