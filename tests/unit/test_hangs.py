"""Telling a hang from progress, and naming it (trainctl.controller.progress_watch, .hangs,
.groups, trainctl.node.ranks): which lines are progress, the longest quiet stretch, a
relaunch's bound from the job's pace, faulthandler's dumps read back, where a rank waits, and
nodes that never trained together."""

from __future__ import annotations

from types import SimpleNamespace

from trainctl.cluster import ClusterInfo
from trainctl.controller.groups import trained_apart
from trainctl.controller.hangs import LOAD_BYTES_PER_SECOND, hung_failure, pace_bound
from trainctl.controller.progress_watch import ProgressWatch
from trainctl.node.ranks import parse_stacks, short_path, waits_in
from trainctl.record.models import Attempt, NodeRestored, Restored

T0 = "2026-12-01T00:00:00.000Z"  # (a record checks its times)


def test_a_training_loops_lines_are_progress_a_retry_loops_are_not() -> None:
    watch = ProgressWatch(0, 60, now=0.0)
    watch.activity(0.0)
    watch.line(0, "[RANK0] Epoch 3 | Batchsize: 32 | Steps: 4", 5.0)
    watch.line(0, "[RANK0] Epoch 4 | Batchsize: 32 | Steps: 4", 10.0)  # same shape: a loop
    assert watch.last_progress == 10.0
    watch.line(0, "[RANK0] Epoch 4 | Batchsize: 32 | Steps: 4", 20.0)  # the very same line
    assert watch.last_progress == 10.0
    retry = "[W1201 10:00:0{} socket.cpp:663] [c10d] connect to host:29500 failed, retrying"
    watch.line(1, retry.format(1), 21.0)  # new to the node: progress once
    watch.line(1, retry.format(2), 30.0)  # the same complaint, another time: not progress
    watch.line(1, "Waiting in store based barrier, attempt 7", 31.0)
    watch.line(1, "Waiting in store based barrier, attempt 8", 40.0)
    assert watch.last_progress == 31.0
    assert watch.longest_quiet == 11.0  # 10.0 -> 21.0, the longest gap between signs of life


def test_a_relaunch_is_bounded_by_the_jobs_own_pace_with_a_floor_and_the_restore() -> None:
    record = SimpleNamespace(
        attempts=[
            Attempt(number=1, started_at=T0, longest_quiet_seconds=25.0),
            Attempt(number=2, started_at=T0, longest_quiet_seconds=40.0),
            Attempt(number=3, started_at=T0),
        ]
    )
    bound = pace_bound(record, factor=4, floor=120)
    assert bound is not None and bound.pace == 40.0
    current = record.attempts[-1]
    assert bound.seconds(current) == 160.0
    current.restored = Restored(bytes=0, checkpoint_bytes=10 * LOAD_BYTES_PER_SECOND)
    assert bound.seconds(current) == 170.0  # time to load what it restored
    assert "4x the longest quiet stretch of the earlier attempts, 40 s" in bound.reason(current)
    assert (
        pace_bound(record, factor=0.5, floor=120).seconds(Attempt(number=9, started_at=T0)) == 120
    )
    assert pace_bound(SimpleNamespace(attempts=record.attempts[-1:]), 4, 120) is None  # first
    assert pace_bound(record, factor=0, floor=120) is None  # off: the timeouts alone

    watch = ProgressWatch(1800, 1800, now=0.0)
    watch.pace_bound, watch.pace_reason = 160.0, bound.reason(current)
    watch.activity(0.0)
    watch.line(0, "step 1", 1.0)
    assert watch.hung(160.0) is None
    hang = watch.hung(161.5)
    assert hang is not None and hang.startswith("algo-1: no progress for 160 s (bound 170 s")
    watch.startup_timeout = 100.0  # a timeout the user set shorter still binds (no step yet)
    assert watch.bound() == 100.0


DUMP = """\
Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 4725 in barrier
  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/job/code/train.py", line 115 in main
  File "/job/code/train.py", line 130 in <module>
"""


def test_a_faulthandler_dump_says_where_the_scripts_thread_waits() -> None:
    threads = parse_stacks(DUMP)
    assert [len(t.frames) for t in threads] == [2, 4]
    assert waits_in(threads, "/job/code") == (
        "barrier (torch/distributed/distributed_c10d.py:4725), from train.py:115 in main"
    )
    assert waits_in(parse_stacks("garbage\n"), "/job/code") == "no Python frame"
    assert short_path("/somewhere/else/lib.py") == "lib.py"


def test_a_hung_failure_names_where_each_rank_waits_and_who_had_ended() -> None:
    nodes = {
        0: SimpleNamespace(exit_code=None, lost=None),
        1: SimpleNamespace(exit_code=0, lost=None),
    }
    stacks = {0: {"1": "all_reduce (a.py:2)", "0": "barrier (a.py:1)"}}
    reason, detail = hung_failure("algo-1: no progress for 130 s", nodes, stacks)
    assert reason == (
        "algo-1: no progress for 130 s; algo-1 rank 0 in barrier (a.py:1); "
        "algo-1 rank 1 in all_reduce (a.py:2); algo-2 had ended (exit code 0)"
    )
    assert detail is not None and detail.count("\n") == 2
    assert hung_failure("stuck", nodes | {1: SimpleNamespace(exit_code=None, lost=None)}, {}) == (
        "stuck",
        None,
    )


def _cluster(nodes: int, per_host: int) -> ClusterInfo:
    return ClusterInfo.model_validate(
        {
            "job": "j",
            "attempt": 1,
            "provider": "local",
            "instance_type": "local",
            "processes_per_host": per_host,
            "master_port": 29500,
            "nodes": [
                {"rank": r, "host": f"algo-{r + 1}", "address": "127.0.0.1", "root": f"/n{r}"}
                for r in range(nodes)
            ],
        }
    )


def test_nodes_that_never_formed_a_group_across_them_trained_apart() -> None:
    alone = [{"exit_code": 0, "groups": {"ranks": 1, "largest": 0}}] * 2
    warning = trained_apart(_cluster(2, 1), alone)
    assert warning is not None and warning.startswith("the 2 nodes never trained together")
    assert "Trainer(num_nodes=2)" in warning and "WORLD_SIZE=2" in warning
    per_node = [{"exit_code": 0, "groups": {"ranks": 2, "largest": 2}}] * 2  # one per node
    assert "had 2 rank(s), one node's" in (trained_apart(_cluster(2, 2), per_node) or "")
    together = [{"exit_code": 0, "groups": {"ranks": 1, "largest": 2, "used": True}}] * 2
    assert trained_apart(_cluster(2, 1), together) is None
    older = [{"exit_code": 0, "groups": {"ranks": 1, "largest": 2}}] * 2  # (no "used")
    assert trained_apart(_cluster(2, 1), older) is None
    # A Trainer on CPU without use_cpu: a group across the nodes, only barriers through it.
    unused = [{"exit_code": 0, "groups": {"ranks": 1, "largest": 2, "used": False}}] * 2
    warning = trained_apart(_cluster(2, 1), unused)
    assert warning and "none trained through it" in warning and "use_cpu=True" in warning
    assert trained_apart(_cluster(1, 1), alone[:1]) is None  # one node: nothing to span
    unknown = [{"groups": {"ranks": 0, "largest": 0}}, alone[0]]  # the hook did not run there
    assert trained_apart(_cluster(2, 1), unknown) is None
    assert trained_apart(_cluster(2, 1), [{}, {}]) is None  # an older agent: no report
    # A script that failed before any group formed (the smddp example without its library)
    # trained neither apart nor together: its failure says what happened.
    crashed = [{"exit_code": 1, "groups": {"ranks": 1, "largest": 0}}] * 2
    assert trained_apart(_cluster(2, 1), crashed) is None


def test_a_restore_report_is_recorded_whatever_a_node_sends() -> None:
    odd = {"rank": 1, "files": -3, "state": {"a.pt": {"node": "x"}, "b.pt": 7}, "largest": [1]}
    node = NodeRestored.from_message(odd)
    assert (node.files, node.state, node.largest, node.text()) == (0, {}, [], "nothing")
