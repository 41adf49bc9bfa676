"""A local node's process (transport.local) says it ended while another thread waits for it:
the machine watch must not take an agent that ended well, not yet reaped, for a killed
node (a finished attempt relaunched, once in a loaded full suite)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from trainctl.transport.local import LocalProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.mark.parametrize(("code", "expected"), [("0", 0), ("3", 3)])
def test_poll_sees_the_end_while_another_thread_waits(tmp_path, code, expected):
    gate = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\n"
        f"sys.exit({code})\n"
    )
    proc = LocalProcess([sys.executable, "-c", script], env={}, cwd=tmp_path)
    # What the controller's main thread does at the end of a node's output: wait for it,
    # holding the lock that Popen.poll needs. (Held here by hand: a real waiter reaps the
    # process at once, and the window is the time between its exit and that.)
    lock = proc._proc._waitpid_lock
    lock.acquire()
    try:
        assert proc.poll() is None  # running
        gate.write_text("")
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() == expected
    finally:
        lock.release()
    assert proc.wait(5) == expected  # the waiter still reaps it, with its code
    assert list(proc.lines()) == []  # (its output read to the end: the pipes closed)


def test_poll_after_another_thread_reaped_it(tmp_path):
    proc = LocalProcess([sys.executable, "-c", "pass"], env={}, cwd=tmp_path)
    waiter = threading.Thread(target=proc.wait)
    waiter.start()
    waiter.join(10)
    assert proc.poll() == 0
    assert list(proc.lines()) == []


def test_a_notice_reaches_the_agent_and_the_pipe_closes_with_it(tmp_path):
    """tell() writes a line the agent reads at once; once its output ends and it is reaped,
    the pipe is closed (left to the garbage collector it warned, an unclosed file, in the
    user's process: seen in a SageMaker-style test that records warnings)."""
    script = "import sys\nprint('heard', sys.stdin.readline().strip(), flush=True)\n"
    proc = LocalProcess([sys.executable, "-c", script], env={}, cwd=tmp_path)
    assert proc.tell("notice 1")
    assert list(proc.lines()) == ["heard notice 1"]
    assert proc.wait(10) == 0
    assert proc._proc.stdin is not None and proc._proc.stdin.closed
    assert not proc.tell("too late")  # an ended agent: the lease is the channel
