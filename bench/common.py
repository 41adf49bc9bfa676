"""Shared pieces of the benchmarks: processes, workload runs, statistics.

Every process a benchmark starts carries BENCH_RUN_ID in its environment (children inherit
it, including trainctl's controllers, agents and torchrun workers), so `Procs.cleanup()` finds
and ends whatever is left, by pid, without touching anyone else's processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
WORKLOAD = BENCH_DIR / "workload.py"
PYTHON = sys.executable
RUN_TAG = "BENCH_RUN_ID"
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

# The workload every distributed figure runs (2 nodes x 1 worker, torch.set_num_threads(1)):
# an MLP of ~5.5 M parameters with Adam, so one step takes tens of ms (~80 ms on a quiet
# 2-core VM, gradient all-reduce over gloo included) and a checkpoint (model + Adam moments)
# is ~66 MB.
CPU_WORKLOAD_ARGS: dict[str, Any] = {
    "in-features": 512,
    "hidden": 1536,
    "layers": 2,
    "batch-size": 32,
    "optimizer": "adam",
}
# On a GPU: an MLP of ~302 M parameters (8192 wide) and 512 samples a step, its data made on
# the device, so a step keeps an H100 busy (~0.9 TFLOP per worker per step) and the figure
# measures training, not the input pipeline; TF32 matmuls, as GPU training uses.
GPU_WORKLOAD_ARGS: dict[str, Any] = {
    "in-features": 4096,
    "hidden": 8192,
    "layers": 4,
    "batch-size": 512,
    "samples": 65536,
    "optimizer": "adam",
    "data-on-device": 1,
}


@dataclass(frozen=True)
class Topology:
    """How the figures' jobs are laid out on this machine: on the CPU 2 local nodes x 1
    worker; with GPUs, 2 local nodes splitting them when each gets at least 2 (NCCL inside a
    node and between nodes), else 1 node with a worker per GPU. The bare torchrun baseline
    runs the same layout, each node given the same GPUs trainctl gives it."""

    nodes: int
    workers_per_node: int
    gpus: int
    device: str  # "cpu", or the GPU's name

    @property
    def gpu_ids(self) -> list[list[str]]:
        """Each node's CUDA_VISIBLE_DEVICES (as trainctl's local provider shares them)."""
        per = self.gpus // self.nodes
        return [[str(i) for i in range(r * per, (r + 1) * per)] for r in range(self.nodes)]


def topology() -> Topology:
    """This machine's layout, found as trainctl finds GPUs (no torch import)."""
    from trainctl.gpus import gpu_states, visible_gpus

    gpus = len(visible_gpus())
    if gpus == 0:
        return Topology(nodes=2, workers_per_node=1, gpus=0, device="cpu")
    states = gpu_states() or []
    name = f"{gpus} x {states[0].name}" if states else f"{gpus} GPU(s)"
    if gpus >= 4 and gpus % 2 == 0:
        return Topology(nodes=2, workers_per_node=gpus // 2, gpus=gpus, device=name)
    return Topology(nodes=1, workers_per_node=gpus, gpus=gpus, device=name)


TOPOLOGY = topology()

# Dense TF32 tensor-core peak per GPU, TFLOP/s (NVIDIA's data sheets; SXM parts), for the
# throughput row's utilisation: model TFLOP/s per GPU over this. Unknown GPUs: no figure.
TF32_PEAK_TFLOPS = {"H100": 494.7, "H200": 494.7, "A100": 156.0, "L4": 60.0, "A10G": 35.0}


def tf32_peak(device: str) -> float | None:
    """The TF32 peak of one GPU named in `device` (e.g. "1 x NVIDIA H100 80GB HBM3")."""
    return next((peak for name, peak in TF32_PEAK_TFLOPS.items() if name in device), None)


WORKLOAD_ARGS = GPU_WORKLOAD_ARGS if TOPOLOGY.gpus else CPU_WORKLOAD_ARGS


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hp_args(hps: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in hps.items():
        out += [f"--{key}", str(value)]
    return out


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- processes


def _tagged_pids(run_id: str) -> list[int]:
    me = os.getpid()
    needle = f"{RUN_TAG}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            raw = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in raw.split(b"\0") and stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


class Procs:
    """Starts tagged processes (each in a session of its own) and ends them all at the end."""

    def __init__(self) -> None:
        self.run_id = f"{os.getpid()}-{time.time_ns()}"
        os.environ[RUN_TAG] = self.run_id  # inherited by everything started from here on
        self.started: list[subprocess.Popen] = []

    def spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def end(self, proc: subprocess.Popen, grace: float = 3.0) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(5)

    def leftovers(self) -> list[int]:
        return _tagged_pids(self.run_id)

    def cleanup(self) -> list[int]:
        """End every process this run started (and their descendants); returns the pids."""
        for proc in self.started:
            self.end(proc, grace=2.0)
        ended = []
        for _ in range(3):
            pids = self.leftovers()
            if not pids:
                break
            for pid in pids:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    log(f"leftover process {pid}: {cmd.decode(errors='replace')[:200]}")
                except OSError:
                    pass
                try:
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        return ended


# ----------------------------------------------------------------------------- BENCH lines


def bench_lines(text: str) -> list[dict[str, Any]]:
    """The workload's `BENCH {json}` lines in a log: prefixes such as '[rank0]:' and the
    store log's timestamp ('2026-11-27T09:09:19.980Z ') allowed."""
    out = []
    for line in text.splitlines():
        at = line.find("BENCH {")
        if 0 <= at <= 48:
            try:
                out.append(json.loads(line[at + 6 :]))
            except ValueError:
                continue
    return out


def first(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in events if e.get("event") == kind), None)


def every(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == kind]


# ----------------------------------------------------------------------------- statistics


def summary(values: list[float]) -> dict[str, Any]:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"values": [], "median": None, "min": None, "max": None}
    return {
        "values": [round(v, 4) for v in vals],
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
    }


def ratio_figure(
    name: str,
    title: str,
    unit: str,
    baseline_name: str,
    base: list[float],
    tc: list[float],
    *,
    goal_text: str,
    goal_max: float | None = None,
    goal_min: float | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A figure whose result is median(trainctl) / median(baseline), with paired spreads."""
    b, t = summary(base), summary(tc)
    ratio = None
    if b["median"] and t["median"] is not None:
        ratio = t["median"] / b["median"]
    pairs = [x / y for x, y in zip(tc, base, strict=False) if y]
    ok = ratio is not None
    if ok and goal_max is not None:
        ok = ratio <= goal_max
    if ok and goal_min is not None:
        ok = ratio >= goal_min
    return {
        "name": name,
        "title": title,
        "unit": unit,
        "baseline_name": baseline_name,
        "baseline": b,
        "trainctl": t,
        "ratio": ratio,
        "ratio_spread": [min(pairs), max(pairs)] if pairs else None,
        "goal": goal_text,
        "pass": bool(ok),
        "detail": detail or {},
    }


# ----------------------------------------------------------------------------- runs


@dataclass
class NodeRun:
    """One run of the workload on 2 nodes: rank 0's BENCH events and when it started."""

    t0: float
    events: list[dict[str, Any]]
    ok: bool
    info: dict[str, Any] = field(default_factory=dict)

    def first_step_latency(self) -> float | None:
        ev = first(self.events, "first_step")
        return ev["t"] - self.t0 if ev else None

    def steps_per_s(self) -> float | None:
        ev = first(self.events, "done")
        return ev.get("steps_per_s") if ev else None

    def done(self, key: str) -> float | None:
        """A figure of the workload's `done` line (samples_per_s, model_tflops)."""
        ev = first(self.events, "done")
        return ev.get(key) if ev else None

    def stalls(self) -> list[float]:
        return [e["stall"] for e in every(self.events, "ckpt")]


def run_torchrun(
    procs: Procs,
    workdir: Path,
    hps: dict[str, Any],
    timeout: float = 300.0,
    *,
    wait_for_master: bool = False,
) -> NodeRun:
    """The baseline: a `torchrun` per node of TOPOLOGY started by hand, one per node dir
    (the master first). `wait_for_master`: node 1 runs torchrun through
    bench/torchrun_wait.py, which avoids torchrun's rendezvous race (see there)."""
    port = free_port()
    env = {**os.environ, **LOOPBACK_ENV, "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in env.items() if not k.startswith(("SM_", "TRAINCTL_JOB"))}
    outs, running = [], []
    t0 = time.time()
    nodes = TOPOLOGY.nodes
    for rank in range(nodes):
        node_env = dict(env)
        if TOPOLOGY.gpus:
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(TOPOLOGY.gpu_ids[rank])
        node = workdir / f"node-{rank}"
        node.mkdir(parents=True, exist_ok=True)
        out = open(node / "out.log", "wb")  # noqa: SIM115 (closed below)
        outs.append(out)
        launcher = ["-m", "torch.distributed.run"]
        if wait_for_master and rank > 0:
            launcher = [str(BENCH_DIR / "torchrun_wait.py")]
        argv = [
            PYTHON,
            *launcher,
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(rank),
            "--nproc-per-node",
            str(TOPOLOGY.workers_per_node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--max-restarts",
            "0",
            "--log-dir",  # not a torchelastic_* directory left in /tmp per run
            str(node / "torchelastic"),
            str(WORKLOAD),
            *hp_args(hps),
        ]
        running.append(
            procs.spawn(argv, cwd=node, env=node_env, stdout=out, stderr=subprocess.STDOUT)
        )
    ok = True
    deadline = time.monotonic() + timeout
    try:
        for proc in running:
            left = max(1.0, deadline - time.monotonic())
            try:
                ok = proc.wait(left) == 0 and ok
            except subprocess.TimeoutExpired:
                ok = False
    finally:
        for proc in running:
            procs.end(proc)
        for out in outs:
            out.close()
    text = (workdir / "node-0" / "out.log").read_text(errors="replace")
    if not ok:
        log(f"baseline torchrun run failed; tail of node-0:\n{text[-2000:]}")
    return NodeRun(t0=t0, events=bench_lines(text), ok=ok)


class TrainctlRunner:
    """Runs the workload as trainctl jobs (Estimator, local provider, 2 nodes, torchrun)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        os.environ["TRAINCTL_HOME"] = str(home)
        for key in ("TRAINCTL_STORE", "TRAINCTL_CONFIG"):
            os.environ.pop(key, None)
        self.source = home / "source"
        self.source.mkdir(parents=True, exist_ok=True)
        shutil.copy2(WORKLOAD, self.source / "workload.py")
        # Imported before any clock starts: a user's process has trainctl loaded already.
        import trainctl.controller.submit  # noqa: F401
        from trainctl import Estimator  # noqa: F401

    def run(
        self,
        hps: dict[str, Any],
        *,
        faults: list[str] | None = None,
        timeout: float = 300.0,
        keep: bool = False,
        stop_when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> tuple[NodeRun, dict[str, Any], dict[int, list[dict[str, Any]]]]:
        """(rank 0's run of attempt 1, describe(), {attempt: rank 0's events}).

        `stop_when(describe())`: stop the job as soon as it says so (checked every 0.5 s);
        such a job counts as ok when it ends Stopped."""
        from trainctl import Estimator
        from trainctl.record.jobstore import JobStore

        t0 = time.time()
        est = Estimator(
            entry_point="workload.py",
            source_dir=str(self.source),
            instance_type="local",
            instance_count=TOPOLOGY.nodes,  # a worker per GPU: the default
            hyperparameters=hps,
            distribution={"torch_distributed": {"enabled": True}},
            faults=faults,
            base_job_name="bench",
        )
        job = est.fit(wait=False)
        stopped = False
        try:
            if stop_when is not None:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    desc = job.describe()
                    if desc["state"] in ("Completed", "Failed", "Stopped"):
                        break
                    if stop_when(desc):
                        job.stop(wait=True)
                        stopped = True
                        break
                    time.sleep(0.5)
            desc = job.wait(timeout=max(1.0, timeout - (time.time() - t0)), raise_on_failure=False)
        except TimeoutError:
            log(f"job {job.name} did not end within {timeout:.0f} s; stopping it")
            try:
                job.stop(wait=True)
            except Exception as exc:
                log(f"stopping {job.name} failed: {exc}")
            desc = job.describe()
        self.wait_gone(job.name)
        jobs = JobStore(job.store, job.name)
        per_attempt: dict[int, list[dict[str, Any]]] = {}
        for attempt in desc.get("attempts", []):
            k = int(attempt["number"])
            try:
                text = job.store.get_text(jobs.keys.log(k, 0))
            except Exception:
                text = ""
            per_attempt[k] = bench_lines(text)
        try:
            events = jobs.events()
        except Exception:
            events = []
        ok = desc.get("state") == ("Stopped" if stopped else "Completed")
        if not ok:
            log(f"job {job.name} ended {desc.get('state')}: {desc.get('failure_reason')}")
            self.explain(job.name, events)
        run = NodeRun(
            t0=t0,
            events=per_attempt.get(1, []),
            ok=ok,
            info={"job": job.name, "job_events": events},
        )
        if not keep:
            self.discard(job.name)
        return run, desc, per_attempt

    def wait_gone(self, name: str, timeout: float = 30.0) -> None:
        """Wait for the job's processes (its controller too) to exit after it ended."""
        from trainctl.procs import CONTROLLER_TAG, find_tagged, job_processes

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = job_processes(name) + find_tagged(CONTROLLER_TAG, name)
            if not left:
                return
            time.sleep(0.2)
        log(f"job {name}: processes still running {timeout:.0f} s after it ended: {left}")

    def explain(self, name: str, events: list[dict[str, Any]]) -> None:
        """What went wrong: the job's last events and its controller's log."""
        from trainctl.controller.detached import controller_log_path

        for event in events[-8:]:
            log(f"  event: {json.dumps(event)[:300]}")
        try:
            tail = controller_log_path(name).read_text(errors="replace").splitlines()[-25:]
        except OSError:
            tail = []
        for line in tail:
            log(f"  controller: {line[:300]}")

    def discard(self, name: str) -> None:
        """Free the disk a finished job used (its store prefix and node dirs)."""
        from trainctl.provisioning.local import LocalProvider

        try:
            LocalProvider(self.home).terminate(name, grace=0)
        except Exception as exc:
            log(f"cleanup of {name} failed: {exc}")
        shutil.rmtree(self.home / "store" / "jobs" / name, ignore_errors=True)


def machine_info() -> dict[str, Any]:
    import platform

    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = None
    return {
        "device": TOPOLOGY.device,
        "gpus": TOPOLOGY.gpus,
        "layout": f"{TOPOLOGY.nodes} node(s) x {TOPOLOGY.workers_per_node} worker(s)",
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem, 1) if mem else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
