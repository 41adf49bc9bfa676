"""What a relaunch says when it goes wrong, with real processes: nodes that start from different
state (a split resume), an attempt that then hangs (named within the job's own pace, with each
rank's stack), and a multi-node job whose nodes never trained together.

The scripts are third-party styles, unchanged (tests/fixtures: the DDP tutorial's, Lightning's).
The split is made the way a real store makes one: the store answers one node's download of
rank 0's snapshot with 404 (a copy pruned between the listing and the download, a machine whose
reads fail; tests/rigs/faulty_s3.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.helpers import FIXTURES, TORCHRUN, TRAINCTL, log_lines
from tests.rigs.faulty_s3 import Rule, moto_s3
from trainctl import Estimator

pytestmark = pytest.mark.e2e

LIGHTNING = FIXTURES / "lightning"


def _stored(job, rank: int, path: str) -> bool:
    from trainctl.errors import NotFoundError

    try:
        manifest = json.loads(
            job.store.get_text(f"jobs/{job.name}/workdir/node-{rank}/manifest.json")
        )
    except (NotFoundError, ValueError):
        return False
    return f"code/{path}" in manifest.get("files", {})


@pytest.mark.timeout(300)
def test_a_split_resume_is_said_and_its_hang_is_named_within_the_jobs_pace(home, monkeypatch):
    """The DDP tutorial's pattern (global rank 0 saves snapshot.pt, every rank loads it),
    ending with a barrier before the group is torn down. Node 2 is lost once rank 0's
    snapshot is stored; in the relaunch the store refuses node 2's download of it (404), so
    rank 0 resumes from the snapshot and rank 1 from scratch: rank 0 finishes first and
    waits in the barrier while rank 1 waits in DDP's all-reduce, for ever. Before that, a
    warning names the nodes and what each restored; the hang is named within the bound the
    first attempt's pace sets (not 30 minutes), with each rank's Python stack in its node
    log and where it waits in the failure."""
    from trainctl.cluster import ClusterInfo
    from trainctl.provisioning.local import LocalProvider
    from trainctl.record.keys import JobKeys

    monkeypatch.setenv("TRAINCTL_HANG_FLOOR_SECONDS", "10")
    monkeypatch.setenv("TRAINCTL_HANG_PACE_FACTOR", "2")
    with moto_s3(monkeypatch, faulty=True) as (_, bucket, proxy):
        monkeypatch.setenv("TRAINCTL_STORE", f"s3://{bucket}/store")
        job = Estimator(
            entry_point="multinode.py",
            source_dir=str(FIXTURES / "snapshot"),
            instance_count=2,
            distribution=TORCHRUN,
            # Long enough that the kill comes before the end: 20 epochs (8 s) were not, once,
            # on a busy machine whose first sync pass came late (the job was Uploading).
            arguments=["40", "1"],
            hyperparameters={"epoch_delay": 0.4, "sync_at_end": 1},
        ).fit(wait=False)
        deadline = time.monotonic() + 180
        while not _stored(job, 0, "snapshot.pt") and time.monotonic() < deadline:
            assert job.describe()["state"] not in ("Completed", "Failed"), job.describe()
            time.sleep(0.3)
        assert job.describe()["state"] == "Training", job.describe()
        refused = proxy.add(Rule(("HEAD",), r"/workdir/node-0/.*/code/snapshot\.pt$", 404, node=1))
        cluster = ClusterInfo.model_validate_json(job.store.get_text(JobKeys(job.name).cluster(1)))
        LocalProvider().kill_node(cluster, 1)
        info = job.wait(timeout=240, raise_on_failure=False)
        assert len(info["attempts"]) == 2, [(a["outcome"], a["cause"]) for a in info["attempts"]]
        events = job.events()
        status = subprocess.run(
            [TRAINCTL, "status", job.name], capture_output=True, text=True, timeout=60
        ).stdout
        logs = {
            rank: "\n".join(log_lines(job.store.get_text(JobKeys(job.name).log(2, rank))))
            for rank in (0, 1)
        }
    types = [e["type"] for e in events]
    restores = [line for line in logs[1].splitlines() if "working directory" in line]
    assert refused.failed >= 1, ("node 2's download was never refused", refused, restores)
    assert info["state"] == "Failed", (info["state"], info["failure_reason"])
    second = info["attempts"][1]
    # the split, said before the hang: who restored what
    splits = [e for e in events if e["type"] == "split_resume"]
    assert len(splits) == 1, types
    said = splits[0]["differences"]
    assert said.startswith("snapshot.pt: algo-1 restored attempt 1, algo-1's copy of"), said
    assert said.endswith("; algo-2 restored nothing"), said
    assert second["restored"]["split"] == said
    assert second["started_from"].endswith("(split resume)"), second["started_from"]
    assert second["restored_by_node"]["algo-2"] == "nothing", second["restored_by_node"]
    assert "split resume" in status and "algo-2 restored nothing" in status, status
    # the hang, within the job's pace: 2x attempt 1's longest quiet stretch, at least 10 s
    hung = [e for e in events if e["type"] == "hung"]
    assert len(hung) == 1, (types, info["failure_reason"])
    pace = info["attempts"][0]["longest_quiet_seconds"]
    bound = float(re.search(r"bound (\d+) s", hung[0]["reason"]).group(1))
    silent = float(re.search(r"no progress for (\d+) s", hung[0]["reason"]).group(1))
    assert pace and abs(bound - max(10.0, 2 * pace)) <= 2, (bound, pace)
    assert bound <= silent <= bound + 5, (silent, bound)
    # each rank's stack in its node's log, and where it waits in the failure
    reason = info["failure_reason"]
    assert "algo-1 rank 0 in barrier (torch/distributed/" in reason, reason
    assert "algo-2 rank 1 in " in reason, reason
    for log in logs.values():
        assert "its stacks:" in log, log[-3000:]
        assert re.search(r'^\s+File ".*", line \d+ in ', log, re.MULTILINE), log[-3000:]


@pytest.mark.timeout(240)
def test_nodes_that_never_trained_together_are_a_warning(home):
    """Lightning with its default Trainer(num_nodes=1) on 2 nodes under torchrun: each node
    takes its own rank for the whole world, no process group spans them, and the job
    Completes with two different models. One warning says so and names the usual cause."""
    job = Estimator(
        entry_point="train.py",
        source_dir=str(LIGHTNING),
        instance_count=2,
        distribution=TORCHRUN,
        hyperparameters={"epochs": 2},  # num_nodes left at Lightning's default
    ).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed"
    apart = [e for e in job.events() if e["type"] == "trained_apart"]
    assert len(apart) == 1, [e["type"] for e in job.events()]
    assert "the 2 nodes never trained together" in apart[0]["why"], apart
    assert "Trainer(num_nodes=2)" in apart[0]["why"], apart
    assert info["warnings"] == [apart[0]["why"]]  # `status` shows it too


@pytest.mark.timeout(240)
def test_ranks_that_formed_a_group_but_never_trained_through_it_are_a_warning(home):
    """A Hugging Face Trainer on CPU without use_cpu=True: every rank joins the process
    group across the 2 nodes (only barriers go through it) and trains alone (NOT_PARALLEL).
    The group alone is no proof of training together: the warning names use_cpu."""
    job = Estimator(
        entry_point="train.py",
        source_dir=str(FIXTURES / "hf_trainer"),
        instance_count=2,
        distribution=TORCHRUN,
        hyperparameters={"max-steps": 4, "save-steps": 100, "use-cpu": 0},
    ).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed"
    apart = [e["why"] for e in job.events() if e["type"] == "trained_apart"]
    assert len(apart) == 1 and "none trained through it" in apart[0], apart
    assert "TrainingArguments(use_cpu=True)" in apart[0] and info["warnings"] == apart
