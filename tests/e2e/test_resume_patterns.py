"""Today's checkpoint patterns resume on every rank: global rank 0 saves, every rank loads.

The scripts are third-party styles run unchanged (tests/fixtures): the PyTorch DDP tutorial
as it is since 2025 (`snapshot.pt` saved by global rank 0 to a relative path), Lightning
(`ModelCheckpoint(dirpath="checkpoints", save_last=True)` and `fit(ckpt_path="last")`) and
a Hugging Face `Trainer` (`checkpoint-<step>/` by rank 0, `rng_state_<rank>.pth` by each
rank, `train(resume_from_checkpoint=True)`). Each runs on 2 nodes under torchrun; node 2,
which never saved the state, is killed without warning once rank 0's state is in the store.
The relaunch restores rank 0's files on every node, every rank resumes from the same point,
and the job ends with the model an uninterrupted run of plain torchrun gives, bit for bit.
On local nodes and on the EC2 stand-ins (moto, sshd, an S3 store); the tutorial on local
nodes is test_e2e_cli's.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FIXTURES, TORCHRUN, free_port, log_lines, wait_for
from tests.rigs.cloud import cloud
from tests.rigs.providers import rig
from trainctl import Estimator
from trainctl.procs import descendants, signal_all

pytestmark = pytest.mark.e2e
__all__ = ["cloud", "rig"]  # the fixtures behind the rigs


@dataclass(frozen=True)
class Pattern:
    source: str  # fixture directory
    entry_point: str
    saved: str  # what rank 0 saves, relative to the working directory (waited for)
    state: str  # how the saved-state files a node restored begin
    resumed: str  # a regex of a line each rank prints where it starts: group 1 says where
    arguments: list[str] = field(default_factory=list)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    model: str = ""  # the final model in SM_MODEL_DIR ("": the saved state itself)
    # what only paces the run (no effect on the model): left out of the reference run
    delays: tuple[str, ...] = ()


PATTERNS = {
    "tutorial": Pattern(
        "snapshot",
        "multinode.py",
        saved="snapshot.pt",
        state="snapshot.pt",
        resumed=r"\[RANK(\d)\] Epoch (\d+) \|",
        arguments=["24", "1"],
        hyperparameters={"epoch_delay": 0.3},
        delays=("epoch_delay",),
    ),
    "lightning": Pattern(
        "lightning",
        "train.py",
        saved="checkpoints/last.ckpt",
        state="checkpoints/last.ckpt",
        resumed=r"\[rank (\d)\] epoch (\d+) done",
        hyperparameters={"epochs": 10, "num-nodes": 2, "epoch-delay": 0.6},
        model="model.pt",
        delays=("epoch-delay",),
    ),
    "hf_trainer": Pattern(
        "hf_trainer",
        "train.py",
        saved="out/checkpoint-10/trainer_state.json",
        state="out/checkpoint-",
        resumed=r"()resuming from out/checkpoint-(\d+)",
        hyperparameters={"max-steps": 40, "save-steps": 5, "step-delay": 0.25},
        model="model.safetensors",
        delays=("step-delay",),
    ),
}


def _args(pattern: Pattern, *, paced: bool) -> list[str]:
    """The script's command line as trainctl passes it: arguments, then `--key value`."""
    args = list(pattern.arguments)
    for key, value in pattern.hyperparameters.items():
        if paced or key not in pattern.delays:
            args += [f"--{key}", str(value)]
    return args


_REFERENCES: dict[str, dict[str, Any]] = {}
BYTECODE = shutil.ignore_patterns("__pycache__")  # (make test compiles the fixtures)


def reference(pattern_name: str, tmp_path_factory) -> dict[str, Any]:
    """The model of an uninterrupted run: plain torchrun, 2 nodes x 1 process on loopback
    (once per pattern and test process)."""
    if pattern_name in _REFERENCES:
        return _REFERENCES[pattern_name]
    pattern = PATTERNS[pattern_name]
    base = tmp_path_factory.mktemp(f"reference-{pattern_name}")
    port = free_port()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    procs = []
    for rank in (0, 1):
        work = base / f"node{rank}"
        shutil.copytree(FIXTURES / pattern.source, work, ignore=BYTECODE)
        (work / "model").mkdir()
        # (TMPDIR: torchrun's torchelastic_* folders go with the test's, not into /tmp)
        env = {**os.environ, "SM_MODEL_DIR": str(work / "model"), "OMP_NUM_THREADS": "1",
               "TMPDIR": str(work)}  # fmt: skip
        argv = [
            torchrun, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            pattern.entry_point, *_args(pattern, paced=False),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    try:
        outputs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    finally:
        for proc in procs:  # (a reference that hangs fails the test, leaving nothing)
            if proc.poll() is None:
                signal_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    node0 = base / "node0"
    path = node0 / "model" / pattern.model if pattern.model else node0 / pattern.saved
    _REFERENCES[pattern_name] = load_model(path.name, path.read_bytes())
    return _REFERENCES[pattern_name]


def load_model(name: str, data: bytes) -> dict[str, Any]:
    """Tensors by name: a torch.save of a state dict (or the tutorial's snapshot), or
    safetensors."""
    import torch

    if name.endswith(".safetensors"):
        from safetensors.torch import load

        return dict(load(data))
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if "MODEL_STATE" in state:  # the tutorial's snapshot: the model and how far it got
        return {**state["MODEL_STATE"], "EPOCHS_RUN": torch.tensor(state["EPOCHS_RUN"])}
    return dict(state)


def assert_same_model(got: dict[str, Any], expected: dict[str, Any]) -> None:
    import torch

    assert sorted(got) == sorted(expected)
    different = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert not different, f"not bit-identical to the uninterrupted run: {different}"


def stored_state(job, rank: int, path: str) -> bytes | None:
    """A node's newest copy of a working-directory file in the store, if it kept one."""
    from trainctl.errors import NotFoundError

    manifest_key = f"jobs/{job.name}/workdir/node-{rank}/manifest.json"
    try:
        files = json.loads(job.store.get_text(manifest_key))["files"]
    except (NotFoundError, ValueError, KeyError):
        return None
    entry = files.get(f"code/{path}")
    if entry is None:
        return None
    return job.store.get_bytes(f"jobs/{job.name}/workdir/{entry['key']}")


def final_model(job, pattern: Pattern) -> dict[str, Any]:
    """The job's model: from model.tar.gz, or (the tutorial keeps only its snapshot) rank
    0's last copy of its snapshot in the store."""
    from trainctl.store import open_store

    if not pattern.model:
        data = stored_state(job, 0, pattern.saved)
        assert data is not None, "no snapshot in the store"
        return load_model(pattern.saved, data)
    url = job.describe()["model_data"]
    parent, _, leaf = url.rpartition("/")
    with tarfile.open(fileobj=io.BytesIO(open_store(parent).get_bytes(leaf)), mode="r:gz") as tar:
        member = tar.extractfile(pattern.model)
        assert member is not None, tar.getnames()
        return load_model(pattern.model, member.read())


def starts(job, attempt: int, pattern: Pattern) -> dict[int, int]:
    """node -> the first epoch or step its ranks printed in `attempt` (they must agree)."""
    found: dict[int, int] = {}
    for rank in (0, 1):
        log = job.store.get_text(f"jobs/{job.name}/logs/attempt-{attempt}/node-{rank}.log")
        points = [
            int(m.group(2)) for line in log_lines(log) if (m := re.search(pattern.resumed, line))
        ]
        assert points, f"node {rank} of attempt {attempt} printed no start:\n{log[-3000:]}"
        found[rank] = points[0]
    return found


# Every pattern on both rigs but the tutorial on local nodes: test_e2e_cli's tutorial test
# runs it there, through the installed `trainctl`, on 2 nodes x 2 processes.
CASES = [(name, provider) for name in PATTERNS for provider in ("local", "aws")]
CASES.remove(("tutorial", "local"))


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("name", "rig"), CASES, indirect=["rig"])
def test_rank_0s_state_resumes_every_rank_after_a_lost_node(rig, name, tmp_path_factory):
    from trainctl.cluster import ClusterInfo
    from trainctl.provisioning import get_provider
    from trainctl.record.keys import JobKeys

    pattern = PATTERNS[name]
    expected = reference(name, tmp_path_factory)
    source = tmp_path_factory.mktemp(name) / pattern.source
    shutil.copytree(FIXTURES / pattern.source, source, ignore=BYTECODE)
    job = Estimator(
        entry_point=pattern.entry_point,
        source_dir=str(source),
        instance_count=2,
        distribution=TORCHRUN,
        arguments=pattern.arguments,
        hyperparameters=pattern.hyperparameters,
        **rig.fields,
    ).fit(wait=False)
    wait_for(lambda: stored_state(job, 0, pattern.saved), 180, job, f"{pattern.saved} stored")
    cluster = ClusterInfo.model_validate_json(job.store.get_text(JobKeys(job.name).cluster(1)))
    get_provider(cluster.instance_type, rig.fields.get("region")).kill_node(cluster, 1)
    info = job.wait(timeout=300, raise_on_failure=False)
    causes = [(a["outcome"], a["cause"]) for a in info["attempts"]]
    assert info["state"] == "Completed", (causes, info["failure_reason"])
    assert len(info["attempts"]) == 2, causes
    first, second = info["attempts"]
    assert first["cause"].startswith("algo-2 lost"), causes
    by_node = second["restored_by_node"]
    assert set(by_node) == {"algo-1", "algo-2"}, by_node
    assert second["restored"]["split"] is None, second["restored"]
    for node in second["restored"]["by_node"]:  # rank 0's state, on the node that lost it too
        assert any(path.startswith(pattern.state) for path in node["state"]), by_node
    assert (
        second["started_from"].startswith("restored") and "on every node" in second["started_from"]
    ), second["started_from"]
    resumed = starts(job, 2, pattern)
    assert len(set(resumed.values())) == 1 and resumed[0] > 0, resumed  # together, not at 0
    assert_same_model(final_model(job, pattern), expected)
    rig.assert_nothing_left(job.name)
