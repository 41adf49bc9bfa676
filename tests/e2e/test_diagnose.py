"""`trainctl diagnose`: the job's script run as bounded derived jobs, through the installed
CLI, on the digits example (which uses the helpers) and on a script that uses none."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, TRAINCTL, digits_estimator
from trainctl import Estimator
from trainctl.diagnose import (
    ON_DEMAND_INTERRUPTIONS_PER_HOUR,
    SPOT_INTERRUPTIONS_PER_HOUR,
    Diagnosis,
    RunMeasurement,
    _analyse,
    _interruption_rate,
    _notice_unsaved,
)
from trainctl.record.jobstore import JobStore
from trainctl.record.models import Attempt, AttemptNode, JobRecord
from trainctl.train import diagnosis


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
    # 2 epochs of 23 steps a node: the measured steps span the first epoch's end, where
    # rank 0 alone reports again (its test accuracy), as the demo does
    job = digits_estimator({"epochs": 2, "checkpoint-every": 4}).fit(logs=False)
    before = job.describe()
    checkpoints = sorted(i.key for i in job.store.list(f"jobs/{job.name}/checkpoints"))

    done = _trainctl(
        "diagnose", job.name, "--steps", "30", "--warmup", "2", "--repeats", "1", "--keep",
        "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = Diagnosis.model_validate_json(done.stdout)
    labels = [run.label for run in result.runs]
    assert labels == ["2 nodes", "2 nodes, synthetic data", "1 node"], labels
    # a line per run as it ended (on stderr: stdout is the JSON)
    printed = [line.strip() for line in done.stderr.splitlines() if "ms/step" in line]
    assert printed == [run.line().strip() for run in result.runs], done.stderr
    for run in result.runs:  # every rank ended at the same step, by itself
        assert run.state == "Completed" and run.steps == 30, run
        assert run.seconds and run.seconds > 0, run
        assert run.job.startswith(f"{job.name}-dx-")
    main, synthetic, single = result.runs
    assert main.nodes == synthetic.nodes == 2 and single.nodes == 1
    # 32 a batch, and the epoch's last (short) batch among the 2-node runs' 30
    assert 29 * 32 < main.samples < 30 * 32 and synthetic.samples == main.samples, main
    assert single.samples == 30 * 32, single
    assert synthetic.synthetic and main.data_wait is not None and main.data_wait > 0
    assert main.saves == 8 and main.checkpoint_stall and main.checkpoint_stall > 0  # 4, 8...32
    assert main.notice_handler == "trainctl"  # digits checkpoints at a notice (PreemptionFlag)
    for share in (result.communication_share, result.io_share, result.checkpoint_share):
        assert share is not None and 0 <= share < 1
    assert result.scaling_efficiency is not None and result.scaling_efficiency > 0
    assert result.bound in ("communication", "data loading", "checkpointing", "compute")
    assert result.advice
    # local capacity is not reclaimed by a provider: no interval from an assumed market rate
    assert result.checkpoint is None and any("interval" in n for n in result.not_measured)
    assert any("--repeats" in n for n in result.not_measured)  # one run each: no spread
    assert "bound by: " in result.render()

    # The job itself: not run again, its checkpoints neither read nor written.
    assert JobStore(job.store, job.name).load().describe()["attempts"] == before["attempts"]
    after = sorted(i.key for i in job.store.list(f"jobs/{job.name}/checkpoints"))
    assert after == checkpoints
    assert len(_job_names(home)) == 4  # the job and its three runs (--keep)
    listed = _trainctl("jobs", "-o", "json")
    assert [j["name"] for j in json.loads(listed.stdout)] == [job.name]  # the runs: hidden
    every = json.loads(_trainctl("jobs", "--all", "-o", "json").stdout)
    assert sorted(j["measurement_of"] or "" for j in every) == ["", *[job.name] * 3]


@pytest.mark.e2e
@pytest.mark.timeout(200)
def test_diagnose_a_script_without_helpers_times_whole_runs_and_says_what_it_could_not(home):
    job = Estimator("train.py", source_dir=str(FIXTURES / "plainwork"), instance_count=2).fit(
        logs=False
    )
    done = _trainctl("diagnose", job.name, "--repeats", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 nodes" in out and "1 node" in out and "ran to its end in" in out, out
    assert "scaling efficiency" in out and "synthetic" not in out, out
    assert "not measured:" in out and "report_step" in out, out
    assert _job_names(home) == {job.name}  # its runs (no synthetic one) removed: no --keep


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_diagnose_ends_runs_whose_ranks_report_unequally_and_ends_at_sigterm(home):
    """Only rank 0 reports, twice at each epoch's end; every rank all-reduces each step.
    Each run ends (by the controller, soon after the measurement), and SIGTERM ends
    diagnose itself, its run stopped and removed."""
    job = Estimator("train.py", source_dir=str(FIXTURES / "rank0steps"), instance_count=2).fit(
        logs=False
    )
    started = time.monotonic()
    done = _trainctl("diagnose", job.name, "--steps", "10", "--warmup", "2", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 150  # (it hung until max_seconds: 600 s a run)
    assert done.stdout.startswith(f"diagnosing {job.name}"), done.stdout  # a header at once
    as_they_ended = done.stdout.split(f"diagnosis of {job.name}")[0]
    two, one = [line for line in as_they_ended.splitlines() if "10 steps" in line]
    assert two.strip().startswith("2 nodes") and one.strip().startswith("1 node"), done.stdout
    assert _job_names(home) == {job.name}

    proc = subprocess.Popen(
        [TRAINCTL, "diagnose", job.name, "--steps", "10", "--warmup", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_job_names(home)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # its first run is made
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert time.monotonic() - stopped_at < 45, "diagnose went on after SIGTERM"
    assert _job_names(home) == {job.name}  # the run under way: stopped and removed


def test_diagnose_counts_steps_not_calls(monkeypatch):
    """A step reported twice (rank 0's accuracy at an epoch's end) counts once: each rank
    ends at the same step however often it reports one."""

    def ending_step(calls: list[int]) -> int:
        monkeypatch.setenv(diagnosis.DIAGNOSE_STEPS, "5")
        monkeypatch.setenv(diagnosis.DIAGNOSE_WARMUP, "2")
        monkeypatch.setattr(diagnosis, "_meter_read", False)
        monkeypatch.setattr(diagnosis, "_meter", None)
        try:
            return next(step for step in calls if diagnosis.on_step(step, rank=1))
        finally:
            monkeypatch.setattr(diagnosis, "_meter", None)  # no exit-time report

    every_step = list(range(1, 20))
    epoch_ends_again = [c for step in every_step for c in ([step, step] if step % 3 else [step])]
    assert ending_step(every_step) == ending_step(epoch_ends_again) == 8  # 2 + 1 + 5


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
        (["--repeats", "0"], "repeats"),
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


def test_repeated_runs_give_a_spread_and_a_noise_verdict():
    """Three interleaved runs per configuration: the median run counts, the spread is
    reported, and a share smaller than the spread is within noise, not the bound."""
    runs = []
    for main, synthetic, single in (
        (0.100, 0.098, 0.060),
        (0.130, 0.099, 0.061),
        (0.104, 0.097, 0.059),
    ):
        runs += [
            _run("4 nodes", 4, main, samples=3200, data_wait=0.1),
            _run("4 nodes, synthetic data", 4, synthetic, samples=3200),
            _run("1 node", 1, single, samples=3200),
        ]
    result = _analyse("j", 4, runs, rate=0.5, rate_source="given")
    assert result.repeats == 3
    assert result.spread["4 nodes"] == pytest.approx((0.130 - 0.100) / 0.104)
    assert result.verdict is not None and "busy" in result.verdict  # 29% > 20%
    assert result.io_share == pytest.approx((0.104 - 0.098) / 0.104)  # the medians
    assert result.within_noise == ["data loading"]
    assert result.bound == "communication"  # 42%: well above the noise
    assert any("within the spread" in a for a in result.advice)
    assert "(within noise)" in result.render()
    quiet = [r.model_copy(update={"seconds": (r.step_seconds or 0) * 100}) for r in runs[:3]]
    assert _analyse("j", 4, quiet, 0.5, "given").verdict is None  # one run each: no verdict


def test_checkpoint_advice_is_bounded_by_the_job_and_by_its_capacity():
    runs = [
        _run("1 node", 1, 0.10, saves=2, checkpoint_stall=0.2, checkpoint_write=1.0),
    ]
    short = _analyse("j", 1, runs, rate=0.001, rate_source="given", job_steps=184)
    assert short.checkpoint is not None and short.checkpoint["job_steps"] == 184
    assert any("no periodic checkpoint is worth its cost" in a for a in short.advice)
    assert not any("checkpoint every ~" in a for a in short.advice)
    local = _analyse("j", 1, runs, 1e-5, "assumed for on-demand capacity", interruptible=False)
    assert local.checkpoint is None
    assert any("not reclaimed by a provider" in n for n in local.not_measured)


def _spot_record(*attempts: tuple[str, int | None]) -> JobRecord:
    """A spot job's record with attempts (outcome, steps lost) of an hour each on 2 nodes."""
    from trainctl.spec.job import JobSpec

    spec = JobSpec(
        entry_point="train.py",
        source_dir=str(FIXTURES / "plainwork"),
        use_spot_instances=True,
        max_run=3600,
        max_wait=7200,
        instance_type="ml.p3.2xlarge",
        region="us-east-1",
    )
    when = "2026-11-27T00:00:00Z"
    record = JobRecord.model_validate(
        {"name": "j", "spec": spec, "store_uri": "file:///s", "source_uri": "file:///s/c",
         "source_sha256": "0" * 64, "owner": "u", "trainctl_version": "0",
         "created_at": when, "updated_at": when}
    )  # fmt: skip
    nodes = [AttemptNode(rank=r, host="h", address="127.0.0.1") for r in (0, 1)]
    for number, (outcome, lost) in enumerate(attempts, start=1):
        record.attempts.append(
            Attempt(
                number=number,
                started_at=f"2026-11-27T{number:02d}:00:00Z",
                ended_at=f"2026-11-27T{number + 1:02d}:00:00Z",
                nodes=nodes,
                outcome=outcome,
                steps_lost=lost,
            )
        )
    return record


def test_the_interval_counts_only_interruptions_that_lose_work():
    """A reclaim the script checkpoints at (its 2-minute notice, a PreemptionFlag) loses
    nothing whatever the interval: the Young/Daly rate counts the ones that lost steps."""
    history = _spot_record(("interrupted", 0), ("interrupted", 40), ("completed", None))
    rate, source = _interruption_rate(history, None)
    assert rate == pytest.approx(1 / 6)  # 1 of 2 interruptions lost work, in 6 node-hours
    assert source.startswith("the job's history: 1 of its 2")
    saved = _spot_record(("interrupted", 0), ("interrupted", 0), ("completed", None))
    rate, source = _interruption_rate(saved, None)
    assert rate == ON_DEMAND_INTERRUPTIONS_PER_HOUR and "saved at their notices" in source
    unknown = _spot_record(("interrupted", None), ("completed", None))  # no steps reported
    assert _interruption_rate(unknown, None)[0] == pytest.approx(1 / 4)

    # No history: the market's rate, spot reclaims only where the script loses them.
    fresh = _spot_record()
    main = _run("2 nodes", 2, 0.1, saves=2, checkpoint_stall=0.2, checkpoint_write=1.0)
    flagged = main.model_copy(update={"notice_handler": "trainctl"})
    assert _notice_unsaved([flagged]) is None
    rate, source = _interruption_rate(fresh, _notice_unsaved([flagged]))
    assert rate == ON_DEMAND_INTERRUPTIONS_PER_HOUR and source.startswith("assumed: ")
    slow = flagged.model_copy(update={"checkpoint_write": 400.0})  # 200 s a save > 120 s
    for run, why in (
        (main, "does not save at it"),
        (main.model_copy(update={"notice_handler": "script"}), "handles SIGTERM itself"),
        (slow, "a save takes 200 s, more than the notice's 120 s"),
    ):
        rate, source = _interruption_rate(fresh, _notice_unsaved([run]))
        assert rate == SPOT_INTERRUPTIONS_PER_HOUR and why in source, source
    # the 100x longer MTBF shows in the advice: an interval 10x longer
    saving = _analyse("j", 2, [flagged], ON_DEMAND_INTERRUPTIONS_PER_HOUR, "assumed: ...")
    losing = _analyse("j", 2, [main], SPOT_INTERRUPTIONS_PER_HOUR, "assumed for spot ...")
    assert saving.checkpoint and losing.checkpoint
    ratio = saving.checkpoint["optimum_seconds"] / losing.checkpoint["optimum_seconds"]
    assert ratio == pytest.approx(math.sqrt(20), rel=1e-3)
    assert any("interruption that loses work" in a for a in losing.advice)
