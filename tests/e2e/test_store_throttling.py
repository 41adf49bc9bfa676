"""S3 throttling the job's prefix (503 SlowDown, what S3 answers past 3,500 PUT or 5,500 GET
a second per prefix): the nodes' and the controller's requests back off and are made again,
and the job goes on as if nothing happened. A real job on the local provider, its store a
moto S3 server behind the fault-injecting proxy (tests/rigs/faulty_s3.py)."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers import digits_estimator, log_lines, wait_no_leftovers
from tests.rigs.faulty_s3 import Rule, moto_s3

pytestmark = pytest.mark.e2e

EPOCHS = 6
# ~23 steps an epoch: ~12 s of training, so that an 8 s storm from the first checkpoint
# falls inside it (its last seconds may reach the end: the result and last log copy too)
HPS = {"epochs": EPOCHS, "lr": 0.1, "seed": 0, "checkpoint-every": 10, "step-delay": 0.08}
STORM_SECONDS = 8


@pytest.mark.timeout(240)
def test_a_slowdown_storm_loses_no_node_and_no_line(home, monkeypatch):
    """Every request to the job's prefix answered 503 SlowDown for 8 s while its 2 nodes
    train (their status writes, log copies, lease reads and checkpoint syncs; the
    controller's record and events): the job completes in its one attempt, no node counted
    lost, every line of each node's log stored once and in order."""
    with moto_s3(monkeypatch, faulty=True) as (_, bucket, proxy):
        assert proxy is not None
        monkeypatch.setenv("TRAINCTL_STORE", f"s3://{bucket}/store")
        job = digits_estimator(HPS).fit(wait=False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            attempts = job.describe()["attempts"]
            if attempts and attempts[0]["last_checkpoint_step"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no checkpoint: {job.describe()}")
        methods = ("GET", "PUT", "HEAD", "POST", "DELETE")
        storm = proxy.add(
            Rule(
                methods,
                rf"/jobs/{re.escape(job.name)}/",
                503,
                until=time.monotonic() + STORM_SECONDS,
            )
        )
        info = job.wait(timeout=180, raise_on_failure=False)
        logs = {
            rank: log_lines(job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log"))
            for rank in (0, 1)
        }
        events = job.events()
        # the job's controller ends its last writes (its teardown, after Completed) while its
        # store still answers: on a busy machine they came after the server was gone, and
        # their retries outlived the fixture's wait for the job's processes
        wait_no_leftovers(home=home)
    assert storm.failed >= 20, storm  # the store did refuse the job, many times
    assert info["state"] == "Completed", (info["state"], info["failure_reason"])
    assert [a["outcome"] for a in info["attempts"]] == ["completed"], info["attempts"]
    lost = [e for e in events if "lost" in e["type"] or "lost" in str(e.get("cause", ""))]
    assert lost == [], lost
    # rank 0 says each epoch once, in order; both nodes' logs end with their agent's last word
    epochs = [line for line in logs[0] if re.match(r"epoch \d+/\d+ loss=", line)]
    assert [line.split()[1] for line in epochs] == [f"{k}/{EPOCHS}" for k in range(1, 7)], epochs
    assert any("test_accuracy=" in line for line in logs[0]), logs[0][-20:]
    for rank, lines in logs.items():
        assert any(f"rank {rank}/2 on" in line for line in lines), lines[:20]
