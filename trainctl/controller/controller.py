"""The controller: one per job, holding the job's lease in the store.

Provision -> start an agent per node -> watch (logs, control messages, exits, stop
requests, max_run) -> tear down. Runs in the submitting process (attached) or as a detached
process that `status`, `logs -f` and `stop` reach through the store.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trainctl.cluster import ClusterInfo
from trainctl.controller.logs import LogPrinter
from trainctl.controller.outputs import output_store
from trainctl.controller.record import Attempt, AttemptNode, JobRecord, JobStore, now_iso
from trainctl.errors import TrainctlError
from trainctl.protocol import parse as parse_control
from trainctl.provisioning import get_provider
from trainctl.provisioning.base import Provider
from trainctl.settings import get_settings
from trainctl.state import JobState
from trainctl.store import Store
from trainctl.transport import RunningProcess

POLL_SECONDS = 0.25
STOP_CHECK_SECONDS = 1.0


@dataclass
class _Node:
    rank: int
    proc: RunningProcess
    launched: bool = False
    idle: bool = False
    exit_code: int | None = None
    result: dict[str, Any] = field(default_factory=dict)
    exited_at: float | None = None


class LeaseHeld(TrainctlError):
    pass


class Lease:
    """Renews jobs/<job>/lease.json so other processes can tell a live controller."""

    def __init__(self, jobs: JobStore, seconds: float) -> None:
        self.jobs = jobs
        self.seconds = seconds
        self.holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)

    def acquire(self) -> None:
        current = self.jobs.read_lease()
        if current and time.time() - float(current.get("renewed_at", 0)) < self.seconds:
            if (current.get("host"), current.get("pid")) != (
                self.holder["host"],
                self.holder["pid"],
            ):
                raise LeaseHeld(
                    f"job {self.jobs.name!r} is controlled by pid {current.get('pid')} on "
                    f"{current.get('host')}"
                )
        self.jobs.write_lease(self.holder)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.jobs.write_lease(self.holder)
            except Exception:  # a missed renewal is survivable; the next one retries
                pass

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.jobs.release_lease()
        except Exception:
            pass


class Controller:
    def __init__(
        self,
        store: Store,
        name: str,
        *,
        printer: LogPrinter | None = None,
        provider: Provider | None = None,
    ) -> None:
        self.store = store
        self.jobs = JobStore(store, name)
        self.name = name
        self.printer = printer
        self.record: JobRecord = self.jobs.load()
        self.provider = provider or get_provider(self.record.spec.instance_type)
        self.settings = get_settings()
        self.stop_reason: str | None = None
        self.interrupted_by_user = False
        self._nodes: dict[int, _Node] = {}
        self._signal: int | None = None
        self._metric_patterns = [
            (m.Name, re.compile(m.Regex)) for m in self.record.spec.metric_definitions
        ]

    # -- signals ------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: the watch loop turns it into a stop with the requester's reason.
        self._signal = signum
        if signum == signal.SIGINT:
            self.interrupted_by_user = True

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    # -- the job ------------------------------------------------------------------------
    def run(self) -> JobRecord:
        if self.record.state.is_terminal():
            return self.record
        previous = self._install_signals()
        lease = Lease(self.jobs, self.settings.lease_seconds)
        # Only a controller that handles SIGTERM may be woken with it by `stop`; without
        # handlers (fit() in a worker thread) SIGTERM would kill the user's whole process.
        lease.holder["handles_sigterm"] = bool(previous)
        try:
            lease.acquire()
        except BaseException:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            raise
        try:
            self._run_attempt(attempt=len(self.record.attempts) + 1)
        except Exception as exc:
            self._end(JobState.FAILED, reason=f"controller error: {exc}")
            raise
        finally:
            self._teardown()
            lease.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.record

    def _info(self, message: str) -> None:
        if self.printer:
            self.printer.info(message)

    def _run_attempt(self, attempt: int) -> None:
        spec = self.record.spec
        if reason := self.jobs.stop_requested():
            self._end(JobState.STOPPED, stop_reason=reason)
            return
        self.jobs.transition(self.record, JobState.PROVISIONING, attempt=attempt)
        self._info(f"job {self.name}: provisioning {spec.instance_count} x {spec.instance_type}")
        cluster = self.provider.provision(spec, self.name, attempt)
        self.store.put_text(self.jobs.keys.cluster(attempt), cluster.model_dump_json(indent=2))
        self.record.attempts.append(
            Attempt(
                number=attempt,
                started_at=now_iso(),
                nodes=[
                    AttemptNode(rank=n.rank, host=n.host, address=n.address) for n in cluster.nodes
                ],
            )
        )
        self.jobs.transition(self.record, JobState.STARTING, attempt=attempt)
        nodes = self._start_agents(cluster)
        self._watch(cluster, nodes)

    def _start_agents(self, cluster: ClusterInfo) -> dict[int, _Node]:
        nodes: dict[int, _Node] = {}
        self._lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        for node in cluster.nodes:
            argv = [
                self.provider.agent_python(cluster, node.rank),
                "-m",
                "trainctl.container.agent",
                "--store",
                self.store.uri,
                "--job",
                self.name,
                "--attempt",
                str(cluster.attempt),
                "--rank",
                str(node.rank),
            ]
            proc = self.provider.start_agent(cluster, node.rank, argv, {})
            nodes[node.rank] = _Node(node.rank, proc)
            threading.Thread(
                target=self._pump, args=(node.rank, proc), name=f"node-{node.rank}", daemon=True
            ).start()
        self.jobs.event("agents_started", attempt=cluster.attempt, nodes=len(nodes))
        self._nodes = nodes
        return nodes

    def _pump(self, rank: int, proc: RunningProcess) -> None:
        try:
            for line in proc.lines():
                self._lines.put((rank, line))
        finally:
            self._lines.put((rank, None))

    def _watch(self, cluster: ClusterInfo, nodes: dict[int, _Node]) -> None:
        spec = self.record.spec
        started = time.monotonic()
        next_stop_check = 0.0
        failure: _Node | None = None
        while True:
            try:
                rank, line = self._lines.get(timeout=POLL_SECONDS)
            except queue.Empty:
                rank, line = -1, None
            if rank >= 0:
                node = nodes[rank]
                if line is None:
                    node.exit_code = node.proc.wait()
                    node.exited_at = time.monotonic()
                    if node.exit_code != 0 and failure is None and not node.idle:
                        failure = node
                elif (msg := parse_control(line)) is not None:
                    self._on_control(node, msg, nodes)
                else:
                    self._on_line(rank, line)
            if failure is not None and self.stop_reason is None:
                self._fail(failure)
                return
            runners = [n for n in nodes.values() if not n.idle]
            if runners and all(n.exit_code == 0 for n in runners):
                self._complete(nodes)
                return
            if all(n.exit_code is not None for n in nodes.values()):
                # Every node is gone without a success or a failure to blame (all idle).
                self._end(JobState.FAILED, reason="every node exited without running the job")
                return
            now = time.monotonic()
            if self.stop_reason is None and self._signal is not None:
                self.stop_reason = (
                    "interrupted by the user (Ctrl-C)"
                    if self._signal == signal.SIGINT
                    else self.jobs.stop_requested() or "controller received SIGTERM"
                )
            if self.stop_reason is None and now >= next_stop_check:
                next_stop_check = now + STOP_CHECK_SECONDS
                self.stop_reason = self.jobs.stop_requested()
                if self.stop_reason is None and now - started > spec.max_run:
                    self.stop_reason = f"MaxRuntimeExceeded: max_run of {spec.max_run} s reached"
            if self.stop_reason is not None:
                self._stop_nodes(nodes)
                self._end(JobState.STOPPED, stop_reason=self.stop_reason)
                return

    def _on_control(self, node: _Node, msg: dict[str, Any], nodes: dict[int, _Node]) -> None:
        event = msg.get("event")
        if event in ("launched", "idle"):
            node.launched = True
            node.idle = event == "idle"
            if all(n.launched for n in nodes.values()):
                self.jobs.transition(self.record, JobState.TRAINING)
                self._info("training started on every node")
        elif event == "uploading":
            if self.record.state in (JobState.TRAINING, JobState.STARTING):
                self.jobs.transition(self.record, JobState.UPLOADING)
        elif event == "result":
            node.result = msg

    def _on_line(self, rank: int, line: str) -> None:
        if self.printer:
            self.printer.node_line(rank, line)
        for metric, pattern in self._metric_patterns:
            if (m := pattern.search(line)) is not None:
                try:
                    self.record.metrics[metric] = float(m.group(1))
                except (TypeError, ValueError):
                    pass

    def _stop_nodes(self, nodes: dict[int, _Node]) -> None:
        """SIGTERM every agent (the agents forward it), then let teardown make sure."""
        for node in nodes.values():
            if node.exit_code is None:
                node.proc.terminate()
        deadline = time.monotonic() + self.settings.stop_grace_seconds
        while time.monotonic() < deadline:
            if all(n.proc.poll() is not None for n in nodes.values()):
                break
            time.sleep(0.1)
        self._drain_lines(nodes)

    def _drain_lines(self, nodes: dict[int, _Node]) -> None:
        while True:
            try:
                rank, line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is not None and parse_control(line) is None:
                self._on_line(rank, line)
            elif line is not None and (msg := parse_control(line)):
                if msg.get("event") == "result":
                    nodes[rank].result = msg

    def _fail(self, node: _Node) -> None:
        # The first node to fail holds the cause; the others fail because their peer went.
        self._stop_nodes(self._nodes)
        result = node.result
        code = int(result.get("exit_code", node.exit_code or 1))
        reason = result.get("reason") or f"exit code {code}"
        host = f"algo-{node.rank + 1}"
        self._end(
            JobState.FAILED,
            reason=f"{host}: {reason}",
            detail=result.get("detail"),
            exit_code=code,
        )

    def _complete(self, nodes: dict[int, _Node]) -> None:
        out = output_store(self.record)
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
        if rec.attempts and rec.attempts[-1].ended_at is None:
            last = rec.attempts[-1]
            last.ended_at = now_iso()
            last.outcome = state.value.lower()
            last.cause = reason or stop_reason
            last.exit_code = exit_code
        if state is JobState.FAILED and reason:
            try:
                text = reason + ("\n\n" + detail if detail else "") + "\n"
                output_store(rec).put_text("failure", text)
            except Exception:
                pass
        detail_fields = {
            k: v for k, v in {"reason": reason, "stop_reason": stop_reason}.items() if v
        }
        self.jobs.transition(rec, state, **detail_fields)

    def _teardown(self) -> None:
        try:
            self.provider.terminate(self.name, grace=self.settings.stop_grace_seconds)
        except Exception as exc:  # never leave silently: say what may still be running
            sys.stderr.write(f"[trainctl] teardown of {self.name} failed: {exc}\n")
        self.jobs.event("teardown", provider=self.provider.name)
