"""`trainctl ui` in a real headless browser (Chromium from Debian, driven by Playwright): the
job list and the page of a real finished 2-node job that was relaunched once - its loss chart
has points from both attempts, the attempts table has the relaunch, the log panel shows
`[algo-2]` lines, the model downloads. The dashboard never writes to the store and never shows
a secret; a token guards it when set; a port in use is one line. Screenshots are saved under
the test's tmp dir."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import RELAUNCHED_SECRET, TRAINCTL, free_port
from tests.rigs.dashboard import Dashboard, chromium_path

pytestmark = [pytest.mark.e2e, pytest.mark.chromium]
SECRET = RELAUNCHED_SECRET


@pytest.fixture
def relaunched_job(relaunched_digits):
    """The session's finished 2-node digits job, relaunched once (tests/conftest.py)."""
    return relaunched_digits


def _store_snapshot(home: Path) -> dict[str, tuple[int, int]]:
    root = home / "store"
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.mark.timeout(300)
def test_job_list_and_job_page_in_a_real_browser(relaunched_job, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = chromium_path()
    home, job = relaunched_job
    # A line of one of several processes, as a node's log keeps it (protocol.ranked_line):
    # the page labels it with its host and rank.
    log = home / "store" / "jobs" / job.name / "logs" / "attempt-2" / "node-1.log"
    if "[rank 3]\t" not in log.read_text():
        log.write_text(log.read_text() + "[rank 3]\tfrom the fourth process\n")
    # Whoever writes the job's output (its script; a shared --output-path) may name a file
    # to break out of its link, or leave a FIFO that hangs a reader (issue 58).
    output = home / "store" / "jobs" / job.name / "output"
    odd = "it's <b>\"odd\" & 'quoted'.txt"
    (output / odd).write_text("odd\n")
    if not (output / "pipe").exists():
        os.mkfifo(output / "pipe")
    before = _store_snapshot(home)
    ui = Dashboard(home)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(ui.url)
            row = page.locator("tr.job-row", has_text=job.name)
            row.wait_for(timeout=30_000)
            assert "Completed" in row.inner_text()
            page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)

            page.click(f"text={job.name}")
            page.wait_for_selector("body[data-loaded='1']", timeout=60_000)
            points = page.locator(".chart[data-metric='loss'] circle.pt").count()
            assert points > 20, points
            assert page.locator(".chart[data-metric='loss'] path.line").count() == 2  # attempts
            # the latest value as a person reads it; whole steps on the x axis
            title = page.locator(".chart[data-metric='loss'] .title span").inner_text()
            assert re.fullmatch(r"\d\.\d{1,4}(e-\d+)?|0\.0*\d{1,4}", title), title
            steps = page.locator(".chart[data-metric='loss'] svg text.xtick").all_text_contents()
            assert steps and all(re.fullmatch(r"\d+", tick) for tick in steps), steps
            attempts = page.locator("#attempts-table tr.attempt")
            assert attempts.count() == 2
            # a bar per attempt of where its paid node-time went, the share trained beside it
            goodput = job.describe()["goodput"]
            assert page.locator("#goodput").inner_text() == goodput["text"]
            for a in goodput["attempts"]:
                bar = page.locator(f"#goodput-attempt-{a['attempt']}")
                assert bar.locator(".share").inner_text() == f"{round(100 * a['goodput'])} %"
                trained = bar.locator(".segment[data-cause='training']")
                assert trained.count() == 1 and trained.bounding_box()["width"] > 0
            assert "killed by injected fault kill:1@step25" in attempts.nth(0).inner_text()
            assert "from scratch" in attempts.nth(0).inner_text()  # where each started
            assert "step " in attempts.nth(1).inner_text()
            restored = page.locator("#restored-by-node").inner_text()  # the relaunch's, per node
            per_node = r"algo-1: \d+ checkpoint file\(s\).* · algo-2: \d+"
            assert re.search(per_node, restored), restored
            node2 = page.locator("pre[data-node='algo-2']").first.inner_text()
            assert "[algo-2]" in node2 and "@@trainctl@@" not in node2
            relaunched = page.locator("pre#log-2-1")
            page.wait_for_function(
                "document.getElementById('log-2-1').textContent.includes('fourth process')"
            )
            assert "[algo-2:3] from the fourth process" in relaunched.inner_text()
            model = page.locator("#artifacts-table a", has_text="output/model.tar.gz")
            assert model.count() == 1
            with page.expect_download() as download:
                model.click()
            saved = tmp_path / "model.tar.gz"
            download.value.save_as(saved)
            assert saved.read_bytes() == job.store.get_bytes(f"jobs/{job.name}/output/model.tar.gz")
            table = page.locator("#artifacts-table")
            assert page.locator("#artifacts-table b").count() == 0  # its name is text
            assert "pipe" not in table.inner_text()  # a FIFO is no artifact
            named = page.locator("#artifacts-table a", has_text=f"output/{odd}")
            assert named.count() == 1, table.inner_html()
            with page.expect_download() as download:
                named.click()
            assert Path(download.value.path()).read_text() == "odd\n"
            page.screenshot(path=str(tmp_path / "job.png"), full_page=True)
            assert SECRET not in page.content()
            browser.close()
        for path in ("/api/jobs", f"/api/jobs/{job.name}", f"/api/jobs/{job.name}/metrics"):
            status, body = ui.get(path)
            assert status == 200 and SECRET.encode() not in body
        assert ui.get("/api/jobs/no-such-job")[0] == 404
        assert ui.get(f"/api/jobs/{job.name}/files/../../etc/passwd")[0] in (400, 404)
    finally:
        ui.close()
    assert (tmp_path / "job.png").stat().st_size > 10_000
    assert _store_snapshot(home) == before, "the dashboard changed the store"


@pytest.mark.timeout(60)
def test_a_token_guards_the_dashboard(home):
    ui = Dashboard(home, "--token", "letmein-0123456789")
    try:
        assert ui.url.endswith("?token=letmein-0123456789")
        assert ui.get("/api/jobs")[0] == 401
        assert ui.get("/api/jobs?token=wrong")[0] == 401
        assert ui.get("/api/jobs?token=letmein-0123456789") == (200, b"[]")
    finally:
        ui.close()
    from trainctl.ui import check_bind

    assert check_bind("0.0.0.0", 8377, None)  # any other address gets a token made for it
    assert check_bind("127.0.0.1", 8377, None) is None


@pytest.mark.timeout(60)
def test_a_port_in_use_is_one_line(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [TRAINCTL, "ui", "--port", str(port)], capture_output=True, text=True, timeout=30
        )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --port: 127.0.0.1:{port} is in use")
    assert time.monotonic() - started < 20


@pytest.mark.timeout(240)
def test_curve_and_logs_grow_while_the_job_trains(home, tmp_path):
    """Watching a running job: the browser's loss chart and log panel grow as it trains;
    `trainctl metrics -f` follows it to its end."""
    from playwright.sync_api import sync_playwright

    from tests.train.test_fault_tolerance import digits

    chromium = chromium_path()
    job = digits(step_delay=0.05, hyperparameters={"epochs": 60, "lr": 0.1, "seed": 0}).fit(
        wait=False
    )
    follower = subprocess.Popen(
        [TRAINCTL, "metrics", job.name, "-f", "-o", "csv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ui = Dashboard(home)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(ui.url.rstrip("/") + f"/jobs/{job.name}")
            points = page.locator(".chart[data-metric='loss'] circle.pt")
            page.wait_for_function(
                "document.querySelectorAll(\".chart[data-metric='loss'] circle.pt\").length > 5",
                timeout=90_000,
            )
            first, lines = points.count(), page.locator("pre[data-node='algo-1']").inner_text()
            page.wait_for_function(
                f"document.querySelectorAll(\".chart[data-metric='loss'] circle.pt\").length"
                f" > {first}",
                timeout=30_000,
            )
            assert page.locator("body").get_attribute("data-state") == "Training"
            # the script says its work (report_step's total): how far, and the time left
            progress = page.locator("#progress").inner_text()
            assert re.fullmatch(r"[\d,]+/[\d,]+ steps \(\d+%\), ~\d+m\d\ds left", progress), (
                progress
            )
            page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
            assert len(page.locator("pre[data-node='algo-1']").inner_text()) >= len(lines)
            browser.close()
    finally:
        ui.close()
        job.stop(wait=True)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    rows = out.splitlines()
    assert rows[0] == "time,name,value,step,attempt,rank,redone"
    assert out.count("time,name,value") == 1  # streamed: each value once, one header
    # each loss value once (the held-out accuracy shares its epoch's last step)
    steps = [int(r.split(",")[3]) for r in rows[1:] if r.split(",")[1] == "loss"]
    assert len(steps) > 10 and len(set(steps)) == len(steps)


@pytest.mark.timeout(120)
def test_an_unreachable_store_is_one_line(home):
    """Nothing listens at the store's endpoint (a closed loopback port): one line, exit 1."""
    env = {
        **os.environ,
        "TRAINCTL_STORE": "s3://no-such-bucket/store",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    result = subprocess.run(
        [TRAINCTL, "ui", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the store s3://")


@pytest.mark.timeout(60)
def test_measurement_runs_are_listed_only_when_asked_for(home, tmp_path):
    """diagnose's measurement runs stay out of the job list (as in `trainctl jobs`) unless
    the page asks for them (`?all=1`, its "show" link)."""
    from trainctl.controller.submit import create_derived_job, create_job
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    store = open_store((home / "store").as_uri())
    parent = create_job(build_spec(entry_point="train.py", source_dir=str(tmp_path / "src")), store)
    create_derived_job(store, parent, f"{parent.name}-dx-1n-000000", {}, measurement=True)
    ui = Dashboard(home)
    try:
        listed = json.loads(ui.get("/api/jobs")[1])
        assert [j["name"] for j in listed] == [parent.name]
        every = json.loads(ui.get("/api/jobs?all=1")[1])
        assert sorted(j["measurement_of"] or "" for j in every) == ["", parent.name]
    finally:
        ui.close()
