"""Metric history: every value with step, attempt, node and time, bounded, continuing across
a relaunch with redone steps marked; `trainctl metrics` (table, json, csv, --plot) and
`status`'s sparkline, from the installed CLI."""

from __future__ import annotations

import csv
import io
import itertools
import json
import subprocess

import pytest

from tests.helpers import TRAINCTL, on_a_terminal
from trainctl.metrics import MetricRecorder, mark_redone, numeric_metrics, sparkline


@pytest.mark.timeout(30)
def test_history_is_bounded_per_metric_and_attempt():
    recorder = MetricRecorder(cap=100)
    kept = sum(recorder.add("loss", 1.0, step=i, attempt=1, rank=0) for i in range(100_000))
    assert kept <= 100 * (1 + 10) + 1  # cap x (1 + log2(values / cap)): 1,000x fewer
    steps = [p["step"] for p in recorder.take()]
    assert steps[:100] == list(range(100))  # the start is whole
    assert steps[-1] > 90_000  # and the end is still covered
    gaps = {b - a for a, b in itertools.pairwise(steps)}
    assert max(gaps) <= 1024  # thinned evenly, not cut off
    assert recorder.add("acc", 0.5, step=1, attempt=1, rank=0)  # other metrics unaffected


@pytest.mark.timeout(30)
def test_redone_steps_are_marked_and_values_filtered():
    points = [
        {"name": "loss", "value": v, "step": s, "attempt": a}
        for a, s, v in [(1, 10, 1.0), (1, 20, 0.8), (1, 30, 0.7), (2, 21, 0.79), (2, 30, 0.69)]
    ]
    mark_redone(points, {1: 0, 2: 20})  # attempt 2 resumed from the checkpoint of step 20
    assert [p["redone"] for p in points] == [False, False, True, False, False]
    assert numeric_metrics({"loss": 1, "flag": True, "nan": float("nan"), "s": "x"}) == {
        "loss": 1.0
    }
    assert sparkline([3, 2, 1]) == "█▄▁"
    assert len(sparkline(list(range(1000)), width=24)) == 24


def test_a_chart_names_each_attempts_steps_even_when_a_relaunch_line_crosses_its_corner():
    """plotext's legend sits where a loss curve starts; a relaunch at step 13 draws its line
    through it (CI saw "attempt 1" gone from the chart): the steps per attempt follow it."""
    from trainctl.metrics import terminal_chart

    points = [
        {"name": "loss", "value": 2.3 - 0.01 * step, "step": step, "attempt": 1 + (step > 12)}
        for step in range(1, 185)
    ]
    chart = terminal_chart(points, "loss")
    assert chart.splitlines()[-1].split() == [
        "attempt", "1:", "steps", "1-12", "·", "attempt", "2:", "steps", "13-184"
    ]  # fmt: skip


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_loss_curve_across_a_relaunch_from_the_cli(relaunched_digits, monkeypatch):
    home, job = relaunched_digits  # shared with the dashboard's test: read-only here
    monkeypatch.setenv("TRAINCTL_HOME", str(home))
    monkeypatch.delenv("TRAINCTL_STORE", raising=False)
    info = job.describe()
    assert info["state"] == "Completed" and len(info["attempts"]) == 2
    resumed = info["attempts"][1]["resumed_from_step"]
    # The example counts its work from whole epochs, a resumed one too: one total throughout.
    from trainctl.record.jobstore import JobStore

    events = JobStore(job.store, job.name).events()
    assert "total_changed" not in [e["type"] for e in events]
    assert "trained_apart" not in [e["type"] for e in events]  # DDP: together, as it says
    assert info["progress"]["step"] == info["progress"]["total_steps"], info["progress"]
    history = job.metric_history()
    losses = [p for p in history if p["name"] == "loss"]
    assert {p["attempt"] for p in losses} == {1, 2}
    assert all(p["rank"] == 0 and p["step"] is not None for p in losses)
    second = [p["step"] for p in losses if p["attempt"] == 2]
    assert min(second) == resumed + 1  # the curve continues from the checkpoint
    redone = [p for p in losses if p["redone"]]
    assert redone and all(p["attempt"] == 1 and p["step"] > resumed for p in redone)
    frame = job.metrics()  # pandas is installed here
    # the loss each step, the held-out accuracy each epoch
    assert len(frame) == len(history) and set(frame["name"]) == {"loss", "test_accuracy"}

    table = _run("metrics", job.name).stdout
    assert "loss" in table and "TREND" in table
    rows = list(csv.DictReader(io.StringIO(_run("metrics", job.name, "-o", "csv").stdout)))
    assert len(rows) == len(history) and rows[0]["name"] == "loss"
    as_json = json.loads(_run("metrics", job.name, "-o", "json", "-m", "loss").stdout)
    assert len(as_json) == len(losses)
    chart = _run("metrics", job.name, "--plot").stdout
    assert "attempt 1" in chart and "attempt 2" in chart and "loss:" in chart
    status = _run("status", job.name).stdout
    assert "loss=" in status and any(c in status for c in "▁▂▃▄▅▆▇█")
    # where its node-time went: the kill's lost steps among the badput (record.goodput)
    goodput = info["goodput"]
    assert 0 < goodput["goodput"] < 1 and [a["attempt"] for a in goodput["attempts"]] == [1, 2]
    said = " ".join(status.split())  # (a long line wraps on a narrow terminal)
    assert f"goodput {round(100 * goodput['goodput'])} % of" in said, status
    if info["attempts"][0]["steps_lost"]:
        assert "steps redone after a loss" in said, status
    # the relaunch's stages since the kill, as bench/recovery.py names them
    assert "recovery attempt ended " in said and " first step " in said, status
    status_json = json.loads(_run("status", job.name, "-o", "json").stdout)
    assert status_json["goodput"]["paid_node_hours"] == goodput["paid_node_hours"]

    unknown = _run("metrics", job.name, "--metric", "nope", check=False)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        f"error: --metric: job {job.name} has no metric 'nope' (its metrics: loss, test_accuracy)"
    ]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_job_without_metrics_says_so(home, tmp_path):
    from trainctl import Estimator

    (tmp_path / "hello.py").write_text("print('hello')\n")
    job = Estimator(entry_point="hello.py", source_dir=str(tmp_path)).fit(logs=False)
    result = _run("metrics", job.name, check=False)
    assert result.returncode == 2
    assert "has no metrics" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_metrics_follow_redraws_in_place_on_a_terminal(relaunched_digits, monkeypatch):
    """`metrics -f` on a terminal: one view redrawn in place (rich's live display), which
    stays when the job has ended; no screen is cleared."""
    import os

    home, job = relaunched_digits
    env = {**os.environ, "TRAINCTL_HOME": str(home)}
    env.pop("TRAINCTL_STORE", None)
    code, seen = on_a_terminal(env, "metrics", job.name, "-f")
    assert code == 0, seen
    assert "loss" in seen and "TREND" in seen
    assert "\x1b[2J" not in seen  # (the old redraw cleared the whole screen)
