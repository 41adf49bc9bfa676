"""A checkpoint folder written while its node dies never comes back half-written (issue 59).

Three real patterns save state as several files: a Hugging Face `Trainer`'s
`checkpoint-<step>/` (trainer_state.json last), torch.distributed.checkpoint's step folder
(`.metadata` last), and a script that writes a multi-file checkpoint from a background
thread; a Lightning `Trainer` rewrites `last.ckpt` every epoch (here in place, as a
CheckpointIO for a shared file system does). Each runs on a local node; its save of one step
is held open halfway (the fixtures' --hold-file: the folder's first files written, its last
not, or still being written; half of last.ckpt) until the node's sync has seen the half;
then the node is killed without warning. The relaunch restores the checkpoint before it,
whole, and the script resumes from there and completes; the job's events name what was
being written. (Before issue 59 the half folder came back: the Trainer failed on the missing
trainer_state.json, dcp.load on the missing .metadata, the thread script on its missing
part; last.ckpt came back whole, its last copy, but nothing said so.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.helpers import FIXTURES, log_lines, wait_for
from trainctl import Estimator

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Case:
    source: str
    entry_point: str
    held: str  # the folder (or file) whose save is held open (relative to the working dir)
    first: str | None  # a file of that folder written before the hold (None: held is a file)
    before: str  # the last file of the checkpoint before it (settled before the kill)
    resumed: str  # what the relaunch prints where it resumes
    hyperparameters: dict[str, Any] = field(default_factory=dict)


CASES = {
    "hf_trainer": Case(
        "hf_trainer", "train.py", "out/checkpoint-10", "model.safetensors",
        "out/checkpoint-5/trainer_state.json", "resuming from out/checkpoint-5",
        {"max-steps": 15, "save-steps": 5, "hold-at-step": 10},
    ),
    "dcp": Case(
        "half_written", "dcp.py", "ckpt/step-3", "__0_0.distcp",
        "ckpt/step-2/.metadata", "resuming from step 2", {"steps": 4, "hold-at-step": 3},
    ),
    "thread": Case(
        "half_written", "thread.py", "ckpt/step-2", "part-0.dat",
        "ckpt/step-1/part-2.dat", "resuming from step 1", {"steps": 3, "hold-at-step": 2},
    ),
    "lightning": Case(
        "lightning", "train.py", "checkpoints/last.ckpt", None, "checkpoints/last.ckpt",
        "[rank 0] training from epoch 2", {"epochs": 4, "hold-at-epoch": 2, "epoch-delay": 2.5},
    ),
}  # fmt: skip


def stored(job) -> dict[str, Any]:
    """Node 0's manifest: what a relaunch restores (`files`), the newer copies not settled
    (`pending`) and the files caught being written (`writing`)."""
    from trainctl.errors import NotFoundError

    try:
        return json.loads(job.store.get_text(f"jobs/{job.name}/workdir/node-0/manifest.json"))
    except (NotFoundError, ValueError):
        return {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_folder_half_written_when_its_node_dies_is_not_restored(home, tmp_path, name):
    from trainctl.cluster import ClusterInfo
    from trainctl.provisioning import get_provider
    from trainctl.record.keys import JobKeys

    case = CASES[name]
    hold = tmp_path / "go-on"
    job = Estimator(
        entry_point=case.entry_point,
        source_dir=str(FIXTURES / case.source),
        hyperparameters={**case.hyperparameters, "hold-file": str(hold)},
        max_restarts=1,
    ).fit(wait=False)
    half = f"code/{case.held}/{case.first}" if case.first else f"code/{case.held}"
    unit = f"{case.held}/" if case.first else case.held

    def half_seen() -> bool:
        manifest = stored(job)
        seen = {*manifest.get("files", {}), *manifest.get("pending", {})}
        if not case.first:  # a file: caught torn (no copy of it goes up)
            seen = set(manifest.get("writing", []))
        return f"code/{case.before}" in manifest.get("files", {}) and half in seen

    wait_for(half_seen, 180, job, f"{half} seen by the node's sync")
    cluster = ClusterInfo.model_validate_json(job.store.get_text(JobKeys(job.name).cluster(1)))
    get_provider(cluster.instance_type).kill_node(cluster, 0)
    hold.touch()  # the relaunch's save of that step goes through
    info = job.wait(timeout=240, raise_on_failure=False)
    causes = [(a["outcome"], a["cause"]) for a in info["attempts"]]
    assert info["state"] == "Completed", (causes, info["failure_reason"])
    assert len(info["attempts"]) == 2, causes
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-2/node-0.log")
    assert case.resumed in log, log[-3000:]
    said = [e for e in job.store.get_text(f"jobs/{job.name}/events.jsonl").splitlines()]
    events = [json.loads(line) for line in said if line.strip()]
    unsettled = [e for e in events if e["type"] == "restored_as_before"]
    assert [e["paths"] for e in unsettled] == [[unit]], unsettled
    restored = re.findall(
        r"working directory: (\S+) was being written.*", "\n".join(log_lines(log))
    )
    assert restored == [unit], restored
