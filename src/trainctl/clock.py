"""The time the controller lives by: the wall clock, or a simulated one for a replay.

The controller (its attempt loop, capacity waits, lease, progress watch, billing and the
record's timestamps) reads time and waits only through `clock()`: `sleep`, and waits on the
clock's own queues and events (`clock().queue()`, `clock().event()`), whose timeouts are in
the clock's seconds. A process that replays a long job against a spot trace
(trainctl.replay: `trainctl estimate`, bench/spot.py) installs a `VirtualClock` with
`use_clock`, and the same controller code lives through days of simulated time in seconds.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import itertools
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any


class Clock:
    """The wall clock."""

    def time(self) -> float:
        """Seconds since the epoch (timestamps in records, leases, billing)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds for intervals and deadlines."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def queue(self) -> queue.Queue[Any]:
        """A queue whose `get(timeout=)` waits in this clock's seconds."""
        return queue.Queue()

    def event(self) -> threading.Event:
        """An event whose `wait(timeout)` waits in this clock's seconds."""
        return threading.Event()

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Time stands still in the block (the wall clock's does not: nothing to do)."""
        return contextlib.nullcontext()

    def hand(self, count: int) -> Callable[[], None]:
        """Time stands still until `count` pieces of work handed to threads outside the
        clock (a thread pool's) are taken up: each calls the function returned, first thing
        (the wall clock's does not: nothing to do)."""
        return _nothing

    def leave(self) -> None:
        """The calling thread is done with the clock's time until it next reads it or waits
        (a pool's worker whose work is done; the wall clock's: nothing to do)."""

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """The calling thread waits outside the clock in the block (a join, a plain event)
        for what threads that live by the clock do: time may move meanwhile."""
        self.leave()
        try:
            yield
        finally:
            self.monotonic()  # at work again

    def close(self) -> None:
        """Nothing to end (a simulated clock ends its driver)."""


def _nothing() -> None:
    return None


class _Waiter:
    """One thread's wait on a VirtualClock: until `deadline`, or until `ready()`."""

    __slots__ = ("deadline", "done", "parked", "queued", "ready", "released", "seq")

    def __init__(self, deadline: float, ready: Callable[[], bool], seq: int) -> None:
        self.deadline = deadline
        self.ready = ready
        self.seq = seq  # the order it began to wait in: who of those due together goes first
        # Held until its turn: the waiting thread blocks acquiring it (`_park`). A plain
        # lock, not an Event (a Condition, a lock and Python-level waits and notifies each
        # time: a fifth of a replay's CPU went to the clock's waits).
        self.parked = threading.Lock()
        self.parked.acquire()
        self.released = False
        self.done = False
        self.queued = False  # due or notified: in line to run

    def release(self) -> None:
        """Its turn (under the clock's lock; once)."""
        if not self.released:
            self.released = True
            self.parked.release()


def _park(parked: threading.Lock) -> None:
    """Wait for a turn (this function's frame tells a thread waiting here: `_BLOCKING_FRAMES`)."""
    parked.acquire()


class VirtualClock(Clock):
    """Simulated time that moves only while every thread that lives by it waits.

    A waiting thread (a `sleep`, a `get` on the clock's queue, a `wait` on its event) says
    until when. The clock jumps to the earliest deadline (rounded up to a multiple of
    `quantum`, so that waits due close together wake together) once every thread is
    waiting: no woken waiter is still to run, no thread that came out of a wait (or read the
    clock) has run in the last `blocked_after` wall seconds without waiting again, and
    nothing touched the clock for `settle` wall seconds. Work takes no simulated time: a
    replay puts what things cost (a boot, a checkpoint) in as sleeps, and a loaded machine
    changes how long a replay takes, not what it finds.

    The waits that end at one time (due then, or their queue or event notified) end one at
    a time, in the order they began, each once the one before waits again: the threads that
    live by the clock take turns, so the same replay runs the same way, whatever the
    machine's scheduler does (woken together, they raced: a controller that read a node's
    progress before or after the node wrote it decided differently, and a replay's figures
    moved from run to run). The thread whose turn ends hands the next turn on itself, and
    moves the clock where it may, while nothing else is at work (no other thread came out of
    a wait or read the clock without waiting again, none started or ended, nothing held):
    no wall time between turns; otherwise the driver does, once it sees every thread wait.

    `blocked_after` bounds how long a thread that came out of a wait counts as at work
    without touching the clock again: a busy machine may not schedule it for tens of
    milliseconds (the interpreter's switch interval is 5 ms), and time must not move under
    it. A thread blocked outside the clock (a thread pool's join, a plain lock or queue)
    is told apart at once by where it waits; one just released from such a wait looks
    blocked until it runs, so on a very busy machine time may move by one deadline under
    it. Bench code that hands work between threads outside the clock holds it (`hold`)
    until the work is taken.
    """

    IDLE_LOOK = 0.01  # wall seconds

    def __init__(
        self,
        *,
        epoch: float | None = None,
        quantum: float = 0.0,
        # (0.5 ms until the turns: a replay waited for it about 650 times, 0.4 of its 1.4
        # wall seconds; 0.1 ms, the same figures)
        settle: float = 0.0001,
        blocked_after: float = 2.0,
    ) -> None:
        self._epoch0 = time.time() if epoch is None else epoch
        self._now = 0.0
        self.quantum = quantum
        self.settle = settle
        self.blocked_after = blocked_after
        # thread -> when (wall) it last came out of a wait or read the clock
        self._running: dict[int, float] = {}
        self.advances = 0
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, _Waiter]] = []  # a heap of deadlines
        self._on: dict[int, set[_Waiter]] = {}  # id(queue or event) -> its waiters
        self._turns: collections.deque[_Waiter] = collections.deque()  # in line to run
        self._woken = 0  # waiters given their turn, not yet running
        self.handed_on = 0  # turns handed on by the thread whose turn ended (not the driver)
        # Set when a thread waited and could not hand on the next turn (others at work): the
        # driver looks every `settle` then, and every IDLE_LOOK otherwise (a thread that ends
        # or waits outside the clock after its turn says nothing).
        self._needed = threading.Event()
        self._holds = 0
        self._touched = 0
        self._ids = itertools.count()
        self._closed = False
        self._stopped: str | None = None  # why the driver failed
        self._driver: threading.Thread | None = None
        # Threads of the process before the clock (not its to wait for), and those it has
        # noticed since: a thread started under the clock is at work from its first sight
        # until it waits (a pump or a node just started, not yet scheduled on a busy machine,
        # had time move under it before it ever read the clock).
        # (Thread objects, kept: a thread's ident is reused by the next one started, which
        # a set of idents took for noticed; a relaunch ends an attempt's threads and starts
        # as many, and time moved under its new pumps and nodes: a replay's figures moved,
        # one run in ten at load 8.) The last of them and their number say, at a glance,
        # whether any started since the driver looked: threads are listed as they start.
        threads = threading.enumerate()
        self._noticed: set[threading.Thread] = set(threads)
        self._threads = len(threads)
        self._last_thread = threads[-1]

    # -- reading ---------------------------------------------------------------------------
    def _touch(self) -> None:
        self._touched += 1
        self._running[threading.get_ident()] = time.monotonic()

    def time(self) -> float:
        self._touch()
        return self._epoch0 + self._now

    def monotonic(self) -> float:
        self._touch()
        return self._now

    # -- waiting ---------------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        self.wait_until(self._now + max(0.0, seconds))

    def wait_until(
        self, deadline: float, ready: Callable[[], bool] | None = None, on: object = None
    ) -> bool:
        """Wait until `deadline` (clock seconds; inf: no deadline) or until `ready()`, which
        is checked when `on` (a queue or event of this clock) is notified; True if ready."""
        ready = ready or (lambda: False)
        if deadline != deadline:  # NaN: it would sort nowhere in the heap, and stop the clock
            raise ValueError("a wait on the simulated clock until NaN")
        with self._lock:
            if self._stopped is not None:
                raise RuntimeError(f"the simulated clock stopped: {self._stopped}")
            if self._closed or ready():
                return ready()
            if self._now >= deadline:
                return False
            self._start_driver()
            self._running.pop(threading.get_ident(), None)
            waiter = _Waiter(deadline, ready, next(self._ids))
            if deadline < math.inf:
                heapq.heappush(self._due, (deadline, waiter.seq, waiter))
            if on is not None:
                self._on.setdefault(id(on), set()).add(waiter)
            self._touched += 1
            if self._alone():
                self.handed_on += 1
                self._next_turn()
                self._needed.clear()
            else:
                self._needed.set()
        _park(waiter.parked)
        with self._lock:
            if self._stopped is not None:
                raise RuntimeError(f"the simulated clock stopped: {self._stopped}")
            waiter.done = True
            self._woken -= 1
            self._running[threading.get_ident()] = time.monotonic()  # at work until it waits
            if on is not None:
                waiters = self._on.get(id(on), set())
                waiters.discard(waiter)
                if not waiters:
                    self._on.pop(id(on), None)
            self._touched += 1
        return ready()

    def _wake(self, waiter: _Waiter) -> None:
        """In line for a turn (under the lock)."""
        if not waiter.queued and not waiter.done:
            waiter.queued = True
            self._turns.append(waiter)

    def notify(self, on: object) -> None:
        """`on` (a queue or event of this clock) changed: its waiters check again, in turn."""
        with self._lock:
            for waiter in sorted(self._on.get(id(on), ()), key=lambda w: w.seq):
                self._wake(waiter)
            self._touched += 1

    def _alone(self) -> bool:
        """Whether the thread about to wait is the only one at work (under the lock): no turn
        given and not yet taken, nothing held, no other thread out of a wait or started or
        ended since the driver looked. Then it may hand on the next turn itself."""
        return (
            not self._woken
            and not self._holds
            and not self._running
            and not self._threads_changed(threading.enumerate())
        )

    def _next_turn(self) -> bool:
        """The next waiter in line runs; none in line: the clock moves to the earliest
        deadline and those due then are in line (under the lock). False if nothing waits
        with a deadline or a turn."""
        if not self._turns:
            while self._due and (self._due[0][2].done or self._due[0][2].queued):
                heapq.heappop(self._due)
            if not self._due:
                return False
            deadline = self._due[0][0]
            if self.quantum:  # never short of the deadline by a rounding error
                deadline = max(deadline, math.ceil(deadline / self.quantum) * self.quantum)
            self._now = max(self._now, deadline)
            self.advances += 1
            while self._due and self._due[0][0] <= self._now:
                self._wake(heapq.heappop(self._due)[2])
        waiter = self._turns.popleft()
        waiter.release()
        self._woken += 1
        return True

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                self._touched += 1
                self._needed.set()

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Time stands still in the block: work handed to a thread outside the clock, until
        that thread takes it."""
        return self._holding()

    def leave(self) -> None:
        with self._lock:
            self._running.pop(threading.get_ident(), None)
            self._touched += 1
            self._needed.set()

    def hand(self, count: int) -> Callable[[], None]:
        """Held until each of `count` takers has called the function returned: a pool's
        worker not yet scheduled waits outside the clock, and time must not move before it
        runs (on a busy machine it did, by a quantum or more: a replay's figures moved)."""
        with self._lock:
            self._holds += count

        def taken() -> None:
            self._touch()  # at work from now: the driver sees it before the hold goes
            with self._lock:
                self._holds -= 1
                self._touched += 1
                self._needed.set()

        return taken

    def queue(self) -> queue.Queue[Any]:
        return _ClockQueue(self)

    def event(self) -> threading.Event:
        return _ClockEvent(self)

    # -- moving ----------------------------------------------------------------------------
    def _start_driver(self) -> None:
        if self._driver is None:  # (set once started: a start that failed is tried again)
            driver = threading.Thread(target=self._driving, name="virtual-clock", daemon=True)
            driver.start()
            self._driver = driver

    def _driving(self) -> None:
        """The driver; should it fail, every wait on the clock fails with its reason at once,
        rather than wait for a move that will never come (a replay that hung)."""
        try:
            self._drive()
        except BaseException as exc:
            with self._lock:
                self._stopped = f"{type(exc).__name__}: {exc}"
                self._release_all()
            raise

    def _drive(self) -> None:
        while True:
            self._needed.wait(self.IDLE_LOOK)
            seen = self._touched
            time.sleep(self.settle)
            with self._lock:
                if self._closed:
                    return
                if self._touched != seen or self._holds or self._woken:
                    continue
                if not (self._turns or self._due) or self._any_running():
                    continue
                self._next_turn()
                self._needed.set()  # its turn may end without a wait (a thread that ends)

    def _threads_changed(self, threads: list[threading.Thread]) -> bool:
        """Whether a thread started or ended since the driver last looked."""
        return len(threads) != self._threads or threads[-1] is not self._last_thread

    def _any_running(self) -> bool:
        """Whether a thread is at work: it came out of a wait (or read the clock) within
        blocked_after and has not waited again, and is not blocked outside the clock (in a
        lock, a join, a plain queue: its innermost Python frame says). Forgets the threads
        past blocked_after, and those that ended."""
        wall = time.monotonic()
        fresh: list[int | None] = []
        threads = threading.enumerate()
        if self._threads_changed(threads):
            self._threads = len(threads)
            self._last_thread = threads[-1]
            fresh = [t.ident for t in threads if t not in self._noticed]
            self._noticed.update(threads)
        frames = _frames() if fresh or self._running else {}
        for ident in fresh:
            frame = frames.get(ident)
            if frame is not None and not _blocked_outside(frame) and ident != threading.get_ident():
                self._running.setdefault(ident, wall)
        recent = []
        for ident, last in list(self._running.items()):
            if wall - last < self.blocked_after:
                recent.append(ident)
            else:
                self._running.pop(ident, None)
        if not recent:
            return False
        for ident in recent:
            frame = frames.get(ident)
            if frame is None:  # ended
                self._running.pop(ident, None)
            elif not _blocked_outside(frame):
                return True
        return False

    def _release_all(self) -> None:
        """Every waiter runs (under the lock)."""
        waiting = [w for _, _, w in self._due] + [w for ws in self._on.values() for w in ws]
        for waiter in waiting + list(self._turns):
            waiter.release()
        self._needed.set()

    def close(self) -> None:
        """End the driver and every wait (a replay is over)."""
        with self._lock:
            self._closed = True
            self._release_all()
        if self._driver is not None and self._driver is not threading.current_thread():
            self._driver.join()


# Where a thread waits outside the clock: a threading wait or join, a plain queue, a thread
# pool's idle worker (module file name, function).
_BLOCKING_FRAMES = frozenset(
    {
        ("threading.py", "wait"),
        ("threading.py", "_wait_for_tstate_lock"),
        ("threading.py", "join"),
        ("threading.py", "acquire"),
        ("queue.py", "get"),
        ("queue.py", "put"),
        ("thread.py", "_worker"),
        ("_base.py", "result"),
        ("clock.py", "_park"),  # a wait on this clock, for its turn
    }
)


def _frames() -> dict[int, Any]:
    """Each thread's innermost frame. Without the collector: sys._current_frames holds the
    interpreter's thread list while it builds its answer, and a collection there runs weakref
    callbacks that let another thread run; a thread being started then waits for that list
    with the GIL held, and neither moves (seen: a replay that never ended)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if collecting:
            gc.enable()


def _blocked_outside(frame: Any) -> bool:
    code = frame.f_code
    if (os.path.basename(code.co_filename), code.co_name) not in _BLOCKING_FRAMES:
        return False
    # A thread starting another waits (threading.py wait) for it to begin: momentary, and
    # what follows happens at this time, not the next.
    caller = frame.f_back
    while caller is not None and os.path.basename(caller.f_code.co_filename) == "threading.py":
        if caller.f_code.co_name == "start":
            return False
        caller = caller.f_back
    return True


class _ClockQueue(queue.Queue[Any]):
    """A queue whose get waits in a VirtualClock's seconds. Its puts and takes run here, not
    in queue.py, whose frames read as a thread blocked outside the clock (`_blocked_outside`):
    a thread caught in the middle of one had time move under it."""

    def __init__(self, virtual: VirtualClock) -> None:
        super().__init__()
        self._clock = virtual

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        with self.not_empty:  # (unbounded: never full) what Queue.put does
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()
        self._clock.notify(self)

    def _take(self) -> tuple[bool, Any]:
        with self.mutex:
            if not self._qsize():
                return False, None
            item = self._get()
            self.not_full.notify()
            return True, item

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        deadline = math.inf if timeout is None else self._clock.monotonic() + timeout
        while True:
            took, item = self._take()
            if took:
                return item
            if not block:
                raise queue.Empty
            if self._clock._closed:  # the replay is over: the wall clock's wait
                return super().get(block, None if timeout is None else 0)
            if not self._clock.wait_until(deadline, lambda: self.qsize() > 0, on=self):
                if self._clock.monotonic() >= deadline:
                    raise queue.Empty from None


class _ClockEvent(threading.Event):
    """An event whose wait waits in a VirtualClock's seconds."""

    def __init__(self, virtual: VirtualClock) -> None:
        super().__init__()
        self._clock = virtual

    def set(self) -> None:
        super().set()
        self._clock.notify(self)

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        deadline = math.inf if timeout is None else self._clock.monotonic() + timeout
        return self._clock.wait_until(deadline, self.is_set, on=self)


def pool_map(
    fn: Callable[[Any], Any], items: list[Any], workers: int, name: str
) -> list[Future[Any]]:
    """`fn` over `items`, `workers` at a time in a thread pool, waited for in the clock's
    time: each item's future, in order. A pool's threads wait outside the clock, so under a
    VirtualClock time would move while a worker is not yet scheduled or the caller not yet
    back from the pool's join; here it stands until each item is taken up, and moves again
    once the caller, woken by the last, is at work (the same replay, the same figures)."""
    from concurrent.futures import ThreadPoolExecutor

    taken = clock().hand(len(items))
    finished = clock().event()
    left = [len(items)]
    counting = threading.Lock()

    def one(item: Any) -> Any:
        taken()
        try:
            return fn(item)
        finally:
            with counting:
                left[0] -= 1
                last = left[0] == 0
            if last:
                finished.set()
            clock().leave()  # back to the pool's idle wait, outside the clock

    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix=name)
    try:
        futures = [pool.submit(one, item) for item in items]
        if items:
            finished.wait()
    finally:
        # Every item is done: the idle workers end on their own (a join would wait outside
        # the clock, and time move under the caller).
        pool.shutdown(wait=False)
    return futures


_WALL = Clock()
_current: Clock = _WALL
_lock = threading.Lock()


def clock() -> Clock:
    """The clock this process lives by (the wall clock unless a replay installed another)."""
    return _current


@contextlib.contextmanager
def use_clock(new: Clock) -> Iterator[Clock]:
    """Live by `new` for the block: every thread of this process, the controller's too; a
    simulated clock ends with the block."""
    global _current
    with _lock:
        before, _current = _current, new
    try:
        yield new
    finally:
        with _lock:
            _current = before
        new.close()
