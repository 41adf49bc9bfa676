"""GPUs on the local provider, on a machine without any: a stand-in nvidia-smi
(tests/fixtures/fake_gpus) lists four, so the split between local nodes, the workers per
node, the bad-input lines and the agent's health check run as they would on a GPU machine.
The real thing (CUDA, NCCL) is tests/gpu/, run by `make test-gpu` where CUDA exists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, TRAINCTL
from trainctl import Estimator

pytestmark = pytest.mark.e2e

FAKE_GPUS = FIXTURES / "fake_gpus"

# Each worker prints what it was given, in one short write.
SHOW_GPUS = """\
import os
keys = ("SM_CURRENT_HOST", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SM_NUM_GPUS",
        "CUDA_VISIBLE_DEVICES")
print("GPUS " + " ".join(k + "=" + os.environ.get(k, "-") for k in keys), flush=True)
"""


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has four GPUs, as far as trainctl can tell."""
    monkeypatch.setenv("PATH", f"{FAKE_GPUS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPUS", "4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _script(tmp_path: Path) -> Path:
    src = tmp_path / "gpu-src"
    src.mkdir()
    (src / "show.py").write_text(SHOW_GPUS)
    return src


def _seen(job, attempt: int = 1) -> set[tuple[str, ...]]:
    out = set()
    for info in job.store.list(f"jobs/{job.name}/logs/attempt-{attempt}"):
        for line in job.store.get_text(info.key).splitlines():
            if "GPUS " in line:
                fields = dict(part.split("=", 1) for part in line.split("GPUS ", 1)[1].split())
                out.add(
                    tuple(
                        fields[k]
                        for k in (
                            "SM_CURRENT_HOST",
                            "RANK",
                            "WORLD_SIZE",
                            "SM_NUM_GPUS",
                            "CUDA_VISIBLE_DEVICES",
                        )
                    )
                )
    return out


@pytest.mark.timeout(120)
def test_two_local_nodes_each_get_their_own_gpus(home, tmp_path, four_gpus, monkeypatch):
    """4 GPUs, 2 nodes: algo-1 has GPUs 0,1 and algo-2 GPUs 2,3; each node runs a worker
    per GPU (processes_per_host defaults to the node's GPUs, as on a GPU instance). A process
    of the user's own on GPU 1 (a notebook's CUDA context, say) is a warning on this
    machine, not a failed node: replacing a local node would give it the same GPU."""
    monkeypatch.setenv("FAKE_GPU_BUSY", "1:4242")
    job = Estimator(
        entry_point="show.py",
        source_dir=str(_script(tmp_path)),
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
    ).fit(logs=False)
    assert job.describe()["state"] == "Completed"
    assert _seen(job) == {
        ("127.0.1.1", "0", "4", "2", "0,1"),
        ("127.0.1.1", "1", "4", "2", "0,1"),
        ("127.0.1.2", "2", "4", "2", "2,3"),
        ("127.0.1.2", "3", "4", "2", "2,3"),
    }
    assert len(job.describe()["attempts"]) == 1
    node0 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "GPU health (warning, the job runs beside it): GPU 1 (Fake H100) is busy" in node0


@pytest.mark.timeout(120)
def test_a_node_whose_gpu_fails_the_health_check_is_replaced(home, tmp_path, four_gpus):
    """An uncorrected ECC error on GPU 3 at the first start: algo-2 is not launched on it,
    the attempt ends as infrastructure (not the user's failure) and new capacity (here: the
    GPU healthy again) runs the job."""
    state = tmp_path / "fake-gpu-state"
    os.environ["FAKE_GPU_ECC"] = "3:2"
    os.environ["FAKE_GPU_ECC_QUERIES"] = "2"  # the first attempt's two nodes see it
    os.environ["FAKE_GPU_STATE"] = str(state)
    try:
        job = Estimator(
            entry_point="show.py", source_dir=str(_script(tmp_path)), instance_count=2
        ).fit(logs=False)
    finally:
        for name in ("FAKE_GPU_ECC", "FAKE_GPU_ECC_QUERIES", "FAKE_GPU_STATE"):
            os.environ.pop(name)
    info = job.describe()
    assert info["state"] == "Completed", info
    assert [a["outcome"] for a in info["attempts"]] == ["interrupted", "completed"]
    node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "GPU health: GPU 3 (Fake H100): 2 uncorrected ECC error(s)" in node1
    assert "launching:" not in node1  # the user's code never ran on the bad GPU
    interrupted = [e for e in job.events() if e.get("state") == "Interrupted"]
    assert "GPU health check failed: GPU 3 (Fake H100)" in interrupted[0]["cause"]
    assert ("127.0.1.2", "1", "2", "2", "2,3") in _seen(job, attempt=2)


def _submit(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRAINCTL, "submit", "show.py", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(120)
def test_gpu_counts_that_cannot_work_are_one_line_before_anything_is_made(
    cli_home, tmp_path, four_gpus
):
    src = _script(tmp_path)
    uneven = _submit(src, "--instance-count", "3")
    assert uneven.returncode == 2, uneven.stderr
    assert uneven.stderr.strip() == (
        "error: instance_count: 3 local nodes cannot share this machine's 4 GPUs evenly; "
        "use 1, 2, 4"
    )
    crowded = _submit(src, "--instance-count", "2", "--processes-per-host", "3")
    assert crowded.returncode == 2, crowded.stderr
    assert crowded.stderr.startswith(
        "error: processes_per_host: 3 workers per node but each of the 2 local node(s) has "
        "2 GPU(s) of this machine's 4: at most 2"
    )
    assert len(crowded.stderr.strip().splitlines()) == 1
    none = _submit(src, "--instance-type", "local_gpu", FAKE_GPUS="0")
    assert none.returncode == 2, none.stderr
    assert none.stderr.startswith("error: instance_type: local_gpu needs a GPU on this machine")
    assert not (cli_home / "store").exists(), "nothing is uploaded or recorded"
