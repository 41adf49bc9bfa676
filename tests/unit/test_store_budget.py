"""What a node asks of the store, and how often (issue: supervision at 1,024+ nodes within
the store's limits): the settings' pacing by job size, the controller's notices carried in
the lease the nodes read anyway, a status written when it changes, and a follower that does
not take the store's refusals for the node's silence."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from trainctl.controller.lease import Lease
from trainctl.errors import StoreError
from trainctl.node.output import NodeStatus
from trainctl.record.jobstore import EVERY_NODE, NOTICES, lease_notice
from trainctl.record.keys import JobKeys
from trainctl.spec.settings import JOB_REQUESTS_PER_SECOND, Settings, paced
from trainctl.store import LocalStore
from trainctl.transport.store import StoreFollower


@pytest.fixture
def defaults(monkeypatch) -> Settings:
    """The settings a user has (the suite's conftest sets test-paced ones)."""
    for name in ("CONTROL_POLL_SECONDS", "LOG_SYNC_SECONDS", "HEARTBEAT_SECONDS"):
        monkeypatch.delenv(f"TRAINCTL_{name}", raising=False)
    monkeypatch.delenv("TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS", raising=False)
    return Settings()


def test_defaults_keep_a_node_under_1000_requests_an_hour(defaults):
    """At the defaults a node makes, an hour: a lease read every 10 s, a log copy every
    10 s (when its log grew) and a status write every 20 s: 900, whatever the job's size
    up to the pacing's bound."""
    settings = defaults
    for nodes in (1, 64, 1024, 2048):
        per_hour = 3600 * (
            1 / settings.control_seconds(nodes)
            + 1 / settings.log_ship_seconds(nodes)
            + 1 / settings.status_seconds(nodes)
        )
        assert per_hour == pytest.approx(900), nodes


def test_a_huge_job_is_paced_to_the_prefix_rate(defaults):
    """Past 5,000 nodes each periodic request is spaced so that the whole job makes at most
    JOB_REQUESTS_PER_SECOND of it: S3's per-prefix rate is the job's, not the node's."""
    assert paced(10.0, 2048) == 10.0
    assert paced(10.0, 65_536) == pytest.approx(65_536 / JOB_REQUESTS_PER_SECOND)
    settings = defaults
    for interval in (settings.control_seconds, settings.log_ship_seconds, settings.status_seconds):
        assert 65_536 / interval(65_536) <= JOB_REQUESTS_PER_SECOND + 1e-9
    # the status stays within a third of the time after which a follower counts a node lost
    short = Settings(heartbeat_seconds=1, heartbeat_timeout_seconds=6)
    assert short.status_seconds(8) == 2.0


def test_a_lease_notice_names_its_attempt_and_its_nodes():
    lease = {NOTICES: {"attempt": 2, "ranks": {"1": "injected fault notice:1@3"}}}
    assert lease_notice(lease, 2, 1) == "injected fault notice:1@3"
    assert lease_notice(lease, 2, 0) is None
    assert lease_notice(lease, 1, 1) is None  # an earlier attempt's nodes are not told
    every = {NOTICES: {"attempt": 3, "ranks": {EVERY_NODE: "relaunch by choice"}}}
    assert lease_notice(every, 3, 4095) == "relaunch by choice"
    for odd in (None, {}, {NOTICES: "x"}, {NOTICES: {"attempt": 3, "ranks": [1]}}, []):
        assert lease_notice(odd, 3, 0) is None  # type: ignore[arg-type]


def test_a_published_notice_is_in_the_lease_at_once_and_in_every_renewal(tmp_path: Path):
    store = LocalStore(tmp_path)
    key = JobKeys("j").lease
    lease = Lease(store, key, seconds=0.3, what="job 'j'")
    lease.acquire()
    try:
        lease.publish(**{NOTICES: {"attempt": 1, "ranks": {"0": "why"}}})
        assert lease_notice(json.loads(store.get_text(key)), 1, 0) == "why"
        first = json.loads(store.get_text(key))["renewed_at"]
        deadline = time.monotonic() + 5
        while json.loads(store.get_text(key))["renewed_at"] == first:
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.05)
        assert lease_notice(json.loads(store.get_text(key)), 1, 0) == "why"
        assert not lease.lost.is_set()
    finally:
        lease.release()


def test_a_status_is_written_for_a_change_not_for_a_step():
    status = NodeStatus(0)
    status.written(status.snapshot())
    status.observe({"event": "step", "step": 5})
    assert not status.changed()  # a step alone waits for the refresh
    status.observe({"event": "checkpoint", "step": 10})
    assert status.changed()
    status.written(status.snapshot())
    status.observe({"event": "notice"})
    assert status.changed()


class RefusingStore(LocalStore):
    """A local store that answers every read with S3's SlowDown while `refusing` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.refusing = threading.Event()

    def get_bytes(self, key: str) -> bytes:
        if self.refusing.is_set():
            raise StoreError(f"{key}: 503 SlowDown (Please reduce your request rate.)")
        return super().get_bytes(key)

    def get_range(self, key: str, start: int) -> bytes:
        if self.refusing.is_set():
            raise StoreError(f"{key}: 503 SlowDown")
        return super().get_range(key, start)


def test_a_follower_does_not_count_the_stores_refusals_as_the_nodes_silence(tmp_path: Path):
    """A controller following a node through the store (a takeover): while S3 throttles the
    job's prefix the node's status writes are refused too, so its status goes stale; the
    node is counted lost only after `lost_after` of silence once the store answers again."""
    store = RefusingStore(tmp_path)
    keys = JobKeys("j")
    status_key = keys.node_status(1, 0)

    def beat() -> None:
        store.put_text(status_key, json.dumps({"rank": 0, "time": time.time()}))

    beat()
    follower = StoreFollower(store, "j", 1, 0, lost_after=0.6, poll_interval=0.05)
    lines = follower.lines()
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in lines:
            seen.append(line)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    store.refusing.set()  # 1.5 s of refusals: 2.5x lost_after, the node's status stale
    time.sleep(1.5)
    store.refusing.clear()
    time.sleep(0.3)  # answering again, and the node beats within lost_after
    beat()
    time.sleep(0.3)
    assert not done.is_set(), seen  # not lost: the silence was the store's
    # a node that stays silent once the store answers is lost, after lost_after
    assert done.wait(3), seen
    assert "counting the node as lost" in seen[-1], seen
    assert follower.poll() is not None
