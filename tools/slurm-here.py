"""A Slurm cluster on this machine, to try trainctl's Slurm provider without one:

    sudo .venv/bin/python tools/slurm-here.py start    # munged, slurmctld, two slurmd
    trainctl submit train.py --source-dir examples/digits --instance-type slurm \
        --instance-count 2
    sudo .venv/bin/python tools/slurm-here.py stop     # cancels its jobs, stops it all

It is the test suite's rig (tests/rigs/slurm.py: everything under one folder, default
~/.trainctl/slurm-here, with its own ports; partitions `batch` and `urgent`, which preempts
it). Slurm's commands find a cluster through /etc/slurm/slurm.conf or SLURM_CONF: where the
machine has no /etc/slurm/slurm.conf, `start` links it to the rig's, so every shell finds
the rig, and `stop` removes the link; otherwise it prints the SLURM_CONF to export. Needs
root (slurmd starts jobs as their users) and Slurm (`make test-deps`, or apt-get install
slurm-wlm munge).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests.rigs, from a clone)

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
NODES = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("folder", nargs="?", default=str(Path.home() / ".trainctl" / "slurm-here"))
    args = parser.parse_args()
    from tests.rigs.slurm import SlurmRig, missing_slurm

    if (why := missing_slurm()) is not None:
        print(f"error: cannot start Slurm here: {why}", file=sys.stderr)
        return 2
    root = Path(args.folder).expanduser().resolve()
    rig = SlurmRig(root, nodes=NODES)
    if args.action == "stop":
        rig._started = ["munged", "slurmctld", "slurmd"]  # (started by an earlier call)
        rig.stop()
        if SYSTEM_CONF.is_symlink() and SYSTEM_CONF.resolve() == rig.conf:
            SYSTEM_CONF.unlink()
        print(f"stopped the Slurm cluster in {root}")
        return 0
    if (root / "slurmctld.pid").exists():
        print(f"error: {root} holds a cluster already: stop it first", file=sys.stderr)
        return 2
    rig.start()
    print(f"Slurm is up: {NODES} nodes, partitions batch (default) and urgent; its files in {root}")
    if not SYSTEM_CONF.exists():
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(rig.conf)
        print(f"{SYSTEM_CONF} -> {rig.conf}: Slurm's commands find it from every shell")
    else:
        print(f"{SYSTEM_CONF} is another cluster's: in each shell, export SLURM_CONF={rig.conf}")
    print(f"stop it with: {sys.executable} {Path(__file__).resolve()} stop {root}")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
