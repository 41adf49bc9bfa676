"""TensorBoard over a job's logs, as a user meets it: a real job on 2 local nodes writes
scalars with torch's SummaryWriter (tests/fixtures/tensorboard, in the style of SageMaker's
TensorBoard examples) while it runs; `trainctl tensorboard JOB` starts the real TensorBoard,
whose scalars dashboard shows them in headless Chromium while the job is still running, and
the dashboard's "Open TensorBoard" gives a working link. Nothing of TensorBoard is left
behind (process, temp dir)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import TRAINCTL, free_port
from tests.rigs.dashboard import Dashboard, chromium_path

pytestmark = [pytest.mark.e2e]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "tensorboard" / "train.py"
STEPS = 6


def _get_json(url: str) -> object | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _wait_points(url: str, run: str, want: int, timeout: float = 60) -> list:
    base, _, token = url.partition("?")  # the printed URL's ?token=, which every request needs
    query = f"{base}data/plugin/scalars/scalars?run={run}&tag=train/loss&{token}"
    deadline = time.monotonic() + timeout
    points: list = []
    while time.monotonic() < deadline:
        points = _get_json(query) or []  # type: ignore[assignment]
        if isinstance(points, list) and len(points) >= want:
            return points
        time.sleep(0.5)
    raise AssertionError(f"TensorBoard showed {len(points)} of {want} points of {run}")


def _our_tensorboards() -> list[str]:
    out = subprocess.run(
        ["pgrep", "-af", "trainctl.tensorboard.door"], capture_output=True, text=True
    )
    return [line for line in out.stdout.splitlines() if "trainctl-tensorboard-" in line]


def _mirrors() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("trainctl-tensorboard-*")}


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10):
            return 200
    except urllib.error.HTTPError as refused:
        return refused.code


def _assert_behind_its_door(url: str, run: str) -> None:
    """Anyone on the machine can reach a loopback port: without the token TensorBoard shows
    nothing, nor to a page whose name only resolves to loopback (DNS rebinding)."""
    base, _, token = url.partition("?")
    port = base.rsplit(":", 1)[1].strip("/")
    data = f"{base}data/plugin/scalars/scalars?run={run}&tag=train/loss"
    assert _status(base) == 403
    assert _status(data) == 403
    assert _status(f"{data}&token=not-it") == 403
    assert _status(data, {"Cookie": f"trainctl-tensorboard-{port}=not-it"}) == 403
    assert _status(f"{data}&{token}", {"Host": f"rebound.example:{port}"}) == 421
    assert _status(f"{data}&{token}") == 200
    cookie = f"trainctl-tensorboard-{port}={token.removeprefix('token=')}"
    assert _status(data, {"Cookie": cookie}) == 200


@pytest.mark.chromium
@pytest.mark.timeout(300)
def test_a_running_jobs_scalars_in_tensorboard_in_a_browser(home, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard package (trainctl[tensorboard])")
    from playwright.sync_api import sync_playwright

    chromium = chromium_path()
    monkeypatch.setenv("TRAINCTL_TENSORBOARD_SYNC_SECONDS", "0.5")
    mirrors_before = _mirrors()
    boards_before = set(_our_tensorboards())  # (another user's, another test's: not ours)
    hold = tmp_path / "go-on"
    job = "tb-e2e"
    submitted = subprocess.run(
        [TRAINCTL, "submit", str(FIXTURE), "--job-name", job, "--instance-count", "2",
         "-p", f"steps={STEPS}", "-p", f"hold-file={hold}", "--detach"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    port = free_port()
    board = subprocess.Popen(
        [TRAINCTL, "tensorboard", job, "--port", str(port), "--refresh", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ui = None
    try:
        assert board.stderr is not None
        first = board.stderr.readline()
        assert first.startswith("trainctl tensorboard: copying the logs of 1 run(s)"), first
        url = board.stderr.readline().split()[2]
        assert url.startswith(f"http://127.0.0.1:{port}/?token="), url
        points = _wait_points(url, job, STEPS)  # copied while the job still runs
        _assert_behind_its_door(url, job)
        assert [p[1] for p in points[:STEPS]] == list(range(STEPS))
        assert points[0][2] == pytest.approx(1.0)
        status = subprocess.run(
            [TRAINCTL, "status", job, "-o", "json"], capture_output=True, text=True, timeout=60
        )
        assert json.loads(status.stdout)["state"] == "Training", status.stdout
        ui = Dashboard(Path(os.environ["TRAINCTL_HOME"]))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + "#scalars")  # the token leaves a cookie the page's requests carry
            page.get_by_text("train/loss").first.wait_for(timeout=60_000)
            page.locator("tf-scalar-card").first.wait_for(timeout=60_000)  # its chart
            assert page.locator("tf-scalar-card path").count() >= 1  # the line drawn
            assert page.get_by_text(job, exact=True).count() >= 1  # the run is the job
            page.screenshot(path=str(tmp_path / "tensorboard.png"), full_page=True)
            # the dashboard's link: a TensorBoard of its own over the same job
            page.goto(ui.url.split("?")[0] + f"jobs/{job}")
            page.click("#tensorboard-open")
            link = page.locator("#tensorboard-link")
            link.wait_for(timeout=120_000)
            linked = link.get_attribute("href")
            assert linked and linked.startswith("http://127.0.0.1:") and linked != url
            assert "?token=" in linked
            page.goto(linked + "#scalars")
            page.get_by_text("train/loss").first.wait_for(timeout=60_000)
            browser.close()
        _wait_points(linked, job, STEPS)
        # the POST needs its header (another site's page cannot send it)
        request = urllib.request.Request(
            ui.url.split("?")[0] + f"api/jobs/{job}/tensorboard", method="POST", data=b""
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        refused.value.close()
    finally:
        hold.touch()
        if ui is not None:
            ui.close()
        board.send_signal(signal.SIGTERM)  # `kill PID` ends its TensorBoard too
        board.communicate(timeout=30)  # (reaps it and closes its pipes)
    waited = subprocess.run([TRAINCTL, "attach", job], capture_output=True, text=True, timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    deadline = time.monotonic() + 15
    while set(_our_tensorboards()) - boards_before and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not set(_our_tensorboards()) - boards_before, "a TensorBoard of this test was left"
    assert _mirrors() == mirrors_before, "a TensorBoard mirror was left behind"


@pytest.mark.timeout(60)
def test_tensorboard_refuses_in_one_line(home):
    for args, code, words in (
        (["no-such-job"], 1, "no job or tuning job named 'no-such-job'"),
        (["x", "--host", "0.0.0.0"], 2, "--host: 0.0.0.0 is not a loopback address"),
        (["x", "--port", "70000"], 2, "--port: must be 0-65535"),
    ):
        result = subprocess.run(
            [TRAINCTL, "tensorboard", *args], capture_output=True, text=True, timeout=30
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code and len(lines) == 1, result.stderr
        assert words in lines[0]


@pytest.mark.timeout(120)
def test_profile_runs_torchs_profiler_over_the_steps_asked_into_the_tensorboard_logs(home):
    """An unchanged script's optimizer steps 2-4 (after the first 2, 3 of them), each rank's
    trace under profiler/ in the job's TensorBoard logs (node-1/ for the second node)."""
    fixture = FIXTURE.with_name("profiled.py")
    result = subprocess.run(
        [TRAINCTL, "submit", str(fixture), "--job-name", "prof", "--profile", "2:3",
         "--instance-count", "2"],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    logs = Path(os.environ["TRAINCTL_HOME"]) / "store" / "jobs" / "prof" / "tensorboard"
    traces = sorted(logs.rglob("*.pt.trace.json"))
    assert [t.relative_to(logs).parts[:-1] for t in traces] == [
        ("node-1", "profiler"),
        ("profiler",),
    ]
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        steps = [e for e in events if e.get("name", "").startswith("Optimizer.step#SGD.step")]
        assert len(steps) == 3, trace
    bad = subprocess.run(
        [TRAINCTL, "submit", str(fixture), "--profile", "5"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "profile" in bad.stderr and "START:COUNT" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.timeout(180)
def test_sagemakers_tensorboard_and_profiler_configs_both_sdks(home, tmp_path):
    """v2: tensorboard_output_config and profiler_config's FrameworkProfile; v3:
    with_tensorboard_output_config. The scalars and traces land at the s3_output_path given."""
    import warnings

    from trainctl.sagemaker.debugger import (
        FrameworkProfile,
        ProfilerConfig,
        TensorBoardOutputConfig,
    )
    from trainctl.sagemaker.pytorch import PyTorch
    from trainctl.sagemaker.train import ModelTrainer
    from trainctl.sagemaker.train import configs as v3

    v2_logs, v3_logs = tmp_path / "v2-tb", tmp_path / "v3-tb"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # honoured: no warning
        estimator = PyTorch(
            entry_point="profiled.py",
            source_dir=str(FIXTURE.parent),
            role="arn:aws:iam::111122223333:role/SageMakerRole",
            instance_type="local",
            instance_count=1,
            tensorboard_output_config=TensorBoardOutputConfig(
                s3_output_path=v2_logs.as_uri(),
                container_local_output_path="/opt/ml/output/tensorboard",
            ),
            profiler_config=ProfilerConfig(
                framework_profile_params=FrameworkProfile(start_step=1, num_steps=2)
            ),
        )
    estimator.fit(wait=True, logs=False)
    traces = list(v2_logs.glob("profiler/*.pt.trace.json"))
    assert len(traces) == 1, sorted(v2_logs.rglob("*"))
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert sum(e.get("name", "").startswith("Optimizer.step#SGD.step") for e in events) == 2
    trainer = ModelTrainer(
        source_code=v3.SourceCode(source_dir=str(FIXTURE.parent), entry_script="train.py"),
        compute=v3.Compute(instance_type="local", instance_count=1),
        hyperparameters={"steps": 3, "step-seconds": 0},
    ).with_tensorboard_output_config(v3.TensorBoardOutputConfig(s3_output_path=str(v3_logs)))
    trainer.train(wait=True, logs=False)
    assert len(list(v3_logs.glob("events.out.tfevents.*"))) == 1
    assert trainer._latest_training_job is not None
