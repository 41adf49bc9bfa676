"""The suite on a machine in another state than this one: a docker CLI whose daemon is not
running (Docker Desktop not started) and a podman that does not answer. The tests that pass
SageMaker's framework_version expect the warning such a machine gets rather than fail."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(180)
def test_the_sagemaker_tests_pass_where_no_container_engine_answers(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for engine in ("docker", "podman"):  # installed, but nothing answers `info`
        (bin_dir / engine).write_text("#!/bin/sh\necho 'cannot connect' >&2\nexit 1\n")
        (bin_dir / engine).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock",
        "TRAINCTL_CONTAINER_ENGINE": "",
    }
    env.pop("CI", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-m", "not e2e and not kernel", "tests/e2e/test_sagemaker_shim.py",
         "--basetemp", str(tmp_path / "pytest")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
