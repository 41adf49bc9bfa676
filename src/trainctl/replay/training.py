"""Nodes that train by a throughput model, for a replay (trainctl.replay).

A `Workload` is what a data-parallel job's speed and restart costs are (what trainctl
diagnose measures of a real run); a `TrainingNode` is a stand-in node (trainctl.replay.fleet)
that trains by it: steps at the rate its world size allows, a checkpoint at the job's
interval that holds training for the save time, the steps since the last checkpoint lost
when killed or stopped without notice (none with one: an emergency checkpoint), and a
restart cost for every attempt (boot, in the provider; rendezvous and restore, here).
`Training` is the job's training across attempts: the last checkpoint (in the store, it
survives an attempt) and where node-time went.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from dataclasses import dataclass, field

from trainctl.clock import clock
from trainctl.record.jobstore import lease_notice
from trainctl.replay.fleet import Fleet, StandInNode

# A replay's nodes are never silent: its faults end a node's stream (a kill, a reclaim, a
# notice), and the controller hears the end at once. So the ranks but 0 say nothing between
# their start and their end, and a replay's controller counts no node lost by silence
# (SILENT_NODE_LOST_SECONDS, its heartbeat timeout: longer than any replay). Their heartbeats,
# every 2,400 simulated seconds, were ~60 % of a 64-node replay's lines, each a wake of the
# node, its pump and the controller, for no figure. Rank 0 sends its step (and a heartbeat)
# every STEP_REPORT_SECONDS: the controller's progress and the deadline policy's pace come
# from it. How often rank 0 looks for the controller's notice (a growth) in its lease, as the
# agent does every control_poll_seconds.
STEP_REPORT_SECONDS = 300.0
SILENT_NODE_LOST_SECONDS = 1e9
NOTICE_POLL_SECONDS = 10.0


@dataclass(frozen=True)
class Workload:
    """A data-parallel job's speed and restart costs (what trainctl diagnose measures).

    The global batch is the job's (`nodes` x `samples_per_node_step`) at every size: adaptive
    batch keeps it by accumulation when the world shrinks (trainctl.train.AdaptiveBatch). A
    step on `world` nodes takes the full size's `compute_seconds` scaled by nodes / world
    (each node computes its share of the batch), plus a ring all-reduce of the gradients,
    2(n-1)/n of `allreduce_seconds` (bandwidth-bound, not overlapped: the pessimistic case).
    The job's work is `on_demand_hours` of training at its full size.
    """

    name: str
    nodes: int
    on_demand_hours: float
    compute_seconds: float
    allreduce_seconds: float
    samples_per_node_step: int
    save_seconds: float  # a checkpoint holds training this long
    restore_seconds: float  # a relaunch reads the checkpoint back
    bootstrap_seconds: float  # rendezvous, NCCL init, data loaders
    boot_seconds: float  # instance launch to agent start

    def step_seconds(self, world: int) -> float:
        world = max(1, world)
        compute = self.compute_seconds * self.nodes / world
        return compute + self.allreduce_seconds * 2 * (world - 1) / world

    def samples_per_second(self, world: int) -> float:
        return self.global_batch / self.step_seconds(world)

    @property
    def total_samples(self) -> float:
        return self.samples_per_second(self.nodes) * self.on_demand_hours * 3600

    @property
    def global_batch(self) -> int:
        return self.nodes * self.samples_per_node_step

    def step(self, samples: float) -> int:
        return int(samples // self.global_batch)


@dataclass
class AttemptRun:
    """One attempt's training, shared by its nodes: its size, whether it was told to stop
    (a notice to any node stops all: the script's PreemptionFlag), and whether it is done."""

    world: int
    noticed: bool = False
    finished: bool = False
    nodes: list[TrainingNode] = field(default_factory=list)

    def wake_all(self) -> None:
        # by rank: the turns they take follow the order they are woken in, and the nodes
        # joined the attempt in the order a thread pool started them (its figures moved)
        for node in sorted(self.nodes, key=lambda node: node.rank):
            node.wake()

    def notice(self) -> None:
        """A notice to any node stops all, once (EC2 tells each reclaimed node: waking all
        for each was 64 x 64 wakes at 64 nodes, a tenth of a replay's CPU). A node that joins
        the attempt later sees it before it first waits."""
        if not self.noticed:
            self.noticed = True
            self.wake_all()


class Training:
    """The job's training across attempts, as its nodes do it: the samples in the last
    checkpoint (in the store, so they survive an attempt), and where node-time went."""

    def __init__(self, workload: Workload, interval_seconds: float) -> None:
        from trainctl.spec.settings import get_settings

        self.workload = workload
        self.interval_seconds = interval_seconds
        # Rank 0's step reports: every STEP_REPORT_SECONDS, or the agent's heartbeat where a
        # replay sets it shorter (a calibration run of a minute: bench/spot.py). Read once a
        # replay, not once a node (a read scans the environment).
        self.step_report_seconds = min(get_settings().heartbeat_seconds, STEP_REPORT_SECONDS)
        self.saved = 0.0
        self.runs: dict[int, AttemptRun] = {}
        self.node_seconds: Counter[str] = Counter()
        self._lock = threading.Lock()

    def run(self, attempt: int, world: int) -> AttemptRun:
        with self._lock:
            return self.runs.setdefault(attempt, AttemptRun(world))

    def spend(self, kind: str, node_seconds: float) -> None:
        with self._lock:
            self.node_seconds[kind] += node_seconds


class TrainingNode(StandInNode):
    """A node agent's stand-in that trains by the workload's model (rank 0 keeps the
    progress; the other ranks follow it, as collective steps do)."""

    # A replay's controller follows its nodes to the end (no takeover): it hears each
    # result on the node's stream, and a store write per node per attempt was 4 % of an
    # elastic replay's CPU.
    stores_result = False

    def __init__(self, fleet: Fleet, job: str, attempt: int, rank: int) -> None:
        self.training: Training = fleet.training  # type: ignore[attr-defined]
        self._wake = clock().event()
        self.run = self.training.run(attempt, fleet.sizes[attempt])
        self.run.nodes.append(self)
        if attempt in fleet.preempting:  # a notice that came while the machine booted
            self.run.notice()
        super().__init__(fleet, job, attempt, rank)

    def wake(self) -> None:
        self._wake.set()

    def notice(self) -> None:
        self.run.notice()

    def terminate(self) -> None:
        super().terminate()
        self.wake()

    def kill(self) -> None:
        super().kill()
        self.wake()

    def _why(self) -> str | None:
        if self._killed.is_set():
            return "killed"
        if self._terminate.is_set():
            return "terminated"
        if self.run.finished:
            return "finished"
        if self.run.noticed:
            return "notice"
        return None

    def _pause(self, seconds: float) -> str | None:
        """Wait `seconds` of simulated time, unless something stops the node first (what)."""
        deadline = clock().monotonic() + seconds
        while True:
            self._wake.clear()
            if why := self._why():
                return why
            remaining = deadline - clock().monotonic()
            if remaining <= 1e-9:
                return None
            self._wake.wait(remaining)

    def _agent(self) -> None:
        t, w = self.training, self.training.workload
        self._emit("agent_started", pid=os.getpid())
        self._emit("launched", pid=os.getpid())
        if self.rank != 0:  # it follows rank 0 from here (its start-up is rank 0's to count)
            self._finish(self._follow())
            return
        began = clock().monotonic()
        restoring = t.saved > 0
        why = self._pause(w.bootstrap_seconds + (w.restore_seconds if restoring else 0.0))
        t.spend("restart", (clock().monotonic() - began) * self.run.world)
        if why is None:
            if restoring:
                self._emit("resumed", step=w.step(t.saved))
            why = self._train()
        self._finish(why)

    def _follow(self) -> str:
        """A rank but 0: it trains in step with rank 0 until something stops the attempt."""
        return self._pause(math.inf) or "finished"  # (it returns only once stopped)

    def _save(self, samples: float) -> str | None:
        """A checkpoint of `samples`: training holds for the save; None once it is in."""
        t = self.training
        began = clock().monotonic()
        why = self._pause(t.workload.save_seconds)
        t.spend("checkpoint", (clock().monotonic() - began) * self.run.world)
        if why in ("killed", "terminated"):
            return why
        t.saved = samples
        self._emit("checkpoint", step=t.workload.step(samples))
        return None

    def _lose(self, samples: float, rate: float, why: str) -> str:
        """Stopped before saving: a collective step cannot go on without its peers, and what
        was trained since the last checkpoint is trained again (node-time counted)."""
        self.training.spend("redone", (samples - self.training.saved) / rate * self.run.world)
        return why

    def _train(self) -> str:
        t, w, world = self.training, self.training.workload, self.run.world
        rate = w.samples_per_second(world)
        samples = t.saved
        now = last = clock().monotonic()
        next_save, next_beat = now + t.interval_seconds, now + t.step_report_seconds
        next_poll = now + NOTICE_POLL_SECONDS
        while True:
            finish_at = now + (w.total_samples - samples) / rate
            why = self._pause(min(next_save, next_beat, next_poll, finish_at) - now)
            now = clock().monotonic()
            samples = min(w.total_samples, samples + rate * (now - last))
            if w.total_samples - samples < 1e-9 * w.total_samples:
                samples = w.total_samples  # done, but for a rounding error
            t.spend("training", (now - last) * world)
            last = now
            if why in ("killed", "terminated"):
                return self._lose(samples, rate, why)
            if why == "notice":
                self._emit("notice")
                stopped = self._save(samples)  # the emergency checkpoint
                return "preempted" if stopped is None else self._lose(samples, rate, stopped)
            if samples >= w.total_samples:
                self._emit("step", step=w.step(samples))
                self.run.finished = True
                self.run.wake_all()
                return "completed"
            if now >= next_save:
                if (stopped := self._save(samples)) is not None:
                    return self._lose(samples, rate, stopped)
                now = last = clock().monotonic()
                next_save = now + t.interval_seconds
            if now >= next_beat:
                self._emit("heartbeat")
                self._emit("step", step=w.step(samples))
                next_beat = now + t.step_report_seconds
            if now >= next_poll:
                next_poll = now + NOTICE_POLL_SECONDS
                lease = self.jobs.read_lease()  # the controller's notice (a growth)
                if lease_notice(lease, self.attempt, self.rank) is not None:
                    self.run.notice()

    def _finish(self, why: str) -> None:
        if why == "killed":
            return
        code = {"completed": 0, "finished": 0, "terminated": 143}.get(why, 85)
        if code == 85:
            if self.rank != 0:
                self._emit("notice")
            self._emit("preempted", step=self.training.workload.step(self.training.saved))
        self._exit(code)
