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
