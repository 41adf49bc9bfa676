"""Taking over the unfinished attempt of a controller that died, knowing what it knew.

What the store says is reconciled before anything is watched: the attempt's cluster (none:
the controller died before it started nodes), each node followed through the store rather
than a process of this one (its logs from where this process had printed them, its
heartbeats, its result), and the progress the dead controller had counted but not saved.
What the dead controller had decided is in the record as it decided it, and inherited: the
faults that fired (controller.faults: never fired again), the nodes it had counted lost
(lost at once, not after their silence; AttemptNode.lost), and whether the nodes stored
state (their statuses: a relaunch by choice resumes from it).
"""

from __future__ import annotations

from collections.abc import Callable

from trainctl.cluster import ClusterInfo
from trainctl.controller.attempts import count_step
from trainctl.errors import NotFoundError
from trainctl.provisioning.base import FaultInjection, Provider
from trainctl.record.jobstore import JobStore
from trainctl.record.models import Attempt
from trainctl.spec.settings import Settings
from trainctl.store import Store
from trainctl.transport.store import StoreFollower

STOPPED = "stopped by the controller"


def adopt_attempt(
    store: Store,
    jobs: JobStore,
    current: Attempt,
    provider: Provider,
    settings: Settings,
    log_offsets: dict[tuple[int, int], int],
    *,
    notify: Callable[[int, list[int], str], None],
) -> tuple[ClusterInfo, dict[int, StoreFollower]] | None:
    """The attempt's cluster and a follower per node; None when none is left to adopt
    (no node was started, or every one is gone). `notify(attempt, ranks, why)`: how the
    controller relays a notice (a stop reaches an adopted node so)."""
    try:
        cluster = ClusterInfo.model_validate_json(store.get_text(jobs.keys.cluster(current.number)))
    except NotFoundError:  # it died before its nodes were started
        return None
    killer = provider if isinstance(provider, FaultInjection) else None
    counted_lost = {node.rank: node.lost for node in current.nodes if node.lost}
    followers: dict[int, StoreFollower] = {
        node.rank: StoreFollower(
            store,
            jobs.name,
            cluster.attempt,
            node.rank,
            lost_after=settings.heartbeat_timeout_seconds,
            kill=(lambda rank=node.rank: killer.kill_node(cluster, rank)) if killer else None,
            notify=lambda rank=node.rank: notify(cluster.attempt, [rank], STOPPED),
            log_offset=log_offsets.get((cluster.attempt, node.rank), 0),
            lost=counted_lost.get(node.rank),
        )
        for node in cluster.nodes
    }
    states = {rank: follower.state() for rank, follower in followers.items()}
    for follower in followers.values():  # the progress the dead controller had not saved
        status = follower.status() or {}
        if isinstance(status.get("step"), int):
            count_step(current, "step", status["step"])
        if isinstance(status.get("checkpoint"), int):
            count_step(current, "checkpoint", status["checkpoint"])
    if all(state == "gone" for state in states.values()):
        return None
    return cluster, followers


def went_with_the_controller(followers: dict[int, StoreFollower]) -> bool:
    """Whether the adopted nodes had gone with the dead controller: their last heartbeats
    were still fresh at adoption, but none beat since and none left a result."""
    return not any(f.beats_after_adoption or f.result() for f in followers.values())
