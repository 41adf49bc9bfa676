"""The Slurm rig itself (tests/rigs/slurm.py), before any provider runs on it (issue 49):
real munged, slurmctld and two slurmd on this machine allocate 2 nodes to a batch script and
start one task per node with srun; an `urgent` job preempts a `batch` one, whose steps get
SIGTERM; stopped with a job still running, the rig leaves no daemon, job step or script
behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.rigs.slurm import SlurmRig, _alive

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]


def _wait(predicate, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(180)
def test_two_nodes_one_task_each_a_preemption_and_nothing_left(tmp_path: Path) -> None:
    rig = SlurmRig(tmp_path / "rig", nodes=2, grace_seconds=3)
    with rig:
        assert rig.node_states() == {"n1": "idle", "n2": "idle"}
        out = tmp_path / "hello.out"
        script = tmp_path / "hello.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"#SBATCH --nodes=2\n#SBATCH --output={out}\n"
            "srun --ntasks-per-node=1 bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME'\n"
        )
        job = rig.slurm("sbatch", "--parsable", str(script)).strip()
        _wait(lambda: job not in rig.queue(), what="the 2-node job to end")
        assert sorted(out.read_text().splitlines()) == ["task 0 on n1", "task 1 on n2"]

        # Preemption: an `urgent` job takes the nodes of a `batch` one, whose steps (srun's
        # tasks, as the provider's node agents will be) get SIGTERM first.
        seen = tmp_path / "sigterm"
        steps_job = tmp_path / "steps.sh"
        steps_job.write_text(
            "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output=/dev/null\n"
            "srun --ntasks-per-node=1 bash -c "
            f'\'trap "echo TERM on $SLURMD_NODENAME >> {seen}; exit 0" TERM; '
            "while true; do sleep 0.2; done'\n"
        )
        victim = rig.slurm("sbatch", "--parsable", "--partition=batch", str(steps_job)).strip()
        _wait(lambda: rig.slurm("squeue", "-h", "-j", victim, "-o", "%t").strip() == "R",
              what="the batch job to run")  # fmt: skip
        time.sleep(1)  # (its steps started)
        urgent = rig.slurm(
            "sbatch", "--parsable", "--partition=urgent", "--nodes=2", "--output=/dev/null",
            "--wrap", "sleep 1",
        ).strip()  # fmt: skip
        _wait(lambda: seen.exists() and len(seen.read_text().splitlines()) == 2,
              what="SIGTERM to both of the preempted job's steps")  # fmt: skip
        assert sorted(seen.read_text().splitlines()) == ["TERM on n1", "TERM on n2"]
        _wait(lambda: not rig.queue(), what="the urgent job to run and end")
        assert urgent not in rig.queue()

        # A job still running when the rig stops: its steps outlive `scontrol shutdown`,
        # and the rig ends them too.
        long = tmp_path / "long.sh"
        long.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output=/dev/null\nsleep 600\n")
        running = rig.slurm("sbatch", "--parsable", str(long)).strip()
        _wait(lambda: rig.slurm("squeue", "-h", "-j", running, "-o", "%t").strip() == "R",
              what="the long job to run")  # fmt: skip
        steps = rig._rig_processes()
        pids = rig._pids()
        assert len(pids) == 4  # munged, slurmctld, 2 x slurmd
        assert len(steps) > len(pids)  # the long job's step and script besides the daemons
    assert not [p for p in {*pids, *steps} if _alive(p)], "something outlived the rig"
    assert not rig._rig_processes()
