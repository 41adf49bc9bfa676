"""What an attempt's nodes are told about interruptions, for their checkpoint interval
(trainctl.train.interval: the controller knows the job's rate, the nodes their saves)."""

from __future__ import annotations

from trainctl.cluster import ClusterInfo
from trainctl.record.models import JobRecord
from trainctl.train.interval import CheckpointPolicy, policy_for


def interruption_history(record: JobRecord) -> list[tuple[float, bool]]:
    """Each ended attempt's node-hours, and whether an interruption ended it losing work:
    steps trained past its last checkpoint (what the next attempt redid, once it is known)."""
    history = []
    for attempt in record.attempts:
        if not attempt.ended_at:
            continue
        if attempt.steps_lost is not None:
            lost = attempt.steps_lost
        else:
            saved = max(attempt.last_checkpoint_step or 0, attempt.resumed_from_step or 0)
            lost = max(0, (attempt.last_step or 0) - saved)
        history.append((attempt.node_hours(), attempt.outcome == "interrupted" and lost > 0))
    return history


def checkpoint_policy(record: JobRecord, cluster: ClusterInfo) -> CheckpointPolicy:
    """The policy for `cluster`'s attempt: its size, its market, the job's history."""
    return policy_for(
        interruption_history(record), nodes=len(cluster.nodes), spot=cluster.market == "spot"
    )
