"""The controller: one per job, holding the job's lease in the store.

Provision -> start an agent per node -> watch (logs, control messages, exits, stop
requests, max_run) -> tear down. Runs in the submitting process (attached) or as a detached
process that `status`, `logs -f` and `stop` reach through the store.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.controller.agents import agent_argv, agent_env
from trainctl.controller.attempts import AttemptEnd, LiveNode, Resumes
from trainctl.controller.budget import TimeBudget
from trainctl.controller.capacity import CapacitySizer, StoppedWaiting
from trainctl.controller.checkpoint_policy import checkpoint_policy
from trainctl.controller.faults import FaultSchedule
from trainctl.controller.groups import trained_apart
from trainctl.controller.hangs import (
    STACKS_GRACE_SECONDS,
    PaceBound,
    hung_failure,
    pace_bound,
    update_pace,
)
from trainctl.controller.lease import Lease
from trainctl.controller.logs import LogPrinter
from trainctl.controller.progress import ProgressWatch
from trainctl.controller.restores import AttemptRestores
from trainctl.controller.takeover import adopt_attempt, went_with_the_controller
from trainctl.controller.telemetry import Telemetry, startup_stages
from trainctl.controller.usage import note_warm_start, record_usage
from trainctl.errors import UnrunnableJobError
from trainctl.node.guard import claimed_output_store
from trainctl.protocol import EXIT_INFRA, EXIT_REFUSED
from trainctl.protocol import parse as parse_control
from trainctl.provisioning import get_provider
from trainctl.provisioning.base import (
    FaultInjection,
    Provider,
    StoppedOutsideError,
    WarmPools,
)
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import now_iso
from trainctl.record.locations import output_store
from trainctl.record.models import Attempt, AttemptNode, JobRecord, add_warning
from trainctl.spec.settings import get_settings
from trainctl.state import JobState
from trainctl.store import Store
from trainctl.train.interval import POLICY_ENV
from trainctl.transport import RunningProcess

POLL_SECONDS = 0.25
STOP_CHECK_SECONDS = 1.0
RECORD_SAVE_SECONDS = 2.0
# After a node exits non-zero, how long to wait for the rest of the picture (a lost peer,
# a preemption) before blaming the user's code.
SETTLE_SECONDS = 3.0
# A diagnose run's ranks end by themselves once measured when each reported every step;
# where they report unequally (rank 0 only, at epoch ends) a rank waits in a collective for
# a peer that has ended: past this, what still runs is stopped (the measurement is in).
MEASURED_GRACE_SECONDS = 10.0
# Attempts in a row that end before every node started training: then the job fails.
MAX_ATTEMPTS_NEVER_STARTED = 3
# How often the provider is asked whether machines are gone (EC2: DescribeInstances).
MACHINE_CHECK_SECONDS = 5.0
# How often an elastic job below its full size asks whether more capacity is there.
ELASTIC_CHECK_SECONDS = 3.0
# Node agents started at once (each start is SSH round trips on remote providers).
START_CONCURRENCY = 32


class LeaseLost(Exception):
    """Another controller took the job over while this one ran it."""


class HandedOff(Exception):
    """The terminal this controller printed to closed (SIGHUP): a detached controller runs
    the job from here on, adopting its nodes; this one lets go of it."""


@dataclass
class WatchState:
    """What `_watch` carries from one poll to the next: when each periodic check is next
    due, when the first node went wrong, and the attempt's progress (for hangs)."""

    progress: ProgressWatch
    next_capacity_check: float
    next_save: float
    pace: PaceBound | None = None  # a relaunch's hang bound from the job's own pace
    next_stop_check: float = 0.0
    next_checks: float = 0.0
    first_abnormal: float | None = None

    def abnormal(self, now: float) -> None:
        if self.first_abnormal is None:
            self.first_abnormal = now


@dataclass
class _Streak:
    """What ends a job after too many attempts: the user's failures (max_restarts), and
    attempts in a row whose nodes never all started training."""

    user_failures: int = 0
    never_started: int = 0


class Controller:
    def __init__(
        self,
        store: Store,
        name: str,
        *,
        printer: LogPrinter | None = None,
        provider: Provider | None = None,
        log_offsets: dict[tuple[int, int], int] | None = None,
    ) -> None:
        """`log_offsets`: (attempt, rank) -> bytes of a node's log already printed by this
        process (it followed the job before taking it over): adopted nodes go on from there."""
        self.store = store
        self.log_offsets = dict(log_offsets or {})
        self.jobs = JobStore(store, name)
        self.name = name
        self.printer = printer
        self.record: JobRecord = self.jobs.load()
        self.provider = provider or get_provider(
            self.record.spec.instance_type, self.record.spec.region
        )
        self.settings = get_settings()
        self.stop_reason: str | None = None
        self.interrupted_by_user = False
        self._nodes: dict[int, LiveNode] = {}
        self._restores: AttemptRestores | None = None  # the nodes' restores, this attempt's
        self._said_apart = False  # the nodes trained apart: said (controller.groups)
        # A hung attempt's nodes: rank -> {worker rank: where it waits} (controller.hangs).
        self._stacks: dict[int, dict[str, str]] = {}
        # (attempt, rank, line or None at the end of a node's stream), from every attempt's
        # pumps: one that still drains after its attempt ended is told apart by its number.
        self._lines: queue.Queue[tuple[int, int, str | None]] = clock().queue()
        self._signal: int | None = None
        self._hung_up = False  # the terminal closed: hand the job to a detached controller
        self.handed_off = False
        self._training_started: float | None = None
        self._first_step_at: float | None = None
        # This process's attempt start-up (None for an attempt taken over: not seen whole).
        self._startup: dict[str, float] | None = None
        self._attempt_started = 0.0
        self.budget = TimeBudget(self.record)  # max_run, max_wait
        self._notices: dict[int, float] = {}
        self._notice_board: dict[str, Any] = {}  # what the lease relays (_relay_notices)
        self._measured_at: float | None = None  # a diagnose run's measurement arrived
        self._resumes = Resumes()  # where the attempt resumed from, and what that cost
        # Why the attempt is checkpointing to relaunch by choice: an elastic job growing, a
        # job on its on-demand fallback trying spot again (None: it is not).
        self._relaunching: str | None = None
        self._state_stored = False  # the attempt's nodes put saved state in the store
        self._stored_files: dict[int, int] = {}  # rank -> checkpoint files it stored
        # Each fault fires once, in the first attempt that trains long enough; those the
        # record says fired (under a controller this one took over from) never again.
        fired = [f for a in self.record.attempts for f in a.faults]
        self._faults = FaultSchedule(self.record.spec.parsed_faults, fired)
        self._lease: Lease | None = None
        self.telemetry = Telemetry(self.jobs, self.record, self._info)
        self.capacity = CapacitySizer(
            self.provider,
            self.jobs,
            self.record,
            self.settings,
            should_stop=lambda: (
                self.jobs.stop_requested() or self.budget.reached(self._training_started)
            ),
            info=self._info,
            deadline_slack=self.budget.slack,
            pace=self.budget.pace,
        )

    # -- signals ------------------------------------------------------------------------
    @property
    def signalled(self) -> int | None:
        """The signal (SIGINT, SIGTERM) that stopped the job while this ran, if one did."""
        return self._signal

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: the watch loop turns it into a stop with the requester's reason.
        if signum == getattr(signal, "SIGHUP", None):
            # The terminal is gone: the job is not. Nothing more is printed (a write to a
            # closed terminal fails), and the watch loop hands the job off.
            self._hung_up = True
            self.printer = None
            return
        self._signal = signum
        if signum == signal.SIGINT:
            self.interrupted_by_user = True

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        hangup = [signal.SIGHUP] if hasattr(signal, "SIGHUP") else []
        for sig in (signal.SIGINT, signal.SIGTERM, *hangup):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    # -- the job ------------------------------------------------------------------------
    def run(self) -> JobRecord:
        if self.record.state.is_terminal():
            return self.record
        previous = self._install_signals()
        lease = Lease(
            self.store, self.jobs.keys.lease, self.settings.lease_seconds, f"job {self.name!r}"
        )
        # Only a controller that handles SIGTERM may be woken with it by `stop`; without
        # handlers (fit() in a worker thread) SIGTERM would kill the user's whole process.
        lease.holder["handles_sigterm"] = bool(previous)
        try:
            lease.acquire()
        except BaseException:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            raise
        self._lease = lease
        taken_over = handed_off = False
        try:
            self._run_attempts()
        except LeaseLost:
            # Another controller runs the job now: its nodes, its record. Touch nothing.
            taken_over = True
            self._info(f"job {self.name}: taken over by another controller; following it")
        except HandedOff:
            handed_off = True
        except Exception as exc:
            self._end(JobState.FAILED, reason=f"controller error: {exc}")
            raise
        finally:
            if not (taken_over or handed_off):
                self._teardown()
            lease.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if handed_off:
            self._hand_off()
        return self.jobs.load() if taken_over or handed_off else self.record

    def _hand_off(self) -> None:
        """After the lease is let go: a detached controller (`--detach`'s) takes the job
        over and adopts its nodes, which never noticed (they run in sessions of their own)."""
        from trainctl.controller.detached import spawn_controller

        self.jobs.event("handed_off", why="the terminal closed (SIGHUP)")
        spawn_controller(self.store, self.name)
        self.handed_off = True

    def _warn(self, event: str, text: str, **fields: Any) -> None:
        """A warning: an event, the record's (`status` shows it), and the console's."""
        add_warning(self.record, text)
        self.jobs.event(event, **fields)
        self._info(f"warning: {text}")

    def _info(self, message: str) -> None:
        self._print(lambda printer: printer.info(message))

    def _print(self, write: Callable[[Any], None]) -> None:
        """Through the printer, if any; a terminal that closed meanwhile (SIGHUP: writes
        fail) silences it rather than failing the job."""
        printer = self.printer  # (the SIGHUP handler may unset it at any moment)
        if printer is None:
            return
        try:
            write(printer)
        except OSError:
            self.printer = None

    def _run_attempts(self) -> None:
        """Attempts until the job completes, fails for good, is stopped or runs out of time."""
        streak = _Streak(
            user_failures=sum(1 for a in self.record.attempts if a.outcome == "failed")
        )
        # A job whose last attempt never ended lost its controller: this one takes it over.
        if self.record.attempts and self.record.attempts[-1].ended_at is None:
            attempt, end = self.record.attempts[-1].number, self._take_over()
        elif (started := self._next_attempt()) is not None:
            attempt, end = started
        else:
            return
        while True:
            self._close_attempt(end)
            cause = self._relaunch_cause(end, streak)
            if cause is None:
                return  # the job has ended
            self.jobs.transition(self.record, JobState.INTERRUPTED, attempt=attempt, cause=cause)
            self._info(f"attempt {attempt} interrupted: {cause}; relaunching")
            # Release this attempt's capacity before asking for the next. What could not be
            # released is said and tried again by the job's teardown, which ends every
            # attempt's capacity: the job goes on.
            try:
                self.provider.terminate(self.name, grace=0)
            except Exception as exc:
                why = f"attempt {attempt}'s capacity was not all released: {exc}"
                self.jobs.event("teardown_failed", attempt=attempt, error=str(exc))
                sys.stderr.write(f"[trainctl] {why}\n")
            record_usage(self.provider, self.jobs, self.record, self._info)
            if (started := self._next_attempt()) is None:
                return
            attempt, end = started

    def _next_attempt(self) -> tuple[int, AttemptEnd] | None:
        """Run the next attempt to its end; None when the job ended instead (stopped, out of
        time, or unrunnable)."""
        if reason := self.jobs.stop_requested() or self.budget.reached(self._training_started):
            self._end(JobState.STOPPED, stop_reason=reason)
            return None
        attempt = len(self.record.attempts) + 1
        try:
            return attempt, self._run_attempt(attempt)
        except (StoppedWaiting, StoppedOutsideError) as exc:
            self._end(JobState.STOPPED, stop_reason=str(exc))
        except UnrunnableJobError as exc:
            if len(self.record.attempts) == attempt:  # recorded: close it
                self._close_attempt(AttemptEnd("failed", str(exc)))
            self._end(JobState.FAILED, reason=str(exc))
        return None

    def _relaunch_cause(self, end: AttemptEnd, streak: _Streak) -> str | None:
        """Why the job goes on to another attempt after `end`; None when `end` ended the
        job (completed, stopped, refused, or out of restarts), which is then recorded."""
        if end.outcome == "completed":
            self._complete()
            return None
        if end.outcome == "stopped":
            self._end(JobState.STOPPED, stop_reason=end.cause)
            return None
        if end.outcome == "failed" and end.exit_code == EXIT_REFUSED:
            # Tampered code, a URI outside the job's data: new capacity finds the same.
            self._end(JobState.FAILED, reason=end.cause, exit_code=end.exit_code)
            return None
        cause = end.cause or "interrupted"
        streak.never_started = streak.never_started + 1 if self._training_started is None else 0
        if end.outcome == "interrupted" and streak.never_started >= MAX_ATTEMPTS_NEVER_STARTED:
            # Lost capacity is retried; nodes that cannot even start (a bad image, a broken
            # host) fail the same way on new capacity, at a price each time.
            why = f"nodes failed to start {streak.never_started} times in a row: {cause}"
            self._end(JobState.FAILED, reason=why)
            return None
        retries = self.record.spec.max_retry_attempts
        if end.outcome == "interrupted" and retries is not None:
            # SageMaker's max_retry_attempts: the record's count, so a controller that took
            # the job over counts the relaunches before it too
            lost = sum(a.outcome == "interrupted" for a in self.record.attempts)
            if lost > retries:
                why = f"{cause}; relaunched {retries} time(s) already (max_retry_attempts)"
                self._end(JobState.FAILED, reason=why)
                return None
            cause = f"{cause} (retry {lost} of {retries})"
        if end.outcome == "failed":
            streak.user_failures += 1
            restarts = self.record.spec.max_restarts
            if streak.user_failures > restarts:
                self._end(
                    JobState.FAILED, reason=end.cause, detail=end.detail, exit_code=end.exit_code
                )
                return None
            cause = f"{cause} (restart {streak.user_failures} of {restarts})"
        return cause

    def _run_attempt(self, attempt: int) -> AttemptEnd:
        spec = self.record.spec
        self.jobs.transition(self.record, JobState.PROVISIONING, attempt=attempt)
        self._info(f"job {self.name}: provisioning {spec.instance_count} x {spec.instance_type}")
        self._attempt_started = clock().monotonic()
        cluster, resized = self.capacity.provision(attempt)
        self._startup = {"capacity": clock().monotonic() - self._attempt_started}
        self.store.put_text(self.jobs.keys.cluster(attempt), cluster.model_dump_json(indent=2))
        self.record.attempts.append(
            Attempt(
                number=attempt,
                started_at=now_iso(),
                nodes=[
                    AttemptNode(rank=n.rank, host=n.host, address=n.address) for n in cluster.nodes
                ],
                resized=resized,
                capacity_id=cluster.capacity_id,
            )
        )
        if resized:
            self.jobs.event("resized", attempt=attempt, nodes=len(cluster.nodes), why=resized)
            self._info(f"attempt {attempt}: {resized}")
        provider = self.provider
        if isinstance(provider, WarmPools) and (warm := provider.warm_start(self.name, attempt)):
            self.record.attempts[-1].warm_pool = warm.pool  # saved with Starting, below
            note_warm_start(self.jobs, attempt, warm, self._info)
        self.jobs.transition(self.record, JobState.STARTING, attempt=attempt)
        nodes = self._start_agents(cluster)
        return self._watch(cluster, nodes)

    def _close_attempt(self, end: AttemptEnd) -> None:
        current = self.record.attempts[-1]
        current.ended_at = now_iso()
        current.outcome = end.outcome
        current.cause = end.cause
        current.exit_code = end.exit_code
        if self._training_started is not None:
            current.training_seconds = round(clock().monotonic() - self._training_started, 3)
            self.budget.trained_before += current.training_seconds
        self.jobs.save(self.record)
        self.jobs.event("attempt_end", attempt=current.number, outcome=end.outcome, cause=end.cause)
        if self.record.spec.launcher == "mpi":
            self._forget_remote_starts(current)

    def _forget_remote_starts(self, attempt: Attempt) -> None:
        """An MPI node's agent removes its remote-start endpoint as it ends; one killed (its
        instance lost) leaves it, a token of a listener that is gone: removed here."""
        for node in attempt.nodes:
            try:
                self.store.delete(self.jobs.keys.remote_start(attempt.number, node.rank))
            except Exception as exc:
                self._info(f"could not remove node {node.rank}'s remote-start endpoint: {exc}")

    def _start_agents(self, cluster: ClusterInfo) -> dict[int, LiveNode]:
        """Start every node's agent, up to START_CONCURRENCY at a time: a start is network
        round trips (SSH connect, auth, exec) that would add up over hundreds of nodes."""
        from concurrent.futures import ThreadPoolExecutor

        env = agent_env(self.settings)
        policy = checkpoint_policy(self.record, cluster)
        env[POLICY_ENV] = policy.to_env()
        self.jobs.event(
            "checkpoint_policy",
            attempt=cluster.attempt,
            lossy_per_node_hour_saved=policy.lossy_per_node_hour_saved,
            lossy_per_node_hour_unsaved=policy.lossy_per_node_hour_unsaved,
            source=policy.source,
        )

        def start(rank: int) -> RunningProcess:
            runner = self.provider.node_runner(cluster, rank)
            argv = agent_argv(runner.python, self.store.uri, self.name, cluster.attempt, rank)
            return runner.start(argv, env)

        ranks = [node.rank for node in cluster.nodes]
        workers = max(1, min(START_CONCURRENCY, len(ranks)))
        with ThreadPoolExecutor(workers, thread_name_prefix="start-agent") as pool:
            futures = {rank: pool.submit(start, rank) for rank in ranks}
        # Every start has been tried; the first failure is raised (teardown ends the others).
        procs: dict[int, RunningProcess] = {rank: f.result() for rank, f in futures.items()}
        self.jobs.event("agents_started", attempt=cluster.attempt, nodes=len(procs))
        return self._follow(cluster, procs)

    def _take_over(self) -> AttemptEnd:
        """The unfinished attempt of a controller that died, reconciled from the store: nodes
        that finished are recorded from their results, nodes still alive are adopted (their
        logs, progress and results followed through the store: no step lost, no relaunch),
        and when every node is gone the attempt ends with cause "controller lost"."""
        current = self.record.attempts[-1]
        holder = {k: self._lease.holder[k] for k in ("host", "pid")} if self._lease else {}
        self.jobs.event("takeover", attempt=current.number, **holder)
        self._info(f"job {self.name}: taking over attempt {current.number} from a lost controller")
        adopted = adopt_attempt(
            self.store,
            self.jobs,
            current,
            self.provider,
            self.settings,
            self.log_offsets,
            notify=self._relay_notices,
        )
        if adopted is None:
            return AttemptEnd("interrupted", "controller lost")
        cluster, followers = adopted
        nodes = self._follow(cluster, dict(followers))
        said = [f.status() or {} for f in followers.values()]
        self._state_stored = any(status.get("state_stored") for status in said)
        if any(status.get("first_step") for status in said):  # (when, the status does not say)
            self._first_step_at = clock().monotonic()
        end = self._watch(cluster, nodes)
        if end.outcome == "interrupted" and went_with_the_controller(followers):
            return AttemptEnd("interrupted", "controller lost")
        return end

    def _follow(
        self, cluster: ClusterInfo, procs: dict[int, RunningProcess]
    ) -> dict[int, LiveNode]:
        """Follow the nodes of an attempt: a pump per node, and the provider's machines."""
        nodes: dict[int, LiveNode] = {}
        for rank, proc in procs.items():
            nodes[rank] = LiveNode(rank, proc, last_seen=clock().monotonic())
            threading.Thread(
                target=self._pump,
                args=(cluster.attempt, nodes[rank]),
                name=f"node-{rank}",
                daemon=True,
            ).start()
        self._nodes = nodes
        self._training_started = None
        self._first_step_at = None
        self._notices = {}
        self._measured_at = None
        self._resumes = Resumes()
        self._state_stored = False
        self._stored_files = {}
        if type(self.provider).lost_nodes is not Provider.lost_nodes:
            threading.Thread(
                target=self._watch_machines, args=(cluster, nodes), name="machines", daemon=True
            ).start()
        return nodes

    def _watch_machines(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> None:
        """Ask the provider which machines are gone (a spot reclaim, say), off the log path:
        its API calls may be slow or retried, and the log stream must not wait for them."""
        while self._nodes is nodes and not self.stop_reason:
            try:
                gone = self.provider.lost_nodes(cluster)
            except StoppedOutsideError as exc:  # (scancel): ends the job as `stop` does
                if not self.jobs.stop_requested():
                    self.jobs.request_stop(str(exc))
                gone = {}
            except Exception as exc:  # the API being unreachable is not a lost node
                self._info(f"could not check the instances: {exc}")
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
                if node.machine_lost is None and self._nodes is nodes:
                    nodes[rank].machine_lost = why
                    self._info(f"algo-{rank + 1}: {why}")
                    try:
                        self.jobs.event("machine_lost", attempt=cluster.attempt, rank=rank, why=why)
                    except Exception as exc:  # the node is marked: the watch acts on it
                        self._info(f"could not record algo-{rank + 1}'s loss: {exc}")
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
                self._lines.put((attempt, node.rank, line))
        finally:
            self._lines.put((attempt, node.rank, None))

    def _late_line(self, attempt: int, rank: int, line: str | None) -> None:
        """A line of an earlier attempt's node, still draining after that attempt ended:
        its output is shown and its progress counted for that attempt, never this one's
        (a late step of the old node is not a step of the new one at the same rank)."""
        if line is None:
            return
        msg = parse_control(line)
        if msg is None:
            self._on_line(rank, line)
            return
        earlier = self.record.attempts[attempt - 1]
        if not self.telemetry.progress_message(earlier, rank, msg):
            return
        resumed = self.record.attempts[-1].resumed_from_step
        if earlier.steps_lost is not None and resumed is not None:
            earlier.steps_lost = max(0, earlier.last_step - resumed)

    def _watch(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """Follow one attempt until it ends, and say how it ended; then its machine watcher
        stops (it reports to this watch only: instances that leave at teardown are not
        lost machines)."""
        try:
            end = self._watch_until_end(cluster, nodes)
        finally:
            if self._nodes is nodes:
                self._nodes = {}
        self._check_together(cluster, nodes)
        return end

    def _check_together(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> None:
        """Once per job: a torchrun job whose nodes never formed a process group across them
        trained a model per node (controller.groups)."""
        if self._said_apart or self.record.spec.launcher != "torchrun":
            return
        runners = [n.result for n in nodes.values() if not n.idle]
        if (apart := trained_apart(cluster, runners)) is not None:
            self._said_apart = True
            self._warn("trained_apart", apart, attempt=cluster.attempt, why=apart)

    def _watch_until_end(self, cluster: ClusterInfo, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """Take each line (or a poll's silence), then, at most every POLL_SECONDS, look at
        every node and decide."""
        self._relaunching = None
        now = clock().monotonic()
        watch = WatchState(
            next_capacity_check=now + ELASTIC_CHECK_SECONDS,
            next_save=now + RECORD_SAVE_SECONDS,
            progress=ProgressWatch(
                self.settings.startup_timeout_seconds,
                self.settings.progress_timeout_seconds,
                now,
            ),
            pace=pace_bound(
                self.record, self.settings.hang_pace_factor, self.settings.hang_floor_seconds
            ),
        )
        while True:
            if self._lease is not None and self._lease.lost.is_set():
                raise LeaseLost(self.name)
            if self._hung_up:
                self.telemetry.save_progress(prompt=False)
                raise HandedOff(self.name)
            line, now = self._take_line(cluster, nodes, watch)
            if line is not None and now < watch.next_checks:
                # The checks below look at every node: with hundreds of nodes they run at
                # most every POLL_SECONDS, not once per line (a node's end is seen at once).
                continue
            watch.next_checks = now + POLL_SECONDS
            self._fire_due_faults(cluster, nodes, now)
            self._mark_lost(nodes, now, watch)
            if now >= watch.next_save:  # progress (steps, metrics) visible to `status`
                watch.next_save = now + RECORD_SAVE_SECONDS
                update_pace(watch.progress, watch.pace, self.record.attempts[-1])
                self.telemetry.save_progress()
            end = self._verdict(cluster, nodes, now, watch)
            if end is not None:
                update_pace(watch.progress, watch.pace, self.record.attempts[-1])
                return end

    def _take_line(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], watch: WatchState
    ) -> tuple[str | None, float]:
        """One line from a node (a log line, a control message, or its end), or a poll's
        silence; returns (the line, now)."""
        try:
            attempt, rank, line = self._lines.get(timeout=POLL_SECONDS)
        except queue.Empty:
            attempt, rank, line = cluster.attempt, -1, None
        if attempt != cluster.attempt:
            self._late_line(attempt, rank, line)
            rank, line = -1, None
        now = clock().monotonic()
        if rank < 0:
            return line, now
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
            self._on_line(rank, line)
            watch.progress.line(rank, line, now)
        return line, now

    def _mark_lost(self, nodes: dict[int, LiveNode], now: float, watch: WatchState) -> None:
        """Nodes whose machine is gone, or that have been silent too long."""
        for node in nodes.values():
            why = node.machine_lost
            if why and node.lost is None and (node.exit_code is None or not node.result):
                if node.exit_code is None and node.proc.poll() is not None:
                    continue  # it ended as the machine went: its end says how, at once
                self._node_lost(node, why, now)
                watch.abnormal(now)
            silent = now - node.last_seen
            if node.exit_code is None and silent > self.settings.heartbeat_timeout_seconds:
                if node.lost is None:
                    self._node_lost(node, f"no heartbeat for {silent:.0f} s", now)
                watch.abnormal(now)

    def _node_lost(self, node: LiveNode, why: str, now: float) -> None:
        """`node` counts as lost (infrastructure, not the user's code): said in the record at
        once, so a controller that takes the attempt over knows it without waiting."""
        node.lost = why
        node.exited_at = node.exited_at or now
        recorded = self.record.attempts[-1].nodes
        if node.rank < len(recorded) and recorded[node.rank].rank == node.rank:
            recorded[node.rank].lost = why
            try:
                self.jobs.save(self.record)
            except Exception as exc:  # the watch acts on it all the same
                self._info(f"could not record algo-{node.rank + 1}'s loss: {exc}")

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
        if self.stop_reason is None and self._signal is not None:
            self.stop_reason = (
                "interrupted by the user (Ctrl-C)"
                if self._signal == signal.SIGINT
                else self.jobs.stop_requested() or "controller received SIGTERM"
            )
        if self.stop_reason is None and now >= watch.next_stop_check:
            watch.next_stop_check = now + STOP_CHECK_SECONDS
            self.stop_reason = self.jobs.stop_requested()
            self.stop_reason = self.stop_reason or self.budget.reached(self._training_started)
        if self.stop_reason is None and self._measured_at is not None:
            # (a rank that ended abnormally after the measurement is one its peer's end
            # broke: not the script's failure)
            if all(n.exit_code is not None for n in runners) or (
                now - self._measured_at > MEASURED_GRACE_SECONDS
            ):
                self.stop_reason = "measured: the diagnose run has its steps"
            else:
                return None  # the other ranks end by themselves, or at the grace
        if self.stop_reason is not None:
            self._stop_nodes(nodes, self.settings.stop_grace_seconds, self.stop_reason)
            return AttemptEnd("stopped", self.stop_reason)
        if lost:
            # The survivors cannot finish a step without their peer: end them, keeping
            # what they already checkpointed (their agents flush uploads on the way out).
            first = min(lost, key=lambda n: n.exited_at or now)
            grace = min(self.settings.stop_grace_seconds, 5.0)
            self._stop_nodes(nodes, grace, f"algo-{first.rank + 1} was lost")
            return AttemptEnd("interrupted", f"algo-{first.rank + 1} lost: {first.lost}")
        if now >= watch.next_capacity_check:
            watch.next_capacity_check = now + ELASTIC_CHECK_SECONDS
            self._relaunch_if_better(cluster, nodes, now)
        if self._notices:
            grace = self.settings.notice_grace_seconds + 30.0
            first_notice = min(self._notices.values())
            if all(n.exit_code is not None for n in runners) or now - first_notice > grace:
                ranks = ", ".join(f"algo-{r + 1}" for r in sorted(self._notices))
                why = self._relaunching or f"interruption notice to {ranks}"
                self._stop_nodes(nodes, self.settings.stop_grace_seconds, why)
                return AttemptEnd("interrupted", why)
            return None
        first_abnormal = watch.first_abnormal
        if first_abnormal is not None and (
            all(n.exit_code is not None for n in runners) or now - first_abnormal > SETTLE_SECONDS
        ):
            return self._classify_failure(nodes)
        started = self._training_started is not None  # staging is not the user's time
        if first_abnormal is None and started and (hang := watch.progress.hung(now)) is not None:
            return self._hung(cluster.attempt, nodes, hang)
        return None

    def _hung(self, attempt: int, nodes: dict[int, LiveNode], hang: str) -> AttemptEnd:
        """The user's code is stuck (a rendezvous that never forms, ranks that resumed
        apart, a deadlock): each rank's stack goes to its node's log, then the attempt fails,
        counted against max_restarts, naming where the ranks wait."""
        self.jobs.event("hung", attempt=attempt, reason=hang)
        self._info(f"attempt {attempt} hung: {hang}; taking each rank's stack")
        self._stacks = {}
        grace = max(min(self.settings.stop_grace_seconds, 5.0), STACKS_GRACE_SECONDS)
        self._stop_nodes(nodes, grace, f"the attempt hung ({hang})", stacks=True)
        reason, detail = hung_failure(hang, nodes, self._stacks)
        if self._stacks:
            self.jobs.event("hung_stacks", attempt=attempt, where=detail)
        return AttemptEnd("failed", reason, exit_code=1, detail=detail)

    def _relaunch_if_better(
        self, cluster: ClusterInfo, nodes: dict[int, LiveNode], now: float
    ) -> None:
        """An elastic job below its full size, once the provider has room for more, or a job
        on its on-demand fallback, once it is time to try spot again: every node gets an
        interruption notice, checkpoints and exits, and the next attempt is provisioned
        (a relaunch by choice happens at a checkpoint boundary)."""
        if self._relaunching or self._notices or self._training_started is None:
            return
        if any(n.lost for n in nodes.values()):
            return
        better = self.capacity.better_relaunch(
            cluster, now - self._training_started, state_stored=self._state_stored
        )
        if better is None:
            return
        kind, why = better
        self._relaunching = why
        self.jobs.event(kind, attempt=cluster.attempt, why=why)
        self._info(f"attempt {cluster.attempt}: {why}; checkpointing to relaunch")
        self._send_notices(cluster.attempt, list(nodes), why, now)

    def _send_notices(self, attempt: int, ranks: list[int], source: str, now: float) -> None:
        """An interruption notice to each node of `ranks` (relayed in the lease, which every
        provider's agents read): each checkpoints and ends."""
        self._relay_notices(attempt, ranks, source)
        for rank in ranks:
            self._notices.setdefault(rank, now)

    def _relay_notices(self, attempt: int, ranks: Iterable[int], source: str) -> None:
        """Put a notice to these nodes of `attempt` in the lease (record.lease_notice): every
        node of the attempt, one entry, however many there are."""
        from trainctl.record.jobstore import EVERY_NODE, NOTICES

        board = self._notice_board
        if board.get("attempt") != attempt:
            board = self._notice_board = {"attempt": attempt, "ranks": {}}
        ranks = set(ranks)
        if self._nodes and ranks >= set(self._nodes):
            board["ranks"] = {EVERY_NODE: source}
        elif EVERY_NODE not in board["ranks"]:
            board["ranks"].update({str(rank): source for rank in sorted(ranks)})
        if self._lease is not None:
            self._lease.publish(**{NOTICES: {"attempt": attempt, "ranks": dict(board["ranks"])}})

    def _classify_failure(self, nodes: dict[int, LiveNode]) -> AttemptEnd:
        """A node exited non-zero: the user's code failed, unless it was a preemption."""
        failed = [n for n in nodes.values() if n.exit_code not in (0, None) and not n.idle]
        # The first node to fail holds the cause; the others fail because their peer went.
        node = min(failed, key=lambda n: n.exited_at or 0.0)
        self._stop_nodes(nodes, self.settings.stop_grace_seconds, f"algo-{node.rank + 1} failed")
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
        if self._training_started is None or not self._faults:
            return
        if any(n.lost for n in nodes.values()):
            return  # the attempt is ending: the next fault waits for the next attempt
        elapsed = now - self._training_started
        reached = self.record.attempts[-1].last_step
        stored = sum(self._stored_files.values())
        stepping = None if self._first_step_at is None else now - self._first_step_at
        fault = self._faults.take_due(set(nodes), elapsed, reached, stored, stepping)
        if fault is None:
            return
        # In the record before it fires: a controller that takes over never repeats it.
        self.record.attempts[-1].faults.append(str(fault))
        self.jobs.save(self.record)
        self.jobs.event("fault", fault=str(fault), attempt=cluster.attempt)
        hosts = ", ".join(f"algo-{r + 1}" for r in fault.ranks)
        self._info(f"injecting fault {fault} ({hosts}, {elapsed:.1f} s in)")
        provider = self.provider
        assert isinstance(provider, FaultInjection)  # (validate_offline refuses faults else)
        if fault.kind not in ("kill", "nocapacity"):
            self._send_notices(cluster.attempt, fault.ranks, f"injected fault {fault}", now)
            return
        if fault.kind == "nocapacity":  # and no replacement for a while
            provider.hold_capacity(self.name, len(fault.ranks), fault.duration)
        for rank in fault.ranks:
            self._node_lost(nodes[rank], f"killed by injected fault {fault}", now)
            provider.kill_node(cluster, rank)

    def _on_control(self, node: LiveNode, msg: dict[str, Any], nodes: dict[int, LiveNode]) -> None:
        event = msg.get("event")
        attempt = self.record.attempts[-1]
        if event in ("launched", "idle"):
            node.launched = True
            node.idle = event == "idle"
            if isinstance(msg.get("startup"), dict):
                node.startup.update(msg["startup"])
            if all(n.launched for n in nodes.values()) and self._training_started is None:
                self._training_started = clock().monotonic()
                # Without a launcher that waits for its peers (plain python), a quick node
                # can be uploading its results before a slow one has launched.
                if self.record.state is JobState.STARTING:
                    self.jobs.transition(self.record, JobState.TRAINING)
                self._info("training started on every node")
                self._check_restores(attempt)
                self._started_up(attempt, nodes)  # a quick node may have stepped already
        elif event == "restored":
            self._attempt_restores(attempt).add({**msg, "rank": node.rank})
        elif self.telemetry.progress_message(attempt, node.rank, msg):
            if attempt.resumed_from_step is None and node.rank == 0:
                # Stepping without a resume: from scratch. Only rank 0's stream tells: its
                # `resumed` comes before its steps, but another node's `checkpoint` travels
                # another stream and can overtake it (seen under load over SSH).
                self._resumed(attempt, 0, guessed=True)
            if self._first_step_at is None:
                self._first_step_at = clock().monotonic()
            self._started_up(attempt, nodes)
        elif event == "resumed" and isinstance(msg.get("step"), int):
            self._resumed(attempt, int(msg["step"]))
            if self._first_step_at is None:  # training is under way, if only to resume
                self._first_step_at = clock().monotonic()
            self._started_up(attempt, nodes)
        elif event == "first_step" and isinstance(ago := msg.get("ago", 0.0), (int, float)):
            # A rank's optimizer stepped (the worker hook): a script reporting no steps too.
            at = clock().monotonic() - min(max(float(ago), 0.0), 60.0)
            if self._first_step_at is None or at < self._first_step_at:
                self._first_step_at = at
            self._started_up(attempt, nodes)
        elif event == "notice":
            self._notices.setdefault(node.rank, clock().monotonic())
        elif event == "state_stored":
            self._state_stored = True
            if isinstance(files := msg.get("files"), int):  # (for a ckptN fault)
                self._stored_files[node.rank] = max(files, self._stored_files.get(node.rank, 0))
        elif event == "uploading":
            if self.record.state in (JobState.TRAINING, JobState.STARTING):
                self.jobs.transition(self.record, JobState.UPLOADING)
        elif event == "result":
            node.result = msg
        elif event == "diagnosis":
            self._diagnosis(attempt, msg)

    def _attempt_restores(self, attempt: Attempt) -> AttemptRestores:
        if self._restores is None or self._restores.attempt is not attempt:
            self._restores = AttemptRestores(attempt)
        return self._restores

    def _check_restores(self, attempt: Attempt) -> None:
        """Once every node has said what it restored: each warning said once."""
        for said in self._attempt_restores(attempt).warnings(self.record.attempts):
            self._warn(said.event, said.text, attempt=attempt.number, **said.fields)

    def _diagnosis(self, attempt: Attempt, msg: dict[str, Any]) -> None:
        """A diagnose run's measurements (trainctl.train.diagnosis), for `trainctl diagnose`."""
        fields = {k: v for k, v in msg.items() if k not in ("event", "attempt")}
        self.jobs.event("diagnosis", attempt=attempt.number, **fields)
        if self.record.measurement_of is not None and self._measured_at is None:
            self._measured_at = clock().monotonic()

    def _started_up(self, attempt: Attempt, nodes: dict[int, LiveNode]) -> None:
        """Once every node has launched and a step was seen: where the start-up went, per
        stage (the slowest node's)."""
        if (
            attempt.startup is not None
            or not self._startup
            or self._training_started is None
            or self._first_step_at is None
        ):
            return
        attempt.startup = startup_stages(
            self._startup,
            [{**(getattr(n.proc, "startup", None) or {}), **n.startup} for n in nodes.values()],
            launched=self._training_started,
            first_step=self._first_step_at,
            attempt_started=self._attempt_started,
        )
        self.jobs.event("startup", attempt=attempt.number, **attempt.startup)

    def _resumed(self, attempt: Attempt, step: int, *, guessed: bool = False) -> None:
        """`attempt` resumed from `step`: the script said so, or (`guessed`) it stepped
        first (see attempts.Resumes)."""
        if not self._resumes.resumed(self.record.attempts, attempt, step, guessed=guessed):
            return
        if step:
            self._info(f"attempt {attempt.number} resumed from the checkpoint of step {step}")
        self.jobs.event("resumed", attempt=attempt.number, step=step)

    def _on_line(self, rank: int, line: str) -> None:
        self._print(lambda printer: printer.node_line(rank, line))
        self.telemetry.log_line(rank, line)

    def _stop_nodes(
        self, nodes: dict[int, LiveNode], grace: float, why: str, *, stacks: bool = False
    ) -> None:
        """SIGTERM every agent (the agents forward it), then let teardown make sure. The
        grace is for the nodes that answer: a lost one (silent, its machine gone) is not
        waited for. `why` goes to the store first: each stopped node says it in its log
        (and with `stacks`, first logs its ranks' stacks and says where each waits)."""
        if any(n.exit_code is None for n in nodes.values()):
            try:
                attempt = self.record.attempts[-1].number
                said = {"why": why, **({"stacks": True} if stacks else {})}
                self.store.put_text(self.jobs.keys.stopping(attempt), json.dumps(said))
            except Exception as exc:  # the nodes then only say they were stopped
                self._info(f"could not record why the nodes stop: {exc}")
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
                attempt, rank, line = self._lines.get_nowait()
            except queue.Empty:
                return
            if attempt != self.record.attempts[-1].number:
                self._late_line(attempt, rank, line)
                continue
            if line is not None and parse_control(line) is None:
                self._on_line(rank, line)
            elif line is not None and (msg := parse_control(line)):
                if msg.get("event") == "result":
                    nodes[rank].result = msg
                elif msg.get("event") == "stacks" and isinstance(msg.get("ranks"), dict):
                    self._stacks[rank] = {str(k): str(v) for k, v in msg["ranks"].items()}
                elif msg.get("event") == "diagnosis":
                    self._diagnosis(self.record.attempts[-1], msg)
                else:  # the last steps and their metric values before the nodes stopped
                    self.telemetry.progress_message(self.record.attempts[-1], rank, msg)

    def _complete(self) -> None:
        out = output_store(self.record)
        if self.record.spec.disable_output_compression:  # the files, under these prefixes
            if next(iter(out.list("model/")), None) is not None:
                self.record.model_data = out.url("model/")
            if next(iter(out.list("data/")), None) is not None:
                self.record.output_data = out.url("data/")
        if out.exists("model.tar.gz"):
            self.record.model_data = out.url("model.tar.gz")
        if out.exists("output.tar.gz"):
            self.record.output_data = out.url("output.tar.gz")
        if self.record.state is not JobState.UPLOADING:
            self.jobs.transition(self.record, JobState.UPLOADING)
        self._end(JobState.COMPLETED, exit_code=0)

    def _end(
        self,
        state: JobState,
        *,
        reason: str | None = None,
        detail: str | None = None,
        exit_code: int | None = None,
        stop_reason: str | None = None,
    ) -> None:
        if self.record.state.is_terminal():
            return
        rec = self.record
        rec.failure_reason = reason
        rec.failure_detail = detail
        rec.exit_code = exit_code
        rec.stop_reason = stop_reason
        if rec.attempts and rec.attempts[-1].ended_at is None:  # ended by a controller error
            last = rec.attempts[-1]
            last.ended_at = now_iso()
            last.outcome = state.value.lower()
            last.cause = reason or stop_reason
        if state is JobState.FAILED and reason:
            try:
                text = reason + ("\n\n" + detail if detail else "") + "\n"
                claimed_output_store(rec).put_text("failure", text)  # (refused: not written)
            except Exception:
                pass
        self.telemetry.save_metric_points()
        if self._faults:  # injected faults the job ended before: a test that tested nothing
            left = [str(f) for f in self._faults.pending]
            text = f"fault(s) {', '.join(left)} never fired: the job ended first"
            self._warn("faults_not_fired", text, faults=left)
        detail_fields = {
            k: v for k, v in {"reason": reason, "stop_reason": stop_reason}.items() if v
        }
        self.jobs.transition(rec, state, **detail_fields)

    def _teardown(self) -> None:
        kept: list[str] = []
        keep = self.record.spec.keep_alive_period_in_seconds
        provider = self.provider
        handed_on = self.record.state is JobState.STOPPED and self.jobs.stop_keeps_warm()
        if (
            keep
            and isinstance(provider, WarmPools)
            and (self.record.state in (JobState.COMPLETED, JobState.FAILED) or handed_on)
        ):
            # Billed up to now as the job's; from here on as warm time (see record_idle).
            record_usage(self.provider, self.jobs, self.record, self._info)
            try:
                kept = provider.keep_warm(self.name, keep)
            except Exception as exc:  # then they are terminated with the rest
                self._info(f"could not keep the instances warm: {exc}")
        try:
            self.provider.terminate(self.name, grace=self.settings.stop_grace_seconds)
        except Exception as exc:  # never leave silently: say what may still be running
            sys.stderr.write(f"[trainctl] teardown of {self.name} failed: {exc}\n")
        if kept:
            self.jobs.event("kept_warm", instances=kept, seconds=keep)
            self._info(
                f"job {self.name}: {len(kept)} instance(s) kept warm for {keep} s for the next "
                "job with the same capacity spec (`trainctl warm` lists them)"
            )
        self.jobs.event("teardown", provider=self.provider.name)
        record_usage(self.provider, self.jobs, self.record, self._info)
