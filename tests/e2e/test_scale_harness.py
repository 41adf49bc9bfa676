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
    assert result["agent_requests"]["exists"] > 0  # the notice polls


@pytest.mark.timeout(120)
def test_a_silent_node_ends_the_attempt(harness):
    result = silent_run(harness, NODES)
    assert "no heartbeat" in result["cause"], result
    assert result["cause"].startswith(f"algo-{NODES // 2 + 1} lost")
