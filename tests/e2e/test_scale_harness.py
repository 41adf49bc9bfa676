"""The scale harness (bench/scale.py) as a functional test at N = 32: the real controller
and store code against simulated nodes. No timing is asserted: every node bootstraps, no
log line is lost or reordered, and a silenced node ends the attempt."""

from __future__ import annotations

import threading

import pytest

from bench.scale import HEARTBEAT_SECONDS, HEARTBEAT_TIMEOUT_SECONDS, Harness, clean_run, silent_run

NODES = 32


@pytest.fixture
def harness(home, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", str(HEARTBEAT_TIMEOUT_SECONDS))
    before = set(threading.enumerate())
    yield Harness(tmp_path / "scale", duration=6.0, lines_per_second=5.0, rtt=0.005)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread


@pytest.mark.timeout(120)
def test_every_node_bootstraps_and_no_line_is_lost(harness):
    result = clean_run(harness, NODES)
    assert result["clean_state"] == "Completed"
    assert result["started_nodes"] == NODES
    assert result["lines_sent"] >= NODES * 20
    assert result["lines_sent"] == result["lines_stored"] == result["lines_shown"]
    assert result["dropped"] == 0 and result["out_of_order"] == 0
    assert result["controller_requests"]["put_text"] > 0  # the counters see the traffic
    assert result["agent_requests"]["get_bytes"] > 0  # the lease reads (its notices)


@pytest.mark.timeout(120)
def test_a_silent_node_ends_the_attempt(harness):
    result = silent_run(harness, NODES)
    assert "no heartbeat" in result["cause"], result
    assert result["cause"].startswith(f"algo-{NODES // 2 + 1} lost")


@pytest.mark.timeout(120)
def test_the_controller_lives_by_a_faster_clock(home, tmp_path, monkeypatch):
    """What a spot-trace replay stands on (trainctl.clock): the real controller and 8
    simulated nodes under a simulated clock (VirtualClock). Two simulated minutes of training
    pass in seconds, and the record, its events and the lease count them as two minutes; a
    node gone silent is found after the heartbeat timeout in the clock's seconds."""
    import time

    from bench.scale import run_job
    from trainctl.clock import VirtualClock, clock, use_clock
    from trainctl.record.keys import parse_iso

    monkeypatch.setenv("TRAINCTL_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", str(HEARTBEAT_TIMEOUT_SECONDS))
    before = set(threading.enumerate())
    harness = Harness(tmp_path / "fast", duration=120.0, lines_per_second=0.5, rtt=0.005)
    with use_clock(VirtualClock()):
        wall = time.monotonic()
        done = run_job(harness, 8, [])
        wall = time.monotonic() - wall
        ahead = clock().time() - time.time()  # how far the simulated time ran ahead
        silent = silent_run(harness, 8)
    record = done["final"]
    assert record.state.value == "Completed"
    assert wall < 40, wall  # 120 s of training: only a simulated clock ends it this soon
    assert 115 <= record.duration_s <= 200, record.duration_s  # in the clock's seconds
    attempt = record.attempts[0]
    assert 115 <= parse_iso(attempt.ended_at) - parse_iso(attempt.started_at) <= 200
    last_event = done["events"][-1]["time"]
    assert parse_iso(last_event) > time.time() + 60 and ahead > 60  # events: simulated time
    assert "no heartbeat" in silent["cause"], silent
    # found after the timeout (5 simulated s), counted from the node's last heartbeat, which
    # may be up to one heartbeat before it went silent (and event times are to the ms)
    earliest = HEARTBEAT_TIMEOUT_SECONDS - HEARTBEAT_SECONDS - 0.001
    assert earliest <= silent["detect_s"] <= 4 * HEARTBEAT_TIMEOUT_SECONDS
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread


@pytest.mark.timeout(120)
def test_the_controller_follows_a_traces_capacity(home, tmp_path, monkeypatch):
    """A spot market that follows a trace (trainctl.replay.market) under the real controller,
    on a simulated clock: a 4-node elastic job loses 2 nodes when its zone drops to 2, goes
    on with 2 (no capacity for 4), grows back to 4 when the trace has them again, and is
    billed at the trace's spot price for the node-time it held."""
    from bench.scale import run_job
    from trainctl.clock import VirtualClock, use_clock
    from trainctl.replay.market import TraceMarket, TraceProvider
    from trainctl.spec.trace import parse_trace

    monkeypatch.setenv("TRAINCTL_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", str(HEARTBEAT_TIMEOUT_SECONDS))
    monkeypatch.setenv("TRAINCTL_ELASTIC_WAIT_SECONDS", "10")
    monkeypatch.setenv("TRAINCTL_ELASTIC_PROBE_SECONDS", "20")
    trace = parse_trace(
        {
            "name": "drop-and-back",
            "source": "made for this test",
            "instance_type": "p3.2xlarge",
            "pool_size": 4,
            "prices": {"spot_usd_per_hour": 1.0, "on_demand_usd_per_hour": 3.0, "source": "t"},
            "capacity": [
                {"zone": "z", "start_s": 0, "end_s": 40, "available": 4},
                {"zone": "z", "start_s": 40, "end_s": 100, "available": 2},
                {"zone": "z", "start_s": 100, "end_s": 100_000, "available": 4},
            ],
        }
    )
    before = set(threading.enumerate())
    harness = Harness(tmp_path / "trace", duration=120.0, lines_per_second=0.2, rtt=0.005)
    with use_clock(VirtualClock()):
        provider = TraceProvider(harness, TraceMarket(trace), notice_seconds=0)
        spot = {"instance_type": "p3.2xlarge", "use_spot_instances": True}
        done = run_job(harness, 4, [], provider=provider, min_instance_count=2, recorded_as=spot)
    record = done["final"]
    assert record.state.value == "Completed", [a.cause for a in record.attempts]
    sizes = [len(a.nodes) for a in record.attempts]
    assert sizes[0] == 4 and 2 in sizes and sizes[-1] == 4, sizes
    assert "spot capacity reclaimed: z has 2 of 4" in (record.attempts[0].cause or "")
    shrunk = next(a for a in record.attempts if len(a.nodes) == 2)
    assert shrunk.resized and shrunk.resized.startswith("shrunk to 2 of 4")
    billed = provider.usage(record.name)
    assert {u.usd_per_hour for u in billed} == {1.0} and all(u.ended for u in billed)
    node_seconds = sum(u.ended - u.started for u in billed)
    assert 4 * 30 < node_seconds < 4 * 400, node_seconds  # simulated seconds, not wall
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread


@pytest.mark.timeout(120)
def test_a_controller_held_up_does_not_take_its_delay_for_a_nodes_silence(harness, monkeypatch):
    """A store write that holds the controller past the heartbeat timeout (S3 retrying, a
    loaded machine): the nodes' lines kept arriving meanwhile, so no node is lost."""
    import time

    from bench.scale import run_job
    from trainctl.controller.telemetry import Telemetry

    monkeypatch.setenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", "3")
    save = Telemetry.save_progress
    held = []

    def slow_save(self) -> None:
        if not held and self.record.state.value == "Training":
            held.append(time.monotonic())
            time.sleep(5)  # past the 3 s timeout, with every node beating each second
        save(self)

    monkeypatch.setattr(Telemetry, "save_progress", slow_save)
    harness.reset()
    final = run_job(harness, 4, [])["final"]
    assert held, "the controller was never held up"
    assert final.state.value == "Completed", final.failure_reason
    assert len(final.attempts) == 1, [a.cause for a in final.attempts]


@pytest.mark.timeout(120)
def test_the_machine_watcher_survives_a_store_error_and_ends_with_its_attempt(harness, monkeypatch):
    """The controller's machine watcher (a thread) asks the provider which machines are gone.
    A store error while it records a loss must not end it (the node is marked; the watch acts
    on it), and once its attempt's watch has ended it records nothing: the instances leaving
    at teardown are not lost machines (a stray event, and a thread that outlived its job and
    died on a store that had gone)."""
    from bench.scale import run_job
    from trainctl.controller import watch as watch_module
    from trainctl.errors import StoreError
    from trainctl.record.jobstore import JobStore
    from trainctl.replay.fleet import FleetProvider

    class GoneAtTeardown(FleetProvider):
        """Attempt 1's rank 0 reclaimed once `reclaim` is set; an attempt's machines all gone
        once terminated."""

        def __init__(self, fleet) -> None:
            super().__init__(fleet, rtt=fleet.rtt)
            self.reclaim = threading.Event()
            self.provisioned: set[int] = set()
            self.terminated: set[int] = set()

        def provision(self, request, job: str, attempt: int):
            import time

            if attempt > 1:  # new capacity takes a while (EC2: minutes), past a watcher's wake
                time.sleep(3 * MACHINE_CHECK_SECONDS)
            self.provisioned.add(attempt)
            return super().provision(request, job, attempt)

        def terminate(self, job: str, *, grace: float) -> None:
            super().terminate(job, grace=grace)
            self.terminated |= self.provisioned

        def lost_nodes(self, cluster):
            if cluster.attempt in self.terminated:
                return {node.rank: "instance terminated" for node in cluster.nodes}
            reclaimed = cluster.attempt == 1 and self.reclaim.is_set()
            return {0: "spot reclaim"} if reclaimed else {}

    MACHINE_CHECK_SECONDS = 0.5
    monkeypatch.setattr(watch_module, "MACHINE_CHECK_SECONDS", MACHINE_CHECK_SECONDS)
    thread_errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_errors.append(args.exc_value))
    losses: list[tuple[int, int]] = []  # (attempt, rank) of each machine_lost written
    attempt_ended = threading.Event()
    event = JobStore.event

    def first_loss_not_stored(self, kind: str, **fields) -> None:
        if kind == "attempt_end":
            attempt_ended.set()
        if kind == "machine_lost":
            losses.append((fields["attempt"], fields["rank"]))
            if len(losses) == 1:
                raise StoreError("s3://bucket/events.jsonl: put failed (the store is unreachable)")
        event(self, kind, **fields)

    monkeypatch.setattr(JobStore, "event", first_loss_not_stored)
    harness.reset()
    provider = GoneAtTeardown(harness)

    def reclaim_then_stop(controller, result) -> None:
        import time

        while controller.record.state.value != "Training":
            time.sleep(0.05)
        provider.reclaim.set()
        attempt_ended.wait(60)
        controller.jobs.request_stop("test: the attempt ended")

    final = run_job(harness, 4, [], reclaim_then_stop, provider=provider)["final"]
    assert "spot reclaim" in (final.attempts[0].cause or ""), final.attempts[0].cause
    watchers = [t for t in threading.enumerate() if t.name == "machines"]
    for thread in watchers:
        thread.join(timeout=10)
        assert not thread.is_alive(), "the machine watcher outlived its attempt"
    assert thread_errors == [], thread_errors
    # rank 0's reclaim, once (its write failed); nothing for the machines of teardown
    assert losses == [(1, 0)], losses
