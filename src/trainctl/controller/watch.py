"""One attempt followed to its end: a pump per node onto the controller's line queue, the
provider's machines watched, each line and control message taken, and at most every
POLL_SECONDS a verdict on every node (completed, stopped, a lost node, an interruption
notice, a failure, a hang), with faults fired and relaunches by choice asked for on the way.

`AttemptWatch` holds what is the attempt's alone (when it started training and stepping,
its notices, restores and saved state); the `Controller` it reports to holds the job's (the
lease, the record, the provider, the budget) and decides what the end means for the job.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.controller.attempts import AttemptEnd, LiveNode, Resumes, count_held
from trainctl.controller.groups import trained_apart
from trainctl.controller.hangs import (
    STACKS_GRACE_SECONDS,
    PaceBound,
    hung_failure,
    pace_bound,
    update_pace,
)
from trainctl.controller.progress_watch import ProgressWatch
from trainctl.controller.restores import AttemptRestores
from trainctl.controller.telemetry import recovery_stages, startup_stages
from trainctl.protocol import EXIT_INFRA, message
from trainctl.protocol import parse as parse_control
from trainctl.provisioning.base import (
    FaultInjection,
    Provider,
    StoppedOutsideError,
)
from trainctl.record.keys import iso_at
from trainctl.record.models import Attempt
from trainctl.state import JobState
from trainctl.transport import RunningProcess

if TYPE_CHECKING:
    from trainctl.controller.controller import Controller

POLL_SECONDS = 0.25
PACE_SECONDS = 2.0  # how often the hang bound follows the job's pace
# After a node exits non-zero, how long to wait for the rest of the picture (a lost peer,
# a preemption) before blaming the user's code.
SETTLE_SECONDS = 3.0
# A diagnose run's ranks end by themselves once measured when each reported every step;
# where they report unequally (rank 0 only, at epoch ends) a rank waits in a collective for
# a peer that has ended: past this, what still runs is stopped (the measurement is in).
MEASURED_GRACE_SECONDS = 10.0
# How often the provider is asked whether machines are gone (EC2: DescribeInstances).
MACHINE_CHECK_SECONDS = 5.0
# How often an elastic job below its full size asks whether more capacity is there.
ELASTIC_CHECK_SECONDS = 3.0


class LeaseLost(Exception):
    """Another controller took the job over while this one ran it."""


class HandedOff(Exception):
    """The terminal this controller printed to closed (SIGHUP): a detached controller runs
    the job from here on, adopting its nodes; this one lets go of it."""


@dataclass
class WatchState:
    """What `AttemptWatch.run` carries from one poll to the next: when each periodic check is next
    due, when the first node went wrong, and the attempt's progress (for hangs)."""

    progress: ProgressWatch
    next_capacity_check: float
    next_pace: float  # the hang bound's pace from the job's progress
    next_progress_save: float  # the progress into the record
    pace: PaceBound | None = None  # a relaunch's hang bound from the job's own pace
    next_stop_check: float = 0.0
    next_checks: float = 0.0
    # No running node can have been silent past the heartbeat timeout before this (the
    # least recently heard one's last line, plus the timeout): no scan of them until then.
    silence_due: float = 0.0
    first_abnormal: float | None = None

    def abnormal(self, now: float) -> None:
        if self.first_abnormal is None:
            self.first_abnormal = now


class AttemptWatch:
    """One attempt's nodes, followed (`follow`) and watched to the attempt's end (`run`)."""

    def __init__(self, ctl: Controller, nodes: dict[int, LiveNode]) -> None:
        self.ctl = ctl
        self.nodes = nodes
        self.training_started: float | None = None
        self.first_step_at: float | None = None
        self.notices: dict[int, float] = {}
        self.measured_at: float | None = None  # a diagnose run's measurement arrived
        self.resumes = Resumes()  # where the attempt resumed from, and what that cost
        # Why the attempt is checkpointing to relaunch by choice: an elastic job growing, a
        # job on its on-demand fallback trying spot again (None: it is not).
        self.relaunching: str | None = None
        self.machines_lost = 0  # how many nodes the machine watcher found gone
        self.state_stored = False  # the attempt's nodes put saved state in the store
        self.stored_files: dict[int, int] = {}  # rank -> checkpoint files it stored
        # A hung attempt's nodes: rank -> {worker rank: where it waits} (controller.hangs).
        self.stacks: dict[int, dict[str, str]] = {}
        self.restores: AttemptRestores | None = None  # the nodes' restores
        # When (epoch seconds) every node launched, and the script said it resumed
        self.walls: dict[str, float] = {}

    @classmethod
    def follow(
        cls, ctl: Controller, cluster: ClusterInfo, procs: dict[int, RunningProcess]
    ) -> AttemptWatch:
        """Follow the nodes of an attempt: a pump per node, and the provider's machines."""
        now = clock().monotonic()
        watch = cls(
            ctl, {rank: LiveNode(rank, proc, last_seen=now) for rank, proc in procs.items()}
        )
        for rank, node in watch.nodes.items():
            threading.Thread(
                target=watch._pump, args=(cluster.attempt, node), name=f"node-{rank}", daemon=True
            ).start()
        ctl._nodes = watch.nodes
        if type(ctl.provider).lost_nodes is not Provider.lost_nodes:
            threading.Thread(
                target=watch._watch_machines,
                args=(cluster, watch.nodes),
                name="machines",
                daemon=True,
            ).start()
        return watch

    def _watch_machines(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> None:
        """Ask the provider which machines are gone (a spot reclaim, say), off the log path:
        its API calls may be slow or retried, and the log stream must not wait for them."""
        while self.ctl._nodes is nodes and not self.ctl.stop_reason:
            try:
                gone = self.ctl.provider.lost_nodes(cluster)
            except StoppedOutsideError as exc:  # (scancel): ends the job as `stop` does
                if not self.ctl.jobs.stop_requested():
                    self.ctl.jobs.request_stop(str(exc))
                gone = {}
            except Exception as exc:  # the API being unreachable is not a lost node
                self.ctl._info(f"could not check the instances: {exc}")
                gone = {}
            for rank, why in gone.items():
                node = nodes[rank]
                code = node.proc.poll()
                if node.result or (code is not None and code >= 0 and code != EXIT_INFRA):
                    # It ended by itself and says how (its result, still in its output under
                    # load): a node that checkpointed on a notice (a relaunch by choice) or
                    # whose script failed is not a lost machine. A kill ends it by a signal;
                    # a connection lost with the machine, EXIT_INFRA.
                    continue
                # written on this attempt's own nodes: a late watcher touches no other attempt
                if node.machine_lost is None and self.ctl._nodes is nodes:
                    nodes[rank].machine_lost = why
                    self.machines_lost += 1
                    self.ctl._info(f"algo-{rank + 1}: {why}")
                    try:
                        self.ctl.jobs.event(
                            "machine_lost", attempt=cluster.attempt, rank=rank, why=why
                        )
                    except Exception as exc:  # the node is marked: the watch acts on it
                        self.ctl._info(f"could not record algo-{rank + 1}'s loss: {exc}")
            if all(n.exit_code is not None for n in nodes.values()):
                return
            clock().sleep(MACHINE_CHECK_SECONDS)

    def _pump(self, attempt: int, node: LiveNode) -> None:
        """A node's lines onto the controller's queue. A line is heard when it arrives, not
        when the controller gets to it: a controller held up (a slow store call, a backlog of
        lines) must not take its own delay for the node's silence."""
        try:
            for line in node.proc.lines():
                node.last_seen = clock().monotonic()
                self.ctl._lines.put((attempt, node.rank, line))
        finally:
            self.ctl._lines.put((attempt, node.rank, None))

    def run(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """Follow one attempt until it ends, and say how it ended; then its machine watcher
        stops (it reports to this watch only: instances that leave at teardown are not
        lost machines)."""
        try:
            end = self._watch_until_end(cluster, nodes)
        finally:
            if self.ctl._nodes is nodes:
                self.ctl._nodes = {}
        self._check_together(cluster, nodes)
        return end

    def _check_together(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> None:
        """Once per job: a torchrun job whose nodes never formed a process group across them
        trained a model per node (controller.groups)."""
        if self.ctl._said_apart or self.ctl.record.spec.launcher != "torchrun":
            return
        runners = [n.result for n in nodes.values() if not n.idle]
        if (apart := trained_apart(cluster, runners)) is not None:
            self.ctl._said_apart = True
            self.ctl._warn("trained_apart", apart, attempt=cluster.attempt, why=apart)

    def _watch_until_end(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """Take each line (or a poll's silence), then, at most every POLL_SECONDS, look at
        every node and decide."""
        self.relaunching = None
        now = clock().monotonic()
        watch = WatchState(
            next_capacity_check=now + ELASTIC_CHECK_SECONDS,
            next_pace=now + PACE_SECONDS,
            next_progress_save=now + self.ctl.settings.progress_save_seconds,
            progress=ProgressWatch(
                self.ctl.settings.startup_timeout_seconds,
                self.ctl.settings.progress_timeout_seconds,
                now,
            ),
            pace=pace_bound(
                self.ctl.record,
                self.ctl.settings.hang_pace_factor,
                self.ctl.settings.hang_floor_seconds,
            ),
        )
        while True:
            if self.ctl._lease is not None and self.ctl._lease.lost.is_set():
                raise LeaseLost(self.ctl.name)
            if self.ctl._hung_up:
                self.ctl.telemetry.save_progress(prompt=False)
                raise HandedOff(self.ctl.name)
            line, now = self._take_line(cluster, nodes, watch)
            if line is not None and now < watch.next_checks:
                # The checks below look at every node: with hundreds of nodes they run at
                # most every POLL_SECONDS, not once per line (a node's end is seen at once).
                continue
            watch.next_checks = now + POLL_SECONDS
            self._fire_due_faults(cluster, nodes, now)
            self._mark_lost(nodes, now, watch)
            if now >= watch.next_pace:
                watch.next_pace = now + PACE_SECONDS
                update_pace(watch.progress, watch.pace, self.ctl.record.attempts[-1])
            if now >= watch.next_progress_save:  # progress (steps, metrics) for `status`
                watch.next_progress_save = now + self.ctl.settings.progress_save_seconds
                self.ctl.telemetry.save_progress()
            end = self._verdict(cluster, nodes, now, watch)
            if end is not None:
                update_pace(watch.progress, watch.pace, self.ctl.record.attempts[-1])
                if end.outcome == "interrupted":
                    self._note_interrupted(nodes, watch)
                return end

    def _note_interrupted(self, nodes: dict[int, LiveNode], watch: WatchState) -> None:
        """When the controller saw what ends the attempt (its first lost node, its first
        notice), for the next attempt's recovery stages."""
        seen = [watch.first_abnormal, *self.notices.values()]
        seen += [n.exited_at for n in nodes.values() if n.lost]
        if known := [t for t in seen if t is not None]:
            at = clock().time() - (clock().monotonic() - min(known))
            self.ctl.record.attempts[-1].interrupted_at = iso_at(at)

    def _take_line(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], watch: WatchState
    ) -> tuple[str | None, float]:
        """One line from a node (a log line, a control message, or its end), or a poll's
        silence; returns (the line, now)."""
        try:
            attempt, rank, line = self.ctl._lines.get(timeout=POLL_SECONDS)
        except queue.Empty:
            attempt, rank, line = cluster.attempt, -1, None
        if attempt != cluster.attempt:
            self.ctl._late_line(attempt, rank, line)
            rank, line = -1, None
        now = clock().monotonic()
        if rank < 0:
            return line, now
        self.ctl.telemetry.changes += 1
        node = nodes[rank]
        if line is None:
            node.exit_code = node.proc.wait()
            node.exited_at = now
            if not node.result and node.lost is None and not node.idle:
                # its machine already reported gone (a reclaim) says why better than its end
                ended = f"agent ended without a result (exit code {node.exit_code})"
                self._node_lost(node, node.machine_lost or ended, now)
            if node.exit_code != 0 or node.lost:
                watch.abnormal(now)
        elif (msg := parse_control(line)) is not None:
            self._on_control(node, msg, nodes)
            if msg.get("event") in ("step", "checkpoint"):
                watch.progress.step(now)
            elif msg.get("event") in ("launched", "idle"):
                watch.progress.activity(now)  # the clock runs from the user's code start
        else:
            self.ctl._on_line(rank, line)
            watch.progress.line(rank, line, now)
        return line, now

    def _mark_lost(self, nodes: dict[int, LiveNode], now: float, watch: WatchState) -> None:
        """Nodes whose machine is gone, or that have been silent too long. (Each node is
        looked at only where one may be: at hundreds of nodes, every check's scan of them
        all was a tenth of a replay's CPU.)"""
        for node in nodes.values() if self.machines_lost else ():
            why = node.machine_lost
            if why and node.lost is None and (node.exit_code is None or not node.result):
                if node.exit_code is None and node.proc.poll() is not None:
                    continue  # it ended as the machine went: its end says how, at once
                self._node_lost(node, why, now)
                watch.abnormal(now)
        if now <= watch.silence_due:
            return
        timeout = self.ctl.settings.heartbeat_timeout_seconds
        running = [node for node in nodes.values() if node.exit_code is None]
        for node in running:
            silent = now - node.last_seen
            if silent > timeout:
                if node.lost is None:
                    self._node_lost(node, f"no heartbeat for {silent:.0f} s", now)
                watch.abnormal(now)
        # (a node's last line only moves later, and a node that ended is not looked at)
        watch.silence_due = min((node.last_seen for node in running), default=now) + timeout

    def _node_lost(self, node: LiveNode, why: str, now: float) -> None:
        """`node` counts as lost (infrastructure, not the user's code): said in the record at
        once, so a controller that takes the attempt over knows it without waiting."""
        node.lost = why
        node.exited_at = node.exited_at or now
        recorded = self.ctl.record.attempts[-1].nodes
        if node.rank < len(recorded) and recorded[node.rank].rank == node.rank:
            recorded[node.rank].lost = why
            try:
                self.ctl.jobs.save(self.ctl.record)
            except Exception as exc:  # the watch acts on it all the same
                self.ctl._info(f"could not record algo-{node.rank + 1}'s loss: {exc}")

    def _verdict(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], now: float, watch: WatchState
    ) -> AttemptEnd | None:
        """How the attempt ends now (None: it goes on): completed, stopped, a lost node,
        an interruption notice, a failure, or a hang."""
        runners = [n for n in nodes.values() if not n.idle]
        lost = [n for n in nodes.values() if n.lost]
        if runners and all(n.exit_code == 0 for n in runners) and not lost:
            # Every node succeeded (an agent told to stop ends preempted, not 0): a notice
            # that came as the script finished changes nothing, and relaunching would redo
            # the last steps of a job that is done.
            return AttemptEnd("completed", None, exit_code=0)
        if self.ctl.stop_reason is None and self.ctl._signal is not None:
            self.ctl.stop_reason = (
                "interrupted by the user (Ctrl-C)"
                if self.ctl._signal == signal.SIGINT
                else self.ctl.jobs.stop_requested() or "controller received SIGTERM"
            )
        if self.ctl.stop_reason is None and now >= watch.next_stop_check:
            watch.next_stop_check = now + self.ctl.settings.stop_check_seconds
            self.ctl.stop_reason = self.ctl.jobs.stop_requested()
        if self.ctl.stop_reason is None:
            self.ctl.stop_reason = self.ctl.budget.reached(self.training_started)
        if self.ctl.stop_reason is None and self.measured_at is not None:
            # (a rank that ended abnormally after the measurement is one its peer's end
            # broke: not the script's failure)
            if all(n.exit_code is not None for n in runners) or (
                now - self.measured_at > MEASURED_GRACE_SECONDS
            ):
                self.ctl.stop_reason = "measured: the diagnose run has its steps"
            else:
                return None  # the other ranks end by themselves, or at the grace
        if self.ctl.stop_reason is not None:
            self._stop_nodes(nodes, self.ctl.settings.stop_grace_seconds, self.ctl.stop_reason)
            return AttemptEnd("stopped", self.ctl.stop_reason)
        if lost:
            # The survivors cannot finish a step without their peer: end them, keeping
            # what they already checkpointed (their agents flush uploads on the way out).
            first = min(lost, key=lambda n: n.exited_at or now)
            grace = min(self.ctl.settings.stop_grace_seconds, 5.0)
            self._stop_nodes(nodes, grace, f"algo-{first.rank + 1} was lost")
            return AttemptEnd("interrupted", f"algo-{first.rank + 1} lost: {first.lost}")
        if now >= watch.next_capacity_check:
            watch.next_capacity_check = now + ELASTIC_CHECK_SECONDS
            self._relaunch_if_better(cluster, nodes, now)
        if self.notices:
            grace = self.ctl.settings.notice_grace_seconds + 30.0
            first_notice = min(self.notices.values())
            if all(n.exit_code is not None for n in runners) or now - first_notice > grace:
                ranks = ", ".join(f"algo-{r + 1}" for r in sorted(self.notices))
                why = self.relaunching or f"interruption notice to {ranks}"
                self._stop_nodes(nodes, self.ctl.settings.stop_grace_seconds, why)
                return AttemptEnd("interrupted", why)
            return None
        first_abnormal = watch.first_abnormal
        if first_abnormal is not None and (
            all(n.exit_code is not None for n in runners) or now - first_abnormal > SETTLE_SECONDS
        ):
            return self._classify_failure(nodes)
        started = self.training_started is not None  # staging is not the user's time
        if first_abnormal is None and started and (hang := watch.progress.hung(now)) is not None:
            return self._hung(cluster.attempt, nodes, hang)
        return None

    def _hung(self, attempt: int, nodes: dict[int, LiveNode], hang: str) -> AttemptEnd:
        """The user's code is stuck (a rendezvous that never forms, ranks that resumed
        apart, a deadlock): each rank's stack goes to its node's log, then the attempt fails,
        counted against max_restarts, naming where the ranks wait."""
        self.ctl.jobs.event("hung", attempt=attempt, reason=hang)
        self.ctl._info(f"attempt {attempt} hung: {hang}; taking each rank's stack")
        self.stacks = {}
        grace = max(min(self.ctl.settings.stop_grace_seconds, 5.0), STACKS_GRACE_SECONDS)
        self._stop_nodes(nodes, grace, f"the attempt hung ({hang})", stacks=True)
        reason, detail = hung_failure(hang, nodes, self.stacks)
        if self.stacks:
            self.ctl.jobs.event("hung_stacks", attempt=attempt, where=detail)
        return AttemptEnd("failed", reason, exit_code=1, detail=detail)

    def _relaunch_if_better(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], now: float
    ) -> None:
        """An elastic job below its full size, once the provider has room for more, or a job
        on its on-demand fallback, once it is time to try spot again: every node gets an
        interruption notice, checkpoints and exits, and the next attempt is provisioned
        (a relaunch by choice happens at a checkpoint boundary)."""
        # (no node is lost here: `_verdict` ends the attempt on one before it asks)
        if self.relaunching or self.notices or self.training_started is None:
            return
        better = self.ctl.capacity.better_relaunch(
            cluster, now - self.training_started, state_stored=self.state_stored
        )
        if better is None:
            return
        kind, why = better
        self.relaunching = why
        self.ctl.jobs.event(kind, attempt=cluster.attempt, why=why)
        self.ctl._info(f"attempt {cluster.attempt}: {why}; checkpointing to relaunch")
        self._send_notices(cluster.attempt, list(nodes), why, now)

    def _send_notices(self, attempt: int, ranks: list[int], source: str, now: float) -> None:
        """An interruption notice to each node of `ranks`: at once over the pipe to each
        node this controller started, and relayed in the lease, which every provider's
        agents read (a node without a pipe hears it there): each checkpoints and ends."""
        for rank in ranks:  # (the pipe first: it is heard before the lease is read)
            self.notices.setdefault(rank, now)
            if (node := self.nodes.get(rank)) is not None:
                node.proc.tell(message("notice", why=source))
        self.ctl._relay_notices(attempt, ranks, source)

    def _classify_failure(self, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """A node exited non-zero: the user's code failed, unless it was a preemption."""
        failed = [n for n in nodes.values() if n.exit_code not in (0, None) and not n.idle]
        # The first node to fail holds the cause; the others fail because their peer went.
        node = min(failed, key=lambda n: n.exited_at or 0.0)
        self._stop_nodes(
            nodes, self.ctl.settings.stop_grace_seconds, f"algo-{node.rank + 1} failed"
        )
        if any(n.result.get("preempted") for n in nodes.values()):
            return AttemptEnd("interrupted", "workers stopped after an emergency checkpoint")
        result = node.result
        code = int(result.get("exit_code", node.exit_code or 1))
        reason = result.get("reason") or f"exit code {code}"
        if result.get("unhealthy"):
            # Its machine failed a health check (a bad GPU) or could not reach the store:
            # new capacity, not the user's failure; a machine that is always unhealthy ends
            # as nodes that never start.
            return AttemptEnd("interrupted", f"algo-{node.rank + 1}: {reason}")
        return AttemptEnd(
            "failed",
            f"algo-{node.rank + 1}: {reason}",
            exit_code=code,
            detail=result.get("detail"),
        )

    def _fire_due_faults(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], now: float
    ) -> None:
        if self.training_started is None or not self.ctl._faults:
            return
        if any(n.lost for n in nodes.values()):
            return  # the attempt is ending: the next fault waits for the next attempt
        elapsed = now - self.training_started
        reached = self.ctl.record.attempts[-1].last_step
        stored = sum(self.stored_files.values())
        stepping = None if self.first_step_at is None else now - self.first_step_at
        fault = self.ctl._faults.take_due(set(nodes), elapsed, reached, stored, stepping)
        if fault is None:
            return
        # In the record before it fires: a controller that takes over never repeats it.
        self.ctl.record.attempts[-1].faults.append(str(fault))
        self.ctl.jobs.save(self.ctl.record)
        self.ctl.jobs.event("fault", fault=str(fault), attempt=cluster.attempt)
        hosts = ", ".join(f"algo-{r + 1}" for r in fault.ranks)
        self.ctl._info(f"injecting fault {fault} ({hosts}, {elapsed:.1f} s in)")
        provider = self.ctl.provider
        assert isinstance(provider, FaultInjection)  # (validate_offline refuses faults else)
        if fault.kind not in ("kill", "nocapacity"):
            self._send_notices(cluster.attempt, fault.ranks, f"injected fault {fault}", now)
            return
        if fault.kind == "nocapacity":  # and no replacement for a while
            provider.hold_capacity(self.ctl.name, len(fault.ranks), fault.duration)
        for rank in fault.ranks:
            self._node_lost(nodes[rank], f"killed by injected fault {fault}", now)
            provider.kill_node(cluster, rank)

    def _on_control(self, node: LiveNode, msg: dict[str, Any], nodes: dict[int, LiveNode]) -> None:
        event = msg.get("event")
        attempt = self.ctl.record.attempts[-1]
        if event in ("launched", "idle"):
            node.launched = True
            node.idle = event == "idle"
            if isinstance(msg.get("startup"), dict):
                node.startup.update(msg["startup"])
            if all(n.launched for n in nodes.values()) and self.training_started is None:
                self.training_started = clock().monotonic()
                self.walls["nodes_started"] = clock().time()
                # Without a launcher that waits for its peers (plain python), a quick node
                # can be uploading its results before a slow one has launched.
                if self.ctl.record.state is JobState.STARTING:
                    self.ctl.jobs.transition(self.ctl.record, JobState.TRAINING)
                self.ctl._info("training started on every node")
                self._check_restores(attempt)
                self._started_up(attempt, nodes)  # a quick node may have stepped already
        elif event == "restored":
            self._attempt_restores(attempt).add({**msg, "rank": node.rank})
        elif self.ctl.telemetry.progress_message(attempt, node.rank, msg):
            if attempt.resumed_from_step is None and node.rank == 0:
                # Stepping without a resume: from scratch. Only rank 0's stream tells: its
                # `resumed` comes before its steps, but another node's `checkpoint` travels
                # another stream and can overtake it (seen under load over SSH).
                self._resumed(attempt, 0, guessed=True)
            if self.first_step_at is None:
                self.first_step_at = clock().monotonic()
            self._started_up(attempt, nodes)
            if event == "step":
                self._recovered(attempt)
        elif event == "resumed" and isinstance(msg.get("step"), int):
            self.walls.setdefault("state_restored", clock().time())
            self._resumed(attempt, int(msg["step"]))
            if self.first_step_at is None:  # training is under way, if only to resume
                self.first_step_at = clock().monotonic()
            self._started_up(attempt, nodes)
        elif event == "first_step" and isinstance(ago := msg.get("ago", 0.0), (int, float)):
            # A rank's optimizer stepped (the worker hook): a script reporting no steps too.
            ago = min(max(float(ago), 0.0), 60.0)
            at = clock().monotonic() - ago
            if self.first_step_at is None or at < self.first_step_at:
                self.first_step_at = at
            self._started_up(attempt, nodes)
            self._recovered(attempt, ago)
        elif event == "notice":
            self.notices.setdefault(node.rank, clock().monotonic())
        elif event == "state_stored":
            self.state_stored = True
            if isinstance(files := msg.get("files"), int):  # (for a ckptN fault)
                self.stored_files[node.rank] = max(files, self.stored_files.get(node.rank, 0))
        elif event == "uploading":
            if self.ctl.record.state in (JobState.TRAINING, JobState.STARTING):
                self.ctl.jobs.transition(self.ctl.record, JobState.UPLOADING)
        elif event == "result":
            node.result = msg
        elif event == "diagnosis":
            self._diagnosis(attempt, msg)
        elif event in ("checkpoint_stall", "data_wait"):
            count_held(attempt, event, msg.get("seconds"))

    def _attempt_restores(self, attempt: Attempt) -> AttemptRestores:
        if self.restores is None or self.restores.attempt is not attempt:
            self.restores = AttemptRestores(attempt)
        return self.restores

    def _check_restores(self, attempt: Attempt) -> None:
        """Once every node has said what it restored: each warning said once."""
        for said in self._attempt_restores(attempt).warnings(self.ctl.record.attempts):
            self.ctl._warn(said.event, said.text, attempt=attempt.number, **said.fields)

    def _diagnosis(self, attempt: Attempt, msg: dict[str, Any]) -> None:
        """A diagnose run's measurements (trainctl.train.diagnosis), for `trainctl diagnose`."""
        fields = {k: v for k, v in msg.items() if k not in ("event", "attempt")}
        self.ctl.jobs.event("diagnosis", attempt=attempt.number, **fields)
        if self.ctl.record.measurement_of is not None and self.measured_at is None:
            self.measured_at = clock().monotonic()

    def _started_up(self, attempt: Attempt, nodes: dict[int, LiveNode]) -> None:
        """Once every node has launched and a step was seen: where the start-up went, per
        stage (the slowest node's)."""
        if (
            attempt.startup is not None
            or not self.ctl._startup
            or self.training_started is None
            or self.first_step_at is None
        ):
            return
        attempt.startup = startup_stages(
            self.ctl._startup,
            [{**(getattr(n.proc, "startup", None) or {}), **n.startup} for n in nodes.values()],
            launched=self.training_started,
            first_step=self.first_step_at,
            attempt_started=self.ctl._attempt_started,
        )
        self.ctl.jobs.event("startup", attempt=attempt.number, **attempt.startup)

    def _recovered(self, attempt: Attempt, ago: float = 0.0) -> None:
        """A relaunch's first training step (not its resume), `ago` seconds ago: how long
        each stage of its recovery took since the attempt before it was interrupted, once."""
        attempts = self.ctl.record.attempts
        if attempt.recovery is not None or len(attempts) < 2 or attempts[-2] is attempt:
            return
        if attempts[-2].interrupted_at is None:
            return
        first_step = clock().time() - ago
        stages = recovery_stages(attempts[-2], attempt, **self.walls, first_step=first_step)
        attempt.recovery = stages
        self.ctl.jobs.event("recovered", attempt=attempt.number, **stages)

    def _resumed(self, attempt: Attempt, step: int, *, guessed: bool = False) -> None:
        """`attempt` resumed from `step`: the script said so, or (`guessed`) it stepped
        first (see attempts.Resumes)."""
        if not self.resumes.resumed(self.ctl.record.attempts, attempt, step, guessed=guessed):
            return
        if step:
            self.ctl._info(f"attempt {attempt.number} resumed from the checkpoint of step {step}")
        self.ctl.jobs.event("resumed", attempt=attempt.number, step=step)

    def _stop_nodes(
        self, nodes: dict[int, LiveNode], grace: float, why: str, *, stacks: bool = False
    ) -> None:
        """SIGTERM every agent (the agents forward it), then let teardown make sure. The
        grace is for the nodes that answer: a lost one (silent, its machine gone) is not
        waited for. `why` goes to the store first: each stopped node says it in its log
        (and with `stacks`, first logs its ranks' stacks and says where each waits)."""
        if any(n.exit_code is None for n in nodes.values()):
            try:
                attempt = self.ctl.record.attempts[-1].number
                said = {"why": why, **({"stacks": True} if stacks else {})}
                self.ctl.store.put_text(self.ctl.jobs.keys.stopping(attempt), json.dumps(said))
            except Exception as exc:  # the nodes then only say they were stopped
                self.ctl._info(f"could not record why the nodes stop: {exc}")
        for node in nodes.values():
            if node.exit_code is None:
                node.proc.terminate()
        deadline = clock().monotonic() + grace
        while clock().monotonic() < deadline:
            if all(n.lost or n.proc.poll() is not None for n in nodes.values()):
                break
            clock().sleep(0.1)
        self._drain_lines(nodes)

    def _drain_lines(self, nodes: dict[int, LiveNode]) -> None:
        while True:
            try:
                attempt, rank, line = self.ctl._lines.get_nowait()
            except queue.Empty:
                return
            if attempt != self.ctl.record.attempts[-1].number:
                self.ctl._late_line(attempt, rank, line)
                continue
            if line is not None and parse_control(line) is None:
                self.ctl._on_line(rank, line)
            elif line is not None and (msg := parse_control(line)):
                if msg.get("event") == "result":
                    nodes[rank].result = msg
                elif msg.get("event") == "stacks" and isinstance(msg.get("ranks"), dict):
                    self.stacks[rank] = {str(k): str(v) for k, v in msg["ranks"].items()}
                elif msg.get("event") == "diagnosis":
                    self._diagnosis(self.ctl.record.attempts[-1], msg)
                else:  # the last steps and their metric values before the nodes stopped
                    self.ctl.telemetry.progress_message(self.ctl.record.attempts[-1], rank, msg)
