"""The controller: one per job, holding the job's lease in the store.

Provision -> start an agent per node -> watch (logs, control messages, exits, stop
requests, max_run) -> tear down. Runs in the submitting process (attached) or as a detached
process that `status`, `logs -f` and `stop` reach through the store.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainctl.clock import clock, pool_map
from trainctl.cluster import ClusterInfo
from trainctl.controller.agents import agent_argv, agent_env
from trainctl.controller.attempts import AttemptEnd, LiveNode
from trainctl.controller.budget import TimeBudget
from trainctl.controller.capacity import CapacitySizer, StoppedWaiting
from trainctl.controller.checkpoint_policy import checkpoint_policy
from trainctl.controller.faults import FaultSchedule
from trainctl.controller.lease import Lease
from trainctl.controller.logs import LogPrinter
from trainctl.controller.takeover import adopt_attempt, went_with_the_controller
from trainctl.controller.telemetry import Telemetry
from trainctl.controller.usage import note_warm_start, record_usage
from trainctl.controller.watch import AttemptWatch, HandedOff, LeaseLost
from trainctl.errors import UnrunnableJobError
from trainctl.node.guard import claimed_output_store
from trainctl.protocol import EXIT_REFUSED
from trainctl.protocol import parse as parse_control
from trainctl.provisioning import get_provider
from trainctl.provisioning.base import (
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

# Attempts in a row that end before every node started training: then the job fails.
MAX_ATTEMPTS_NEVER_STARTED = 3
# Node agents started at once (each start is SSH round trips on remote providers).
START_CONCURRENCY = 32


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
        self._nodes: dict[int, LiveNode] = {}  # the nodes of the attempt being watched
        self._attempt: AttemptWatch | None = None  # the latest attempt's watch
        self._said_apart = False  # the nodes trained apart: said (controller.groups)
        # (attempt, rank, line or None at the end of a node's stream), from every attempt's
        # pumps: one that still drains after its attempt ended is told apart by its number.
        self._lines: queue.Queue[tuple[int, int, str | None]] = clock().queue()
        self._signal: int | None = None
        self._hung_up = False  # the terminal closed: hand the job to a detached controller
        self.handed_off = False
        # This process's attempt start-up (None for an attempt taken over: not seen whole).
        self._startup: dict[str, float] | None = None
        self._attempt_started = 0.0
        self.budget = TimeBudget(self.record, self.settings)  # max_run, max_wait
        self._notice_board: dict[str, Any] = {}  # what the lease relays (_relay_notices)
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

    @property
    def _training_started(self) -> float | None:
        """When the latest attempt's nodes all started training (None: not yet)."""
        return self._attempt.training_started if self._attempt else None

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
        requested_at = now_iso()
        cluster, resized = self.capacity.provision(attempt)
        self._startup = {"capacity": clock().monotonic() - self._attempt_started}
        waited = max(0.0, self.capacity.last_ask_at - self._attempt_started)
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
                requested_at=requested_at,
                waited_seconds=round(waited, 3),
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
        watch = self._start_agents(cluster)
        return watch.run(cluster, watch.nodes)

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

    def _start_agents(self, cluster: ClusterInfo) -> AttemptWatch:
        """Start every node's agent, up to START_CONCURRENCY at a time: a start is network
        round trips (SSH connect, auth, exec) that would add up over hundreds of nodes."""
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
        workers = min(START_CONCURRENCY, len(ranks))
        futures = pool_map(start, ranks, workers, "start-agent")
        # Every start has been tried; the first failure is raised (teardown ends the others).
        procs: dict[int, RunningProcess] = {
            rank: f.result() for rank, f in zip(ranks, futures, strict=True)
        }
        self.jobs.event("agents_started", attempt=cluster.attempt, nodes=len(procs))
        return self._follow(cluster, procs)

    def _follow(self, cluster: ClusterInfo, procs: dict[int, RunningProcess]) -> AttemptWatch:
        """Follow the nodes of a new attempt (trainctl.controller.watch)."""
        self._attempt = AttemptWatch.follow(self, cluster, procs)
        return self._attempt

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
        watch = self._follow(cluster, dict(followers))
        said = [f.status() or {} for f in followers.values()]
        watch.state_stored = any(status.get("state_stored") for status in said)
        if any(status.get("first_step") for status in said):  # (when, the status does not say)
            watch.first_step_at = clock().monotonic()
        end = watch.run(cluster, watch.nodes)
        if end.outcome == "interrupted" and went_with_the_controller(followers):
            return AttemptEnd("interrupted", "controller lost")
        return end

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

    def _on_line(self, rank: int, line: str) -> None:
        self._print(lambda printer: printer.node_line(rank, line))
        self.telemetry.log_line(rank, line)

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
