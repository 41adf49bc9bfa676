"""trainctl.clock: the VirtualClock moves only while every thread that lives by it waits,
and its queue and event wait in its seconds."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from trainctl.clock import Clock, VirtualClock, clock, pool_map, use_clock


def _threads_then_join(*targets):
    """Run `targets` in threads that all live by the clock before any of its time passes:
    each waits on the clock's event `go` (a wait the clock knows), which is set once they
    all do."""
    virtual = clock()
    assert isinstance(virtual, VirtualClock)
    go = virtual.event()

    def started(target):
        def run():
            go.wait()
            target()

        return run

    threads = [threading.Thread(target=started(t)) for t in targets]
    for t in threads:
        t.start()
    while len(virtual._on.get(id(go), ())) < len(threads):
        time.sleep(0.001)
    go.set()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive()


@pytest.mark.timeout(30)
def test_sleeps_wake_in_order_at_their_deadlines_and_take_no_wall_time():
    woke: list[tuple[str, float]] = []
    began = time.monotonic()
    with use_clock(VirtualClock()) as virtual:

        def sleeper(name: str, seconds: float) -> None:
            clock().sleep(seconds)
            woke.append((name, clock().monotonic()))

        _threads_then_join(
            lambda: sleeper("day", 86400), lambda: sleeper("hour", 3600), lambda: sleeper("s", 1)
        )
        assert virtual.time() == pytest.approx(virtual._epoch0 + 86400)
    assert woke == [("s", 1.0), ("hour", 3600.0), ("day", 86400.0)]
    assert time.monotonic() - began < 10  # a simulated day, not a real one
    assert clock() is not virtual and isinstance(clock(), Clock)


@pytest.mark.timeout(30)
def test_a_quantum_wakes_waits_due_close_together_at_once():
    woke: list[float] = []
    with use_clock(VirtualClock(quantum=10.0)):

        def sleeper(seconds: float) -> None:
            clock().sleep(seconds)
            woke.append(clock().monotonic())

        _threads_then_join(lambda: sleeper(1.0), lambda: sleeper(7.5), lambda: sleeper(12.0))
    assert woke == [10.0, 10.0, 20.0]


@pytest.mark.timeout(30)
def test_the_clocks_queue_and_event_wait_in_simulated_seconds():
    got: dict[str, object] = {}
    with use_clock(VirtualClock()):
        lines = clock().queue()
        stop = clock().event()

        def consumer() -> None:
            try:
                lines.get(timeout=5.0)
            except queue.Empty:
                got["empty_at"] = clock().monotonic()
            got["item"] = lines.get(timeout=100.0)
            got["item_at"] = clock().monotonic()
            got["set"] = stop.wait(1000.0)
            got["set_at"] = clock().monotonic()
            got["unset"] = stop.wait(0) and not stop.is_set()

        def producer() -> None:
            clock().sleep(30.0)
            lines.put("line")
            clock().sleep(60.0)
            stop.set()

        _threads_then_join(consumer, producer)
    assert got["empty_at"] == 5.0  # the timeout, in the clock's seconds
    assert (got["item"], got["item_at"]) == ("line", 30.0)
    assert (got["set"], got["set_at"]) == (True, 90.0)


@pytest.mark.timeout(30)
def test_time_stands_while_held_and_while_a_thread_works():
    """A thread at work (it came out of a wait and has not waited again) holds the clock:
    its peer's deadline does not pass under it."""
    seen: dict[str, float] = {}
    with use_clock(VirtualClock()) as virtual:

        def worker() -> None:
            clock().sleep(1.0)
            began = clock().monotonic()
            time.sleep(0.005)  # work: no simulated time passes
            seen["worked"] = clock().monotonic() - began
            with virtual.hold():
                time.sleep(0.1)  # work handed elsewhere, held
                seen["held"] = clock().monotonic() - began

        def sleeper() -> None:
            clock().sleep(2.0)

        _threads_then_join(worker, sleeper)
    assert seen == {"worked": 0.0, "held": 0.0}


@pytest.mark.timeout(30)
def test_work_in_a_pool_and_a_thread_just_started_hold_the_clock():
    """A pool's workers and a new thread wait outside the clock before they run: time does
    not move under them (it did, on a busy machine, and a replay's figures moved with it)."""
    seen: dict[str, float] = {}
    with use_clock(VirtualClock(quantum=30)):

        def item(n: int) -> float:
            time.sleep(0.02)  # work before the clock is read: no simulated time passes
            clock().sleep(n)
            return clock().monotonic()

        def starter() -> None:
            clock().sleep(30)
            ends = [f.result() for f in pool_map(item, [0, 10, 40], 2, "item")]
            seen["items"] = ends  # type: ignore[assignment]
            seen["back"] = clock().monotonic()  # the caller, back at once after the last
            fresh = threading.Thread(target=lambda: (time.sleep(0.05), seen.update(
                fresh=clock().monotonic())))  # fmt: skip
            fresh.start()
            fresh.join()

        def ticker() -> None:
            for _ in range(10):
                clock().sleep(30)  # a peer that wants time to move all along

        _threads_then_join(starter, ticker)
    assert seen["items"] == [30.0, 60.0, 90.0]
    assert seen["back"] == 90.0 and seen["fresh"] == 90.0


def test_a_thread_started_in_place_of_one_that_ended_is_at_work_until_it_waits():
    """A thread takes the ident of one that ended (a relaunch ends an attempt's threads and
    starts as many): it is a new thread all the same, and time stands while it works (the
    clock knew threads by ident, took it for the old one, and moved under it)."""
    gate = threading.Event()
    before = threading.Thread(target=gate.wait)
    before.start()
    virtual = VirtualClock()
    gate.set()
    before.join()
    read: list[float] = []

    def work() -> None:
        until = time.monotonic() + 0.3
        while time.monotonic() < until:  # work that reads no clock, then the clock
            pass
        read.append(virtual.monotonic())

    with use_clock(virtual):
        worker = threading.Thread(target=work)
        worker.start()
        virtual.sleep(10)
        worker.join()
    assert read == [0.0]


@pytest.mark.timeout(60)
def test_a_thread_first_seen_waiting_for_its_turn_does_not_hold_the_clock():
    """A thread the driver first sees already parked in a wait on the clock is not at work:
    time moves at once, not after `blocked_after` (its wait's frame says where it is)."""
    virtual = VirtualClock(blocked_after=30.0)
    with use_clock(virtual):
        with virtual.hold():  # the driver looks only once the new thread waits
            sleeper = threading.Thread(target=lambda: virtual.sleep(10))
            sleeper.start()
            while _waiting(virtual) < 1:
                time.sleep(0.001)
        began = time.monotonic()
        virtual.sleep(20)
        took = time.monotonic() - began
        sleeper.join()
    assert took < 10  # (30 s, held by a thread taken for one at work)


def _waiting(virtual: VirtualClock) -> int:
    with virtual._lock:
        waiters = {id(w) for _, _, w in virtual._due} | {
            id(w) for ws in virtual._on.values() for w in ws
        }
        return len(waiters)


def _started_in_order(virtual: VirtualClock, *targets) -> list[threading.Thread]:
    """Threads for `targets`, each started once the one before waits on the clock (so the
    order they begin to wait in is theirs), time held until all do."""
    threads = []
    with virtual.hold():
        for target in targets:
            threads.append(threading.Thread(target=target))
            threads[-1].start()
            while _waiting(virtual) < len(threads):
                time.sleep(0.001)
    return threads


@pytest.mark.timeout(30)
def test_waits_that_end_together_take_turns_in_the_order_they_began():
    """Threads due at one time run one at a time, each until it waits again, in the order
    their waits began: the same every run, however the machine schedules them (woken
    together, they raced, and a replay's figures moved from run to run)."""
    seen: list[tuple[str, str, float]] = []
    with use_clock(VirtualClock()) as virtual:

        def sleeper(name: str):
            def run() -> None:
                for _ in range(3):
                    clock().sleep(10)
                    seen.append(("in", name, clock().monotonic()))
                    time.sleep(0.002)  # work: no other thread of the clock runs meanwhile
                    seen.append(("out", name, clock().monotonic()))

            return run

        threads = _started_in_order(virtual, *(sleeper(name) for name in "abcd"))
        for thread in threads:
            thread.join(timeout=20)
    assert seen == [
        (step, name, at) for at in (10.0, 20.0, 30.0) for name in "abcd" for step in ("in", "out")
    ]
    assert virtual.advances == 3 and virtual.handed_on >= 8  # turns passed on without a wait


@pytest.mark.timeout(30)
def test_waiters_of_one_event_or_queue_take_turns_in_the_order_they_began():
    seen: list[str] = []
    with use_clock(VirtualClock()) as virtual:
        ready, lines = virtual.event(), virtual.queue()

        def waiter(name: str):
            def run() -> None:
                ready.wait(60)
                seen.append(f"{name} in")
                time.sleep(0.002)
                seen.append(f"{name} out")
                seen.append(f"{name} took {lines.get(timeout=60)}")

            return run

        def setter() -> None:
            clock().sleep(5)
            lines.put("first")
            lines.put("second")
            ready.set()

        threads = _started_in_order(virtual, waiter("a"), waiter("b"), setter)
        for thread in threads:
            thread.join(timeout=20)
    assert seen == ["a in", "a out", "a took first", "b in", "b out", "b took second"]


@pytest.mark.timeout(30)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_driver_that_fails_fails_every_wait_at_once(monkeypatch):
    """Should the driver fail, the threads waiting on it hear why at once, and so does a
    thread that waits after: never a replay that hangs."""
    failures: list[str] = []
    with use_clock(VirtualClock()) as virtual:
        monkeypatch.setattr(virtual, "_any_running", lambda: 1 / 0)

        def sleeper() -> None:
            try:
                clock().sleep(10)
            except RuntimeError as exc:
                failures.append(str(exc))

        threads = _started_in_order(virtual, sleeper, sleeper)
        for thread in threads:
            thread.join(timeout=20)
        with pytest.raises(RuntimeError, match="stopped: ZeroDivisionError"):
            clock().sleep(1)
    assert failures == ["the simulated clock stopped: ZeroDivisionError: division by zero"] * 2
    with pytest.raises(ValueError, match="NaN"), use_clock(VirtualClock()):
        clock().wait_until(float("nan"))


@pytest.mark.timeout(30)
def test_the_wall_clock_is_the_default_and_its_waits_are_plain():
    assert type(clock()) is Clock
    assert type(clock().queue()) is queue.Queue
    assert type(clock().event()) is threading.Event
    began = time.monotonic()
    with pytest.raises(queue.Empty):
        clock().queue().get(timeout=0.05)
    assert time.monotonic() - began >= 0.05
    assert [f.result() for f in pool_map(lambda n: n * 2, [1, 2], 2, "t")] == [2, 4]
