"""The worker hook (trainctl/node/worker_site/sitecustomize.py) in real Python processes: a
rank registers, its stacks are taken without stopping it, the process groups it forms are
noted, a process that is no rank is left alone, and the sitecustomize it shadows still runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl.node.ranks import dump_stacks, groups, hook_env, prepare, registered

pytestmark = pytest.mark.timeout(90)

RANK_SCRIPT = """
import sys, time
import torch.distributed as dist
from torch.distributed import init_process_group  # bound before the group forms
init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.destroy_process_group()
print("grouped", flush=True)

def wait_for_the_peer():
    time.sleep(60)

wait_for_the_peer()
"""


def test_a_rank_registers_its_stacks_are_taken_and_its_groups_noted(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    prepare(ranks)
    shadowed = tmp_path / "site"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['MARK'], 'a').write('ran\\n')\n"
    )
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    env = hook_env({**os.environ, "PYTHONPATH": str(shadowed)}, ranks)
    env["MARK"] = str(tmp_path / "mark")
    rank = subprocess.Popen(
        [sys.executable, str(tmp_path / "rank.py"), str(tmp_path / "store")],
        env={**env, "RANK": "3", "LOCAL_RANK": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "grouped"
        # not a rank (no launcher's variables): untouched, but the shadowed site still runs
        other = subprocess.run(
            [sys.executable, "-c", "print('plain')"], env=env, capture_output=True, timeout=30
        )
        assert other.returncode == 0 and other.stdout == b"plain\n"
        [process] = registered(ranks)
        assert (process.pid, process.rank) == (rank.pid, 3)
        assert groups(ranks).largest == 1
        dumps = dump_stacks(ranks, str(tmp_path))
        assert [d.rank for d in dumps] == [3]
        assert dumps[0].waits_in == "wait_for_the_peer (rank.py:10)"  # its own code: no "from"
        assert "line 10 in wait_for_the_peer" in dumps[0].text
        time.sleep(0.2)
        assert rank.poll() is None, "taking its stacks stopped nothing"
    finally:
        rank.kill()
        rank.wait()
    assert (tmp_path / "mark").read_text() == "ran\nran\n"  # in both processes
    assert registered(ranks) == []  # gone


def test_sagemakers_packages_import_from_the_stand_ins_only_where_not_installed(tmp_path):
    """`sagemaker_training` and `smdistributed` import in a job's process from the hook's
    stand-ins; an installed one (a SageMaker image's) is found first."""
    probe = (
        "import sagemaker_training.environment as e, smdistributed.dataparallel.torch as t;"
        "print(e.__file__); print(t.__file__)"
    )
    env = hook_env({**os.environ, "PYTHONPATH": ""}, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    toolkit, smddp = done.stdout.split()
    assert "/worker_site/compat/sagemaker_training/" in toolkit
    assert "/worker_site/compat/smdistributed/dataparallel/torch/" in smddp
    installed = tmp_path / "site" / "sagemaker_training"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    (installed / "environment.py").write_text("REAL = True\n")
    env = hook_env({**os.environ, "PYTHONPATH": str(tmp_path / "site")}, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == str(installed / "environment.py")
