"""A rig per provider: the Estimator fields that put a 2-node job on `local`, `ssh` or EC2,
where its nodes are, and what of a job could be left on it (processes found by the job's tag
everywhere; node dirs and the host record for ssh; instances, security groups and key pairs
by tag on EC2).

- `local`: each node a set of processes on this machine;
- `ssh`: two real sshd servers on 127.0.0.2/127.0.0.3;
- `slurm`: a real Slurm cluster on this machine (tests/rigs/slurm.py), its partition `batch`;
- EC2: moto for the AWS APIs, the same sshd servers standing in for the instances, an
  IMDSv2 stand-in for instance-profile credentials, the store in (moto) S3 (tests/rigs/cloud.py).

A test module uses it by importing `rig` (and `cloud`, the fixture behind the EC2 rig) and
parametrizing it indirectly, or with every provider by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers import digits_estimator
from tests.rigs.cloud import ec2_fields, job_resources
from tests.rigs.slurm import job_allocations
from tests.rigs.sshd import job_processes
from trainctl import Estimator
from trainctl.provisioning.ports import LOOPBACK

PROVIDERS = ["local", "ssh", "aws", "slurm"]


@dataclass
class Rig:
    provider: str
    fields: dict[str, Any]  # Estimator fields that put the job on this provider
    addresses: list[str]  # where rank 0 and rank 1 run
    left: Callable[[str], list[str]]  # what of a job is still there

    def estimator(self, **overrides: Any) -> Estimator:
        """examples/digits as a 2-node job on this provider (the conformance suite's HPS),
        with `overrides` on top."""
        from tests.providers.test_provider_conformance import HPS

        return digits_estimator(HPS, **{**self.fields, **overrides})

    def assert_nothing_left(self, job: str) -> None:
        """Nothing of the job anywhere (a detached controller tears down just after it
        records the end: give it a moment)."""
        deadline = time.monotonic() + 60  # EC2's teardown waits for terminations
        while self.left(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.left(job) == [], f"left behind by {job} on {self.provider}"


def _processes(job: str) -> list[str]:
    """The job's processes, and its detached controller (done once it has torn down)."""
    from trainctl.procs import CONTROLLER_TAG, find_tagged

    found = job_processes(job)
    controller = find_tagged(CONTROLLER_TAG, job)
    return ([f"processes {found}"] if found else []) + (
        [f"controller {controller}"] if controller else []
    )


@pytest.fixture(params=PROVIDERS)
def rig(request, home, monkeypatch) -> Rig:
    # A stale lease is what tells `stop` that a controller died: short, so it says so soon.
    monkeypatch.setenv("TRAINCTL_LEASE_SECONDS", "3")
    if request.param == "local":

        def local_left(job: str) -> list[str]:
            nodes = home / "nodes" / job
            return _processes(job) + ([f"node dir {nodes}"] if nodes.exists() else [])

        return Rig("local", {"instance_type": "local"}, ["127.0.0.1"] * 2, local_left)
    if request.param == "slurm":
        cluster = request.getfixturevalue("slurm_cluster")

        def slurm_left(job: str) -> list[str]:
            found = _processes(job)
            if queued := job_allocations(cluster, job):
                found.append(f"allocations {queued}")
            if (home / "slurm" / job).exists():
                found.append("the job's node directories")
            return found

        fields = {"instance_type": "slurm", "slurm": {"partition": "batch"}}
        return Rig("slurm", fields, [LOOPBACK] * 2, slurm_left)
    sshd = request.getfixturevalue("sshd")
    servers = sshd.servers[:2]
    if request.param == "ssh":

        def ssh_left(job: str) -> list[str]:
            found = _processes(job)
            for server in servers:
                if (server.home / ".trainctl" / "nodes" / job).exists():
                    found.append(f"node dir on {server.address}")
            if (home / "ssh" / f"{job}.json").exists():
                found.append("the job's ssh record")
            return found

        hosts = [s.host().model_dump(exclude_defaults=True) for s in servers]
        fields = {"instance_type": "ssh", "hosts": hosts}
        return Rig("ssh", fields, [s.address for s in servers], ssh_left)
    cloud = request.getfixturevalue("cloud")

    def ec2_left(job: str) -> list[str]:
        found = _processes(job)
        found += [f"{kind} {ids}" for kind, ids in job_resources(cloud.ec2, job).items() if ids]
        return found

    return Rig("aws", ec2_fields(cloud), [s.address for s in servers], ec2_left)
