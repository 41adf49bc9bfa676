"""`trainctl diagnose`: the job's script run as bounded derived jobs, through the installed
CLI, on the digits example (which uses the helpers) and on a script that uses none."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, FIXTURES, TRAINCTL
from trainctl import Estimator
from trainctl.diagnose import Diagnosis, RunMeasurement, _analyse
from trainctl.record import JobStore
from trainctl.train import diagnosis

TORCHRUN = {"torch_distributed": {"enabled": True}}


def _trainctl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRAINCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _job_names(home: Path) -> set[str]:
    jobs = home / "store" / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_diagnose_digits_measures_every_share_and_leaves_the_job_alone(home):
    job = Estimator(
        "train.py",
        source_dir=str(EXAMPLES / "digits"),
        instance_count=2,
        distribution=TORCHRUN,
        hyperparameters={"epochs": 1, "checkpoint-every": 4},
    ).fit(logs=False)
    before = job.describe()
    checkpoints = sorted(i.key for i in job.store.list(f"jobs/{job.name}/checkpoints"))

    done = _trainctl("diagnose", job.name, "--steps", "8", "--warmup", "2", "-o", "json")
    assert done.returncode == 0, done.stderr
    result = Diagnosis.model_validate_json(done.stdout)
    labels = [run.label for run in result.runs]
    assert labels == ["2 nodes", "2 nodes, synthetic data", "1 node"], labels
    for run in result.runs:
        assert run.state == "Completed" and run.steps == 8, run
        assert run.samples == 8 * 32 and run.seconds and run.seconds > 0, run
        assert run.job.startswith(f"{job.name}-dx-")
    main, synthetic, single = result.runs
    assert main.nodes == synthetic.nodes == 2 and single.nodes == 1
    assert synthetic.synthetic and main.data_wait is not None and main.data_wait > 0
    assert main.saves == 2 and main.checkpoint_stall and main.checkpoint_stall > 0
    for share in (result.communication_share, result.io_share, result.checkpoint_share):
        assert share is not None and 0 <= share < 1
    assert result.scaling_efficiency is not None and result.scaling_efficiency > 0
    assert result.bound in ("communication", "data loading", "checkpointing", "compute")
    assert result.advice and not result.not_measured
    figures = result.checkpoint
    assert figures is not None and result.interruptions_from == "assumed for on-demand capacity"
    assert math.isclose(
        figures["optimum_seconds"],
        max(math.sqrt(2 * figures["save_seconds"] * figures["mtbf_seconds"]), 1e-9),
        rel_tol=0.01,
    )
    assert "bound by: " in result.render()

    # The job itself: not run again, its checkpoints neither read nor written.
    assert JobStore(job.store, job.name).load().describe()["attempts"] == before["attempts"]
    after = sorted(i.key for i in job.store.list(f"jobs/{job.name}/checkpoints"))
    assert after == checkpoints
    assert len(_job_names(home)) == 4  # the job and its three runs


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_diagnose_a_script_without_helpers_times_whole_runs_and_says_what_it_could_not(home):
    job = Estimator("train.py", source_dir=str(FIXTURES / "plainwork"), instance_count=2).fit(
        logs=False
    )
    done = _trainctl("diagnose", job.name)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 nodes" in out and "1 node" in out and "ran to its end in" in out, out
    assert "scaling efficiency" in out and "synthetic" not in out, out
    assert "not measured:" in out and "report_step" in out, out
    assert len(_job_names(home)) == 3  # no synthetic-data run: nothing to substitute


@pytest.mark.timeout(60)
def test_diagnose_bad_input_is_one_line_and_runs_nothing(home):
    missing = _trainctl("diagnose", "no-such-job")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"error: job 'no-such-job' not found in {(home / 'store').as_uri()}"
    )
    for args, field in (
        (["--steps", "0"], "steps"),
        (["--max-seconds", "0"], "max_seconds"),
        (["--interruptions-per-hour", "-1"], "interruptions_per_hour"),
    ):
        bad = _trainctl("diagnose", "no-such-job", *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert bad.stderr.startswith(f"error: {field}: ") and bad.stderr.count("\n") == 1
    assert _job_names(home) == set()


def _run(label: str, nodes: int, step: float, **fields) -> RunMeasurement:
    return RunMeasurement(
        label=label,
        job=f"j-{label}",
        nodes=nodes,
        synthetic="synthetic" in label,
        state="Completed",
        steps=100,
        seconds=step * 100,
        **fields,
    )


def test_shares_and_the_young_daly_interval_from_the_runs():
    runs = [
        _run(
            "4 nodes",
            4,
            0.10,
            samples=3200,
            data_wait=0.5,
            saves=2,
            checkpoint_stall=0.2,
            checkpoint_write=1.0,
        ),
        _run("4 nodes, synthetic data", 4, 0.09, samples=3200),
        _run("1 node", 1, 0.05, samples=3200),
    ]
    result = _analyse("j", 4, runs, rate=0.5, rate_source="given")
    assert result.communication_share == pytest.approx(0.5)
    assert result.scaling_efficiency == pytest.approx(0.5)
    assert result.io_share == pytest.approx(0.1)
    assert result.checkpoint_share == pytest.approx(0.02)
    assert result.bound == "communication"
    figures = result.checkpoint
    assert figures is not None
    assert figures["mtbf_seconds"] == pytest.approx(3600 / (0.5 * 4))  # every node's rate
    assert figures["optimum_seconds"] == pytest.approx(math.sqrt(2 * 0.1 * 1800), rel=1e-3)
    assert figures["optimum_steps"] == round(math.sqrt(2 * 0.1 * 1800) / 0.10)
    assert figures["current_steps"] == 50
    # A bigger per-worker batch on 4 nodes is more compute per step, not communication.
    runs[0].samples = 6400
    assert _analyse("j", 4, runs, 0.5, "given").communication_share == pytest.approx(0.0)


def test_synthetic_batches_keep_the_loaders_batch_sizes(monkeypatch):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    loader = DataLoader(data, batch_size=4)
    monkeypatch.setenv(diagnosis.DIAGNOSE_STEPS, "100")
    monkeypatch.setenv(diagnosis.SYNTHETIC_DATA, "1")
    monkeypatch.setattr(diagnosis, "_meter_read", False)
    monkeypatch.setattr(diagnosis, "_meter", None)
    for _epoch in range(2):
        got = list(diagnosis.batches(loader))
        assert [len(x) for x, _ in got] == [4, 4, 2]
        assert all(torch.equal(x, torch.arange(float(len(x)))) for x, _ in got)  # the first
    monkeypatch.setattr(diagnosis, "_meter", None)  # no exit-time report from this test
