"""The checkpoint interval's policy: Young/Daly from the job's rate of interruptions that lose
work (trainctl.train.interval), and the history the controller reads it from."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from trainctl.cluster import ClusterInfo, NodeInfo
from trainctl.controller.checkpoint_policy import checkpoint_policy, interruption_history
from trainctl.record.models import Attempt, AttemptNode, JobRecord
from trainctl.spec.job import JobSpec
from trainctl.train.interval import (
    ASSUMED_SAVE_SECONDS,
    FAILURES_PER_NODE_HOUR,
    SPOT_RECLAIMS_PER_NODE_HOUR,
    CheckpointPolicy,
    policy_for,
    young_daly_seconds,
)


def test_young_daly_is_sqrt_2_c_mtbf() -> None:
    assert young_daly_seconds(5.0, 1.0) == pytest.approx(math.sqrt(2 * 5 * 3600))
    assert young_daly_seconds(5.0, 0.0) == math.inf  # nothing ever lost: never worth a save


def test_without_history_the_markets_assumed_rates() -> None:
    spot = policy_for([], nodes=64, spot=True)
    assert spot.lossy_per_node_hour_saved == pytest.approx(FAILURES_PER_NODE_HOUR)
    assert spot.lossy_per_node_hour_unsaved == pytest.approx(
        FAILURES_PER_NODE_HOUR + SPOT_RECLAIMS_PER_NODE_HOUR
    )
    assert spot.source == "assumed for spot capacity"
    own = policy_for([], nodes=2, spot=False)  # on demand, or machines of one's own
    assert own.lossy_per_node_hour_unsaved == pytest.approx(FAILURES_PER_NODE_HOUR)
    # 64 nodes, a 5-s save, a script that saves at notices: about 106 minutes (what
    # trainctl estimate prints for the README's example)
    minutes = spot.interval_seconds(5.0, saves_at_notice=True) / 60
    assert 105 < minutes < 107
    # without a PreemptionFlag every reclaim loses work: a shorter interval
    assert spot.interval_seconds(5.0, saves_at_notice=False) < 30 * 60


def test_a_history_of_lost_work_shortens_the_interval_and_a_quiet_one_lengthens_it() -> None:
    assumed = policy_for([], nodes=8, spot=True)
    lossy = policy_for([(40.0, True), (40.0, True), (16.0, False)], nodes=8, spot=True)
    # (2 + 1) / (96 + 1 / rate): the job's own figure dominates once it has 2 of its own
    assert lossy.lossy_per_node_hour_saved == pytest.approx(3 / (96 + 1 / FAILURES_PER_NODE_HOUR))
    assert lossy.lossy_per_node_hour_saved > assumed.lossy_per_node_hour_saved
    quiet = policy_for([(50_000.0, False)], nodes=8, spot=True)
    assert quiet.lossy_per_node_hour_saved < assumed.lossy_per_node_hour_saved
    assert "2 interruption(s) that lost work in 96.0 node-hours" in lossy.source
    a, b = (p.interval_seconds(5.0, saves_at_notice=True) for p in (lossy, quiet))
    assert a < assumed.interval_seconds(5.0, saves_at_notice=True) < b


def test_the_interval_takes_the_nodes_own_save_and_never_outruns_a_write() -> None:
    policy = CheckpointPolicy(4, 0.01, 0.02, "t")
    assert policy.interval_seconds(None, saves_at_notice=True) == pytest.approx(
        young_daly_seconds(ASSUMED_SAVE_SECONDS, 0.04)
    )
    assert policy.interval_seconds(0.2, saves_at_notice=True) == pytest.approx(
        young_daly_seconds(0.2, 0.04)
    )
    assert policy.interval_seconds(0.2, saves_at_notice=True, write_seconds=1e6) == 1e6


@pytest.mark.parametrize(
    "value", ["", "not json", "[]", '{"nodes": "x"}', '{"nodes": 2}', "null", '"text"']
)
def test_a_policy_the_node_cannot_read_is_none(value: str) -> None:
    assert CheckpointPolicy.from_env(value) is None


def test_a_policy_goes_through_the_environment_whole() -> None:
    policy = policy_for([(3.0, True)], nodes=3, spot=True)
    assert CheckpointPolicy.from_env(policy.to_env()) == policy


def _attempt(number: int, hours: float, **fields) -> Attempt:
    nodes = [AttemptNode(rank=r, host=f"h{r}", address="127.0.0.1") for r in range(2)]
    started = 1_800_000_000 + number * 100_000
    iso = "%Y-%m-%dT%H:%M:%SZ"
    return Attempt(
        number=number,
        started_at=time.strftime(iso, time.gmtime(started)),
        ended_at=time.strftime(iso, time.gmtime(started + hours * 3600)),
        nodes=nodes,
        **fields,
    )


def test_the_controller_reads_which_interruptions_lost_work(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    record = JobRecord(
        name="j",
        spec=JobSpec(entry_point="train.py", source_dir=str(tmp_path)),
        store_uri="file:///s",
        source_uri="file:///s",
        source_sha256="0" * 64,
        owner="u",
        trainctl_version="0",
        created_at="2026-12-03T00:00:00Z",
        updated_at="2026-12-03T00:00:00Z",
    )
    record.attempts = [
        # saved at its notice: the next one resumed where it stopped
        _attempt(1, 1.0, outcome="interrupted", last_step=50, steps_lost=0),
        # not yet settled by a next attempt: 20 steps past its last checkpoint
        _attempt(2, 2.0, outcome="interrupted", last_step=90, last_checkpoint_step=70),
        # a failure of the script is no interruption
        _attempt(3, 0.5, outcome="failed", last_step=95, last_checkpoint_step=90),
        Attempt(number=4, started_at="2026-12-03T00:00:00Z"),  # running: not counted
    ]
    assert interruption_history(record) == [(2.0, False), (4.0, True), (1.0, False)]
    nodes = [NodeInfo(rank=r, host=f"h{r}", address="127.0.0.1", root="/") for r in range(3)]
    cluster = ClusterInfo(
        job="j", attempt=4, provider="aws", instance_type="p3.2xlarge", nodes=nodes,
        master_port=29500, processes_per_host=1, market="on-demand",
    )  # fmt: skip
    policy = checkpoint_policy(record, cluster)
    assert policy.nodes == 3
    assert policy.lossy_per_node_hour_unsaved == policy.lossy_per_node_hour_saved  # on demand
    assert policy.lossy_per_node_hour_saved == pytest.approx(2 / (7.0 + 1 / FAILURES_PER_NODE_HOUR))
