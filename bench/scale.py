"""Scale: the real controller supervising thousands of simulated nodes.

The controller (trainctl.controller.controller.Controller), its store code (a file:// store
behind a counter of requests) and its provider interface run for real; the nodes are
stand-ins (threads in this process) that speak the agent's protocol on their output stream
and do its store traffic on its schedule (trainctl.node.agent, from the settings, paced by
the job's size): `agent_started` and `launched`, a heartbeat on the pipe every
heartbeat_seconds, the status written when it changes and every status_seconds, the lease
read every control_seconds (the controller's notices are in it), log lines at a stated rate
copied to the store every log_ship_seconds by the agent's own LogShipper, rank 0's step and
checkpoint reports, and a result PUT and line at the end. Starting a node costs
STARTUP_ROUND_TRIPS round trips of `--rtt` (SSH connect, auth, agent start), as over a
network.

Per N (16, 64, 256 by default), three jobs:
1. a clean run at the settings' defaults: bootstrap fan-out (controller time from capacity
   ready - provision() returned - to every node started - the last agent start returned -
   and to every node launched), log fan-in (lines sent vs lines stored and shown, order per
   node), the controller's CPU (its threads only, from /proc) and memory (RSS growth of this
   process over the run, sim nodes included: an upper bound) per node, and the agents' store
   requests per node-hour while every node trains, by what each is for, with their cost at
   S3's list prices;
2. a notice to one node: from the controller's `fault` event to the node's emergency
   checkpoint start (the lease relays it: within control_seconds);
3. a node gone silent (a hung machine: no line, no exit), with a heartbeat every
   HEARTBEAT_SECONDS and a node lost after HEARTBEAT_TIMEOUT_SECONDS: to the controller
   counting it lost (in the record), and to the attempt's end (every other node stopped).

    python -m bench.scale [--nodes 16,64,256] [--duration 40] [--lines-per-second 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, log
from trainctl.clock import clock
from trainctl.protocol import split_stamp, stamped_line
from trainctl.record.costs import S3_READ_USD, S3_WRITE_USD
from trainctl.replay.fleet import (
    Fleet,
    FleetProvider,
    FleetRunner,
    StandInNode,
    settings_in_effect,
)

STARTUP_ROUND_TRIPS = FleetRunner.round_trips  # SSH connect, auth, agent upload check, exec
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TIMEOUT_SECONDS = 5.0
# Past 1,024 nodes the silent-node phase logs 0.2 lines a second a node, not 2: 2,048
# stand-ins and their output pumps, in the controller's process on this 2-core machine, fell
# more than the 5 s timeout behind while the last nodes started (nodes "lost" before any was
# silenced, at a 2 s heartbeat and 8 s timeout too), where real agents each have a machine.
# How long a silent node takes to be found does not depend on how much the others log.
LARGE_JOB_NODES = 1024
LARGE_JOB_SILENT_LINES_PER_SECOND = 0.2
GOALS = {"detect_s": 10.0, "bootstrap_s": 120.0, "mb_per_node": 0.1, "requests": 1000.0}
# Memory per node is judged from this size up: below it what is per job, not per node (the
# controller's threads and buffers, the store's handles) is still a large share of the figure.
MEMORY_JUDGED_FROM_NODES = 1024
WARM_UP_NODES, WARM_UP_SECONDS = 4, 3.0

# What a request is for, from its key (trainctl.record.JobKeys's names), first match wins.
REQUEST_KINDS = (
    (".status.json", "node status"),
    (".result.json", "node result"),
    ("lease.json", "lease"),
    ("/logs/", "log shipping"),
    ("/checkpoints", "checkpoints"),
)


WRITE_METHODS = frozenset({"put_text", "put_file", "put_bytes", "put_if", "append_bytes", "list"})


def s3_cost(counts: Counter[str]) -> float:
    """What `counts` (requests by store method) cost at S3's list prices."""
    return sum(n * (S3_WRITE_USD if m in WRITE_METHODS else S3_READ_USD) for m, n in counts.items())


def request_kind(args: tuple[Any, ...]) -> str:
    """What a store request is for, from its key (any of its string arguments: a file's
    upload names the local file first)."""
    keys = [str(a) for a in args if isinstance(a, (str, os.PathLike))]
    return next((kind for part, kind in REQUEST_KINDS if any(part in key for key in keys)), "other")


class CountingStore:
    """A store that counts the requests made through it (by method, and by what each is
    for), for S3's bill."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.counts: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name == "prompt":  # the same store (a file:// store is its own prompt one), counted
            return lambda: self
        if not callable(value) or name.startswith("_") or name in ("url", "child"):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
                self.kinds[request_kind(args)] += 1
            return value(*args, **kwargs)

        return counted


class SimNode(StandInNode):
    """One node agent's stand-in that logs at the harness's rate and does the agent's
    store traffic at its intervals (status, notice poll, lease check, log shipping)."""

    def __init__(self, harness: Harness, job: str, attempt: int, rank: int) -> None:
        from trainctl.node.output import LogShipper

        super().__init__(harness, job, attempt, rank)
        self.harness = harness
        self.sent = 0
        log_path = harness.root / f"{job}-{attempt}-{rank}.log"

        class QuietShipper(LogShipper):  # the agent's shipper, without its console tee
            def write(self, line: str) -> None:
                with self._lock:
                    self._file.write(stamped_line(line) + "\n")

            def _run(self) -> None:
                try:
                    super()._run()
                finally:
                    harness.add_sim_cpu(time.thread_time())

        from trainctl.spec.settings import get_settings

        self.logs = QuietShipper(
            log_path,
            harness.node_store,
            self.jobs.keys.log(attempt, rank),
            get_settings().log_ship_seconds(harness.sizes.get(attempt, 1)),
        )
        harness.shippers.append(self.logs)

    def kill(self) -> None:
        self.logs._stop.set()  # a killed machine ships nothing more
        super().kill()

    def _status_put(self, state: str) -> None:
        key = self.jobs.keys.node_status(self.attempt, self.rank)
        self.harness.node_store.put_text(key, json.dumps({"rank": self.rank, "state": state}))

    def _run(self) -> None:
        try:
            self._agent()
        finally:
            self.harness.add_sim_cpu(time.thread_time())

    def _agent(self) -> None:
        """The agent's schedule (trainctl.node.agent): a heartbeat on its pipe every
        heartbeat_seconds; its status written when it changes (launched, a checkpoint) and
        every status_seconds; the lease read every control_seconds, with the controller's
        notices in it; the log shipped every log_ship_seconds (the LogShipper's thread)."""
        from trainctl.record.jobstore import lease_notice
        from trainctl.spec.settings import get_settings

        h = self.harness
        settings = get_settings()
        nodes = h.sizes.get(self.attempt, 1)
        beat = settings.heartbeat_seconds
        refresh = settings.status_seconds(nodes)
        look = min(refresh, beat)
        control = settings.control_seconds(nodes)
        self._emit("agent_started", pid=os.getpid())
        self._status_put("starting")
        self._emit("launched", pid=os.getpid())
        self._status_put("launched")
        started = clock().monotonic()
        next_beat = next_look = next_line = started
        # the first lease read and status refresh at a random point of their intervals, as
        # the agent's (nodes started together spread them)
        next_lease = started + random.uniform(0.0, control)
        status_due = started + random.uniform(0.0, refresh)
        line_number = step = checkpoint = stored_checkpoint = 0
        code = 0
        while not self._killed.is_set():
            now = clock().monotonic()
            if self.silenced.is_set():  # a hung machine: nothing at all, and no exit
                clock().sleep(0.1)
                continue
            if self._terminate.is_set():
                code = 143
                break
            if now - started >= h.duration:
                break
            if now >= next_line:
                line_number += 1
                line = f"node {self.rank} line {line_number}"
                self._say(line)
                self.logs.write(line)
                self.sent += 1
                next_line += 1.0 / h.lines_per_second
            if now >= next_beat:
                self._emit("heartbeat")
                next_beat += beat
                if self.rank == 0:  # rank 0's step each heartbeat, a checkpoint every 10
                    step += 1
                    self._emit("step", step=step)
                    if step % 10 == 0:
                        checkpoint = step
                        self._emit("checkpoint", step=step)
            if now >= next_look:
                next_look += look
                if checkpoint != stored_checkpoint or now >= status_due:
                    stored_checkpoint = checkpoint
                    self._status_put("running")
                    status_due = now + refresh
            notice = None
            if now >= next_lease:
                next_lease += control
                notice = lease_notice(self.jobs.read_lease(), self.attempt, self.rank)
            if notice is not None or self.attempt in h.preempting:
                # the script's PreemptionFlag agrees on it across ranks: all stop
                h.notice_seen(self.attempt, self.rank, clock().time())
                self._emit("notice")
                self._status_put("notice")
                self._emit("checkpoint", step=step)  # the emergency checkpoint
                self._emit("preempted", step=step)
                code = 85
                break
            wake = min(next_line, next_beat, next_look, next_lease)
            clock().sleep(max(0.0, min(wake - clock().monotonic(), 0.5)))
        if self._killed.is_set():
            return
        self.logs.close()
        self._exit(code)


class Harness(Fleet):
    def __init__(self, root: Path, duration: float, lines_per_second: float, rtt: float):
        from trainctl.store import open_store

        root.mkdir(parents=True, exist_ok=True)
        inner = open_store(f"file://{root / 'store'}")
        # the controller's requests and the (simulated) agents', counted apart
        super().__init__(root, CountingStore(inner), CountingStore(inner))
        self.duration, self.lines_per_second, self.rtt = duration, lines_per_second, rtt
        self.node_class = SimNode
        self.notices: dict[int, float] = {}  # rank -> wall clock its notice was seen
        self.shippers: list[Any] = []  # every node's log shipper, of every phase
        self._sim_cpu = 0.0
        self._lock = threading.Lock()

    def end_shippers(self) -> None:
        """Every node's log shipper stopped and waited for, before the harness's folder goes
        (a silent or killed node's went on copying a log that was no longer there: a hundred
        "log upload failed" lines at the end of a run)."""
        for shipper in self.shippers:
            shipper._stop.set()
        for shipper in self.shippers:
            shipper._thread.join(timeout=30)
        self.shippers.clear()

    def notice_seen(self, attempt: int, rank: int, at: float) -> None:
        self.notices.setdefault(rank, at)
        self.preempting.add(attempt)

    def add_sim_cpu(self, seconds: float) -> None:
        with self._lock:
            self._sim_cpu += seconds

    def reset(self) -> None:
        self.nodes.clear()
        self.notices.clear()
        self.preempting.clear()
        # The last job's: left set, the next clean run's request window opened at its first
        # look, before its nodes started, and counted their one-off requests as an hour's
        # (1,037 a node-hour at 64 and 256 nodes after the warm-up job came, ~880 before).
        self.started_at = self.provisioned_at = None

    def controller_cpu_seconds(self) -> float:
        """CPU of this process less the stand-ins' (each thread's own, added as it ends)."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime - self._sim_cpu


def sim_provider(harness: Harness) -> FleetProvider:
    """Capacity that is always there; a start costs STARTUP_ROUND_TRIPS of the RTT."""
    return FleetProvider(harness, rtt=harness.rtt)


class CountingPrinter:
    """The controller's printer: counts each node's lines and checks their order."""

    def __init__(self) -> None:
        self.shown: Counter[int] = Counter()
        self.last: dict[int, int] = defaultdict(int)
        self.out_of_order = 0
        self.launched_at: float | None = None

    def node_line(self, rank: int, line: str, *, attempt: int | None = None) -> None:
        if line.startswith("node "):
            self.shown[rank] += 1
            number = int(line.rsplit(" ", 1)[1])
            if number != self.last[rank] + 1:
                self.out_of_order += 1
            self.last[rank] = number

    def info(self, message: str) -> None:
        if message == "training started on every node":
            self.launched_at = clock().monotonic()

    def __getattr__(self, name: str) -> Any:  # anything else a printer does: nothing
        return lambda *args, **kwargs: None


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_job(
    harness: Harness,
    nodes: int,
    faults: list[str],
    act: Any = None,
    *,
    provider: Any = None,
    **fields: Any,
) -> dict[str, Any]:
    """A job of `nodes` simulated nodes under the real controller (trainctl.replay.fleet);
    `provider`: the capacity (default: always there), `fields`: more of the job's fields."""
    from trainctl.replay.fleet import run_job as run_fleet_job

    printer = CountingPrinter()
    result = run_fleet_job(
        harness,
        nodes,
        provider=provider or sim_provider(harness),
        printer=printer,
        act=act,
        timeout=harness.duration * 4 + 120,
        faults=faults,
        **fields,
    )
    result["printer"] = printer
    return result


def clean_run(harness: Harness, nodes: int) -> dict[str, Any]:
    """Phase 1: a job that runs its course; bootstrap, log fan-in, CPU, memory, requests.
    The agents' requests per node-hour are counted over the window when every node trains
    (from a second after the last start to a second before the first can end): what a long
    job pays an hour. Each node's one-off requests (start, end) are counted apart."""
    harness.reset()
    harness.store.counts.clear()
    harness.node_store.counts.clear()
    harness.store.kinds.clear()
    harness.node_store.kinds.clear()
    rss0, cpu0, t0 = rss_mb(), harness.controller_cpu_seconds(), clock().monotonic()
    peak = {"rss": rss0}
    window: dict[str, tuple[float, Counter[str], Counter[str]]] = {}

    def counted() -> tuple[float, Counter[str], Counter[str]]:
        store = harness.node_store
        with store._lock:
            return clock().monotonic(), Counter(store.counts), Counter(store.kinds)

    def sample(controller: Any, result: dict[str, Any]) -> None:
        while controller.record.state.value not in ("Completed", "Failed", "Stopped"):
            peak["rss"] = max(peak["rss"], rss_mb())
            now = clock().monotonic()
            started, provisioned = harness.started_at, harness.provisioned_at
            if started is not None and "from" not in window and now >= started + 1:
                window["from"] = counted()
            if (
                "from" in window
                and "to" not in window
                and provisioned is not None
                and now >= provisioned + harness.duration - 1
            ):
                window["to"] = counted()
            clock().sleep(0.25)

    clean = run_job(harness, nodes, [], sample)
    wall = clock().monotonic() - t0
    cpu = harness.controller_cpu_seconds() - cpu0
    requests = sum(harness.store.counts.values())
    node_requests = sum(harness.node_store.counts.values())
    if "from" in window and "to" in window and window["to"][0] - window["from"][0] >= 5:
        (a, counts_a, kinds_a), (b, counts_b, kinds_b) = window["from"], window["to"]
        span, counts, kinds = b - a, counts_b - counts_a, kinds_b - kinds_a
    else:  # too short a run for a window: the whole run, one-off requests included
        span, counts, kinds = wall, Counter(harness.node_store.counts), harness.node_store.kinds
    steady = sum(counts.values()) / span * 3600 / nodes
    printer: CountingPrinter = clean["printer"]
    sent = sum(n.sent for n in harness.nodes.values())
    stored = 0
    for attempt, rank in harness.nodes:
        text = harness.store.get_text(f"jobs/{clean['job']}/logs/attempt-{attempt}/node-{rank}.log")
        stored += sum(1 for line in text.splitlines() if split_stamp(line)[1].startswith("node "))
    shown = sum(printer.shown.values())
    assert harness.provisioned_at is not None and harness.started_at is not None
    return {
        "nodes": nodes,
        "clean_state": clean["final"].state.value,
        "clean_attempt_causes": [a.cause for a in clean["final"].attempts],
        "started_nodes": len(harness.nodes),
        "bootstrap_s": harness.started_at - harness.provisioned_at,
        "all_launched_s": (printer.launched_at or float("nan")) - harness.provisioned_at,
        "lines_sent": sent,
        "lines_stored": stored,
        "lines_shown": shown,
        "dropped": max(sent - stored, sent - shown),
        "out_of_order": printer.out_of_order,
        "controller_cpu_core_percent_per_node": cpu / wall * 100 / nodes,
        "mb_per_node": (peak["rss"] - rss0) / nodes,
        "controller_requests_per_node_hour": requests / wall * 3600 / nodes,
        "agent_requests_per_node_hour": steady,
        "agent_one_off_requests_per_node": max(0.0, (node_requests - steady * nodes * wall / 3600))
        / nodes,
        "controller_requests": dict(harness.store.counts),
        "agent_requests": dict(harness.node_store.counts),
        "agent_requests_per_node_hour_by_kind": {
            kind: count / span * 3600 / nodes for kind, count in kinds.items()
        },
        "store_usd_per_node_hour": s3_cost(harness.store.counts) / wall * 3600 / nodes
        + s3_cost(counts) / span * 3600 / nodes,
    }


def notice_run(harness: Harness, nodes: int) -> float | None:
    """Phase 2: a notice to the last node 3 s into training; seconds from the controller's
    fault event to the node's emergency checkpoint."""
    from trainctl.record.keys import parse_iso

    harness.reset()

    def stop_after_notice(controller: Any, result: dict[str, Any]) -> None:
        while not harness.notices and controller.record.state.value != "Completed":
            clock().sleep(0.1)
        controller.jobs.request_stop("bench: measured")

    notice = run_job(harness, nodes, [f"notice:{nodes - 1}@3"], stop_after_notice)
    fault = next((e for e in notice["events"] if e["type"] == "fault"), None)
    seen = harness.notices.get(nodes - 1)
    return seen - parse_iso(fault["time"]) if fault and seen else None


def silent_run(harness: Harness, nodes: int) -> dict[str, Any]:
    """Phase 3: a node goes silent 3 s into training (no line, no exit); seconds to the
    attempt's end, and its cause (detect_s None, and why, when the attempt ended before any
    node was silenced)."""
    from trainctl.record.keys import parse_iso

    harness.reset()
    timing: dict[str, Any] = {}
    ended = ("Completed", "Failed", "Stopped")

    def silence(controller: Any, result: dict[str, Any]) -> None:
        while controller.record.state.value != "Training":
            if controller.record.state.value in ended:
                return
            clock().sleep(0.05)
        clock().sleep(3)
        attempt = controller.record.attempts[-1].number
        if any(e["type"] == "attempt_end" for e in controller.jobs.events()):
            timing["before"] = controller.record.attempts[0].cause
            controller.jobs.request_stop("bench: an attempt ended before the silence")
            return
        timing["silenced"] = clock().time()
        harness.nodes[(attempt, nodes // 2)].silenced.set()
        node = controller.record.attempts[-1].nodes[nodes // 2]
        while not any(e["type"] == "attempt_end" for e in controller.jobs.events()):
            if "found" not in timing and node.lost:  # (the record, as the controller saves it)
                timing["found"] = clock().time()
            if controller.record.state.value in ended:
                break
            clock().sleep(0.1)
        controller.jobs.request_stop("bench: measured")

    silent = run_job(harness, nodes, [], silence)
    end = next((e for e in silent["events"] if e["type"] == "attempt_end"), None)
    if "silenced" not in timing or end is None:
        why = timing.get("before") or "no attempt trained"
        return {"detect_s": None, "cause": f"ended before a node was silenced: {why}"}
    ended_s = parse_iso(end["time"]) - timing["silenced"]
    return {
        # found: the controller counts the node lost; ended: every other node stopped too
        "detect_s": timing.get("found", parse_iso(end["time"])) - timing["silenced"],
        "ended_s": ended_s,
        "cause": end.get("cause"),
    }


def measure(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """The clean run and the notice at the settings' defaults (what a user's job does to the
    store); the silent node with a heartbeat timeout of HEARTBEAT_TIMEOUT_SECONDS."""
    with tempfile.TemporaryDirectory(prefix=f"trainctl-bench-scale-{nodes}-") as tmp:
        harness = Harness(Path(tmp), args.duration, args.lines_per_second, args.rtt)
        try:
            return _measure(harness, nodes, args)
        finally:
            harness.end_shippers()


def _measure(harness: Harness, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """The phases, in the harness of one size."""
    warm_up(harness)
    out = clean_run(harness, nodes)
    log(f"N={nodes} clean run: {out}")
    if getattr(args, "clean_only", False):  # (make bench at 1,024: memory and requests)
        out.update(notice_to_checkpoint_s=None, detect_s=None, detect_cause=None)
        return out
    out["notice_to_checkpoint_s"] = notice_run(harness, nodes)
    if nodes > LARGE_JOB_NODES:
        harness.lines_per_second = LARGE_JOB_SILENT_LINES_PER_SECOND
    with short_heartbeat_timeout():
        silent = silent_run(harness, nodes)
    harness.lines_per_second = args.lines_per_second
    out["detect_s"], out["detect_cause"] = silent["detect_s"], silent["cause"]
    out["detect_to_end_s"] = silent.get("ended_s")
    log(f"N={nodes}: notice {out['notice_to_checkpoint_s']}, detect {silent}")
    return out


def warm_up(harness: Harness) -> None:
    """A small short job first, in the fresh process each size runs in: what a process's
    first job costs it once (modules imported on first use, pydantic's validators, the
    allocator's arenas for new threads) is no node's. Without it that one-off cost, ~25 MB,
    went into every size's memory per node since each size got a process of its own
    (2026-12-03): 0.13 MB at 256 nodes where the same job's own growth is 0.035 MB."""
    duration = harness.duration
    harness.duration = WARM_UP_SECONDS
    try:
        clean_run(harness, WARM_UP_NODES)
    finally:
        harness.duration = duration


def measure_apart(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """`measure` in a process of its own: after the 1,024-node runs, the same process ran
    the 2,048-node one with a node's lines over 150 s late (a node "lost" in the clean run,
    39 s to find the silent one, where a fresh process took 5 s): what one size leaves in
    the process (its heap, for the collector to walk) must not load the next."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(_measure_configured, nodes, args).result()


def _measure_configured(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    configure()
    return measure(nodes, args)


def short_heartbeat_timeout() -> contextlib.AbstractContextManager[None]:
    """A heartbeat every HEARTBEAT_SECONDS, a node lost after HEARTBEAT_TIMEOUT_SECONDS, then
    the settings as before."""
    return settings_in_effect(
        {
            "TRAINCTL_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS": str(HEARTBEAT_TIMEOUT_SECONDS),
        }
    )


def configure() -> None:
    """File descriptors for thousands of nodes' logs."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def figure_rows(r: dict[str, Any], rtt: float, lines_per_second: float) -> list[dict[str, Any]]:
    """One N's measurements as rows of the performance table, against the issue's goals."""
    from bench.common import summary

    notice = r["notice_to_checkpoint_s"]
    measured_detect = r["detect_s"] is not None or r.get("detect_cause") is not None
    rows = [
        (
            "bootstrap",
            f"capacity ready -> every node started ({rtt * 1000:.0f} ms RTT x "
            f"{STARTUP_ROUND_TRIPS} a start)",
            "s",
            r["bootstrap_s"],
            "<= 120 s at 256",
            r["bootstrap_s"] <= GOALS["bootstrap_s"],
            f"all launched {r['all_launched_s']:.1f} s",
        ),
        (
            "detect",
            f"silent node -> counted lost (after {HEARTBEAT_TIMEOUT_SECONDS:g} s)",
            "s",
            r["detect_s"],
            "<= 10 s",
            r["detect_s"] is not None and r["detect_s"] <= GOALS["detect_s"],
            "notice -> emergency checkpoint " + ("-" if notice is None else f"{notice:.2f} s"),
        ),
        (
            "logs",
            f"log lines dropped ({lines_per_second:g} lines/s a node)",
            "lines",
            r["dropped"],
            "0 dropped, order kept",
            r["dropped"] == 0 and not r["out_of_order"],
            f"{r['lines_sent']} sent, {r['lines_stored']} stored, {r['lines_shown']} shown",
        ),
        (
            "memory",
            "controller memory per node (upper bound: with the stand-in nodes')",
            "MB",
            r["mb_per_node"],
            f"<= 0.1 MB from {MEMORY_JUDGED_FROM_NODES:,} nodes"
            if r["nodes"] >= MEMORY_JUDGED_FROM_NODES
            else f"reported (judged from {MEMORY_JUDGED_FROM_NODES:,} nodes)",
            r["nodes"] < MEMORY_JUDGED_FROM_NODES or r["mb_per_node"] <= GOALS["mb_per_node"],
            f"CPU {r['controller_cpu_core_percent_per_node']:.3f} % of a core/node",
        ),
        (
            "requests",
            f"store requests per node-hour while training ({lines_per_second:g} lines/s)",
            "requests",
            r["agent_requests_per_node_hour"],
            "<= 1,000",
            r["agent_requests_per_node_hour"] <= GOALS["requests"],
            ", ".join(
                f"{kind} {n:.0f}"
                for kind, n in sorted(
                    r["agent_requests_per_node_hour_by_kind"].items(), key=lambda kv: -kv[1]
                )
            )
            + f"; controller {r['controller_requests_per_node_hour']:.0f}; "
            f"${r['store_usd_per_node_hour']:.4f} a node-hour at S3's list prices",
        ),
    ]
    n = r["nodes"]
    if not measured_detect:  # a clean run only: no silent node
        rows = [row for row in rows if row[0] != "detect"]
    return [
        {
            "name": f"scale-{key}-{n}",
            "title": f"scale N={n}: {title}",
            "unit": unit,
            "baseline": None,
            "trainctl": summary([float("nan") if value is None else value]),
            "ratio": None,
            "ratio_text": text,
            "goal": goal,
            "pass": ok,
            "detail": r,
        }
        for key, title, unit, value, goal, ok, text in rows
    ]


def figures(ctx: Any) -> list[dict[str, Any]]:
    """`make bench` (`--only scale`): N = 256 whole (a clean run, a notice, a silent node),
    and 1,024's clean run, where memory per node is judged (MEMORY_JUDGED_FROM_NODES) and
    the request budget is what a large job pays (the three phases at 1,024 take ~6 minutes
    on 2 cores: `python -m bench.scale --nodes 1024` runs them; 64 added a minute and
    nothing 256 does not show). --quick: 64 whole."""
    configure()
    args = argparse.Namespace(duration=15.0 if ctx.quick else 40.0, lines_per_second=2.0, rtt=0.05)
    out: list[dict[str, Any]] = []
    for nodes in (64,) if ctx.quick else (256,):
        out += figure_rows(measure_apart(nodes, args), args.rtt, args.lines_per_second)
    if not ctx.quick:
        large = argparse.Namespace(**{**vars(args), "clean_only": True})
        out += figure_rows(measure_apart(MEMORY_JUDGED_FROM_NODES, large), args.rtt,
                           args.lines_per_second)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="16,64,256")
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--lines-per-second", type=float, default=2.0)
    parser.add_argument("--rtt", type=float, default=0.05)
    args = parser.parse_args(argv)
    configure()
    rows = [measure_apart(int(n), args) for n in args.nodes.split(",")]
    print(
        f"scale: real controller, simulated nodes ({args.lines_per_second:g} lines/s per node, "
        f"{args.rtt * 1000:.0f} ms RTT x {STARTUP_ROUND_TRIPS} to start a node; the "
        f"settings' defaults, but for the silent node: heartbeat {HEARTBEAT_SECONDS:g} s, lost "
        f"after {HEARTBEAT_TIMEOUT_SECONDS:g} s, logging {LARGE_JOB_SILENT_LINES_PER_SECOND:g} "
        f"lines/s past {LARGE_JOB_NODES} nodes)"
    )
    for r in rows:
        print(
            f"  N={r['nodes']:4d} bootstrap {r['bootstrap_s']:.1f} s (all launched "
            f"{r['all_launched_s']:.1f} s)  detect {r['detect_s'] or float('nan'):.1f} s  "
            "notice->ckpt "
            f"{r['notice_to_checkpoint_s'] or float('nan'):.2f} s  lines {r['lines_sent']} sent "
            f"{r['lines_stored']} stored {r['lines_shown']} shown ({r['dropped']} dropped, "
            f"{r['out_of_order']} out of order)  "
            f"cpu {r['controller_cpu_core_percent_per_node']:.2f} %/node  "
            f"mem {r['mb_per_node']:.2f} MB/node  store requests per node per hour: "
            f"controller {r['controller_requests_per_node_hour']:.0f}, "
            f"agent {r['agent_requests_per_node_hour']:.0f} while training, "
            f"{r['agent_one_off_requests_per_node']:.0f} once a node ("
            + ", ".join(
                f"{kind} {n:.0f}"
                for kind, n in sorted(
                    r["agent_requests_per_node_hour_by_kind"].items(), key=lambda kv: -kv[1]
                )
            )
            + f"), ${r['store_usd_per_node_hour']:.4f} per node-hour at S3's list prices"
        )
    (BENCH_DIR / "scale-results.json").write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
