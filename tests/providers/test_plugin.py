"""A provider is one package that registers itself: an installed plug-in (an entry point in
`trainctl.providers`) brings its instance types and runs a job, with no edit to trainctl."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import FIXTURES, TRAINCTL

PLUGINS = FIXTURES / "plugins"


def _trainctl(*args: str, plugins: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if plugins:  # as if `pip install trainctl-toycloud` had put it on the path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
    return subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.smoke
@pytest.mark.timeout(120)
def test_an_installed_provider_plugin_runs_a_job(home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import os\nprint('on', os.environ['SM_CURRENT_HOST'])\n")
    ran = _trainctl(
        "submit", "train.py", "--source-dir", str(src), "--instance-type", "toy.small",
        "--instance-count", "2", "--job-name", "toy", "-o", "json",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    info = json.loads(ran.stdout)
    assert info["state"] == "Completed"
    assert info["instance_type"] == "toy.small", info
    plan = _trainctl("submit", "train.py", "--source-dir", str(src), "--instance-type",
                     "toy.small", "--dry-run", "-o", "json")  # fmt: skip
    assert json.loads(plan.stdout)["provider"] == "toycloud"
    # without the plug-in installed, its instance type is unknown: one line, exit 2
    missing = _trainctl("submit", "train.py", "--source-dir", str(src), "--instance-type",
                        "toy.small", "--dry-run", plugins=False)  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: instance_type: unknown instance type 'toy.small'")


@pytest.mark.timeout(60)
def test_a_plugin_that_does_not_load_is_left_out_with_one_line(home, tmp_path):
    """A stale or broken plug-in (its module gone, an import error in it) made every command
    end in a traceback. It is left out, said once, and the rest of trainctl works."""
    site = tmp_path / "site"
    info = site / "trainctl_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainctl-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[trainctl.providers]\nbroken = trainctl_broken:PLUGIN\n"
    )
    (site / "trainctl_broken.py").write_text("raise ImportError('needs a cloud SDK not here')\n")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    )
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('ok')\n")
    done = subprocess.run(
        [TRAINCTL, "submit", "train.py", "--source-dir", str(src), "--dry-run", "-o", "json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["provider"] == "local"
    warnings = [line for line in done.stderr.splitlines() if "broken" in line]
    assert warnings == [
        "warning: provider plug-in 'broken' (trainctl_broken:PLUGIN) does not load, left out: "
        "ImportError: needs a cloud SDK not here"
    ], done.stderr
    assert "Traceback" not in done.stderr
