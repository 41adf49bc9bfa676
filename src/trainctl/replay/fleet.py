"""Stand-in nodes in this process, and the provider that runs them, for the real controller.

A `StandInNode` is a trainctl.transport.RunningProcess: it speaks the node agent's protocol
on its output stream (`agent_started`, `launched`, heartbeats, steps, checkpoints, a notice,
`result`) and writes its result to the store, as the agent does, living by the clock
(trainctl.clock: its queue and events, so that a simulated clock knows its waits). What it
does between is its subclass's `_agent`. A `Fleet` is the nodes of one replayed job, and
`FleetProvider` the capacity that starts them (always there; faults on demand).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo, NodeInfo, host_name
from trainctl.protocol import message
from trainctl.provisioning.base import FaultInjection, NodeRunner, Provider
from trainctl.store import Store


@contextlib.contextmanager
def settings_in_effect(values: dict[str, str]) -> Iterator[None]:
    """TRAINCTL_* settings for what runs inside (the controller and the stand-ins read them
    through get_settings), then the environment as it was."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Fleet:
    """The stand-in nodes of a replayed job, and what they share: the store (the
    controller's and the nodes' handles may differ: a scale harness counts each), the node
    class each start runs, each attempt's size, and the attempts given a notice."""

    def __init__(self, root: Path, store: Store, node_store: Store | None = None) -> None:
        self.root = root
        self.store = store
        self.node_store = node_store or store
        self.node_class: type[StandInNode] = StandInNode
        self.nodes: dict[tuple[int, int], StandInNode] = {}  # (attempt, rank) -> node
        self.sizes: dict[int, int] = {}  # attempt -> its nodes
        # attempts whose nodes had a notice: the script's PreemptionFlag stops all of them
        self.preempting: set[int] = set()
        self.provisioned_at: float | None = None
        self.started_at: float | None = None

    def notify(self, attempt: int, ranks: Any) -> None:
        """The provider's interruption notice to these nodes of `attempt` (EC2's 2 minutes'
        warning)."""
        self.preempting.add(attempt)
        for rank in ranks:
            node = self.nodes.get((attempt, rank))
            if node is not None:
                node.notice()


class StandInNode:
    """One node agent's stand-in (a trainctl.transport.RunningProcess); `_agent` is what it
    does, in a thread of its own."""

    # Its result in the store at its end, as the agent writes it (for a controller that
    # follows the node through the store: one that took the job over).
    stores_result = True

    def __init__(self, fleet: Fleet, job: str, attempt: int, rank: int) -> None:
        from trainctl.record.jobstore import JobStore

        self.fleet, self.rank, self.attempt = fleet, rank, attempt
        self.jobs = JobStore(fleet.node_store, job)
        self._out: queue.Queue[str | None] = clock().queue()
        self._code: int | None = None
        self._ended = clock().event()
        self.silenced = threading.Event()  # a hung machine: no line, no exit
        self._terminate = clock().event()
        self._killed = clock().event()
        self.thread = threading.Thread(target=self._run, name=f"sim-{rank}", daemon=True)

    def start(self) -> StandInNode:
        self.thread.start()
        return self

    # -- RunningProcess --------------------------------------------------------------------
    def lines(self) -> Iterator[str]:
        while (line := self._out.get()) is not None:
            with clock().hold():  # time stands until the controller's pump takes it on
                yield line

    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise TimeoutError
        assert self._code is not None
        return self._code

    def terminate(self) -> None:
        self._terminate.set()

    def kill(self) -> None:
        self._killed.set()
        self.silenced.set()
        self._end(-9)

    def tell(self, line: str) -> bool:
        """No pipe: a replay's nodes stand for EC2's, which the controller reaches over SSH
        and which hear its notices in the lease (RunningProcess.tell)."""
        return False

    def notice(self) -> None:
        """An interruption notice for this node (the base stand-in ignores it)."""

    # -- the agent's behaviour --------------------------------------------------------------
    def _emit(self, event: str, **fields: Any) -> None:
        if not self.silenced.is_set():
            self._out.put(message(event, **{"rank": self.rank, **fields}))

    def _say(self, line: str) -> None:
        """A line of the script's output."""
        self._out.put(line)

    def _end(self, code: int) -> None:
        if self._code is None:
            self._code = code
            self._out.put(None)
            self._ended.set()

    def _exit(self, code: int) -> None:
        """The agent's end: its result in the store and on its stream, then its exit."""
        result = {
            "rank": self.rank,
            "exit_code": code,
            "reason": None,
            "detail": None,
            "stopped": code == 143,
            "preempted": code == 85,
            "notice": None,
        }
        if self.stores_result:
            self.jobs.store.put_text(
                self.jobs.keys.node_result(self.attempt, self.rank), json.dumps(result)
            )
        self._emit("result", **result)
        self._end(code)

    def _run(self) -> None:
        self._agent()

    def _agent(self) -> None:
        self._emit("agent_started", pid=os.getpid())
        self._emit("launched", pid=os.getpid())
        self._exit(0)


class FleetRunner(NodeRunner):
    """A stand-in node, after the network round trips a real start costs (`rtt` each)."""

    python = "python3"
    round_trips = 4  # SSH connect, auth, agent upload check, exec

    def __init__(self, fleet: Fleet, cluster: ClusterInfo, rank: int, rtt: float = 0.0) -> None:
        self.fleet, self.cluster, self.rank, self.rtt = fleet, cluster, rank, rtt

    def start(self, argv: list[str], env: dict[str, str]) -> Any:
        clock().sleep(self.rtt * self.round_trips)
        fleet, cluster = self.fleet, self.cluster
        node = fleet.node_class(fleet, cluster.job, cluster.attempt, self.rank)
        fleet.nodes[(cluster.attempt, self.rank)] = node
        node.start()
        fleet.started_at = clock().monotonic()
        return node


class FleetProvider(Provider, FaultInjection):
    """Capacity that is always there, run by stand-in nodes; faults (a notice, a node
    killed) on demand."""

    name = "sim"

    def __init__(self, fleet: Fleet, rtt: float = 0.0) -> None:
        self.fleet, self.rtt = fleet, rtt

    def dry_run(self, request: Any, job: str, attempt: int) -> list[dict[str, Any]]:
        return []

    def provision(self, request: Any, job: str, attempt: int) -> ClusterInfo:
        root = str(self.fleet.root)
        nodes = [
            NodeInfo(rank=r, host=host_name(r), address="127.0.0.1", root=root)
            for r in range(request.instance_count)
        ]
        self.fleet.provisioned_at = clock().monotonic()
        self.fleet.sizes[attempt] = request.instance_count
        return ClusterInfo(
            job=job,
            attempt=attempt,
            provider=self.name,
            instance_type=request.instance_type,
            nodes=nodes,
            master_port=29500,
            processes_per_host=1,
        )

    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        return FleetRunner(self.fleet, cluster, rank, self.rtt)

    def terminate(self, job: str, *, grace: float) -> None:
        for node in list(self.fleet.nodes.values()):
            if node.poll() is None:
                node.kill()

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        self.fleet.nodes[(cluster.attempt, rank)].kill()


def run_job(
    fleet: Fleet,
    nodes: int,
    *,
    provider: Provider,
    recorded_as: dict[str, Any] | None = None,
    printer: Any = None,
    act: Any = None,
    timeout: float = 900.0,
    **fields: Any,
) -> dict[str, Any]:
    """A job of `nodes` stand-in nodes under the real controller, its capacity `provider`;
    `fields`: more of the job's fields; `recorded_as`: fields the record gets after
    create_job, which would refuse them here (an EC2 instance type and its market:
    create_job's checks call AWS, which a replay has none of); `act(controller, result)`
    runs beside the controller; `timeout`: wall seconds. The record at the end, its
    events."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.submit import create_job
    from trainctl.record.jobstore import JobStore
    from trainctl.spec.build import build_spec
    from trainctl.spec.checks import RECORDED
    from trainctl.spec.job import JobSpec

    source = fleet.root / "src"
    source.mkdir(parents=True, exist_ok=True)
    (source / "train.py").write_text("print('simulated')\n")
    spec = build_spec(
        entry_point="train.py", source_dir=str(source), instance_count=nodes, **fields
    )
    record = create_job(spec, fleet.store)
    if recorded_as:
        updated = {**record.spec.model_dump(), **recorded_as}
        record.spec = JobSpec.model_validate(updated, context={RECORDED: True})
        JobStore(fleet.store, record.name).save(record)
    controller = Controller(fleet.store, record.name, printer=printer, provider=provider)
    result: dict[str, Any] = {"job": record.name}
    done = threading.Event()

    def control() -> None:
        try:
            result["final"] = controller.run()
        except BaseException as exc:  # (the simulated clock stopped, a bug): said below
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=control, name="controller", daemon=True).start()
    if act is not None:
        act(controller, result)
    with clock().away():
        done.wait(timeout=timeout)
    if not done.is_set():
        raise RuntimeError(f"job {record.name} did not end")
    if (error := result.pop("error", None)) is not None:
        raise RuntimeError(f"job {record.name}: its controller failed: {error}") from error
    result["events"] = controller.jobs.events()
    return result
