"""A job's processes are its own: two homes on one machine (two users, two test runs) may
each have a job of the same name, and one's end must not end the other's processes (they
were found by the job's name alone, so the first to finish killed the other's agent)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.helpers import TRAINCTL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_job_ending_leaves_another_homes_job_of_the_same_name_running(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "quick.py").write_text("print('quick done', flush=True)\n")
    (src / "slow.py").write_text(
        "import time\nprint('slow started', flush=True)\ntime.sleep(4)\n"
        "print('slow done', flush=True)\n"
    )

    def submit(home: str, script: str) -> subprocess.Popen[str]:
        env = {**os.environ, "TRAINCTL_HOME": str(tmp_path / home)}
        env.pop("TRAINCTL_STORE", None)
        return subprocess.Popen(
            [TRAINCTL, "submit", script, "--source-dir", str(src), "--job-name", "same-name"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    slow = submit("home-a", "slow.py")
    try:
        # the quick one starts once the slow one's script runs, and ends while it still does
        log = tmp_path / "home-a/store/jobs/same-name/logs/attempt-1/node-0.log"
        for _ in range(600):
            if log.exists() and "slow started" in log.read_text():
                break
            time.sleep(0.1)
        quick = submit("home-b", "quick.py")
        quick_out, _ = quick.communicate(timeout=60)
        assert quick.returncode == 0, quick_out
        slow_out, _ = slow.communicate(timeout=60)
    finally:
        slow.kill()
    assert slow.returncode == 0 and "slow done" in slow_out, slow_out
    assert "job same-name: Completed" in slow_out
