"""End to end on the ssh provider: two real sshd "hosts" on 127.0.0.2 and 127.0.0.3 (this
machine), real agents started over SSH, real torchrun (gloo on loopback) across them.

The hosts share this machine's file system, so the default file:// store in the test's
TRAINCTL_HOME is reachable from both, as a shared store would be.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import log_lines
from tests.rigs.sshd import SshdServer, free_port, job_processes
from trainctl import Estimator
from trainctl.errors import SpecError
from trainctl.protocol import EXIT_INFRA, split_rank
from trainctl.provisioning.ports import MASTER_PORT_RANGE
from trainctl.provisioning.remote import SshProvisionError
from trainctl.provisioning.ssh import SshProvider, SshTeardownError
from trainctl.spec.build import build_spec
from trainctl.spec.capacity import SshHost
from trainctl.spec.request import CapacityRequest

pytestmark = pytest.mark.e2e

TORCHRUN = {"torch_distributed": {"enabled": True}}


def hosts_of(*servers: SshdServer) -> list[dict]:
    return [s.host().model_dump(exclude_defaults=True) for s in servers]


def node_dirs(server: SshdServer, job: str) -> Path:
    return server.home / ".trainctl" / "nodes" / job


def assert_nothing_left(job: str, *servers: SshdServer, home: Path) -> None:
    """No process of the job on the hosts, no node dir, no record (a detached controller
    tears down just after recording the end: give it a moment)."""

    def left() -> list[str]:
        found = [f"processes {job_processes(job)}"] if job_processes(job) else []
        found += [f"node dirs on {s.address}" for s in servers if node_dirs(s, job).exists()]
        if (home / "ssh" / f"{job}.json").exists():
            found.append("the job's ssh record")
        return found

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == [], f"left behind by {job}"


@pytest.mark.timeout(120)
def test_two_node_torchrun_job_over_ssh(sshd, home, source, capsys):
    first, second = sshd.servers
    est = Estimator(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_type="ssh",
        instance_count=2,
        hosts=hosts_of(first, second),
        hyperparameters={"lr": 0.1},
        distribution=TORCHRUN,
        environment={"MY_FLAG": "1"},
    )
    job = est.fit()
    console = capsys.readouterr().out
    info = job.describe()
    assert info["state"] == "Completed" and info["exit_code"] == 0
    # live log lines of both nodes, each with its node's prefix
    # (SM_CURRENT_HOST is the host's address: it resolves from every node, as algo-N would
    # not without root on the hosts)
    assert f"[algo-1] RANKINFO {first.address} 0 0 2" in console
    assert f"[algo-2] RANKINFO {second.address} 1 0 2" in console
    # each rank ran on its own host, in its node dir, named as SageMaker names it
    for host, rank in ((first.address, 0), (second.address, 1)):
        log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log")
        probe = json.loads(next(ln for ln in log_lines(log) if ln.startswith("PROBE "))[6:])
        env = probe["env"]
        assert env["SM_CURRENT_HOST"] == host and env["RANK"] == str(rank)
        assert env["MASTER_ADDR"] == env["SM_MASTER_ADDR"] == first.address
        # the first host picked the rendezvous port as a local job's is picked (and claimed
        # it there, provisioning.ports): below the ephemeral range, where bind(0) picked
        assert MASTER_PORT_RANGE[0] <= int(env["MASTER_PORT"]) <= MASTER_PORT_RANGE[1]
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["MY_FLAG"] == "1"
        assert probe["argv"] == ["--lr", "0.1"]
        # SageMaker's path in the node's own view (its folder on the host is bound there)
        assert probe["cwd"] == "/opt/ml/code" and env["SM_MODEL_DIR"] == "/opt/ml/model"
    nodes = info["attempts"][0]["nodes"]
    assert [(n["host"], n["address"]) for n in nodes] == [
        (first.address, first.address),
        (second.address, second.address),
    ]
    # the model artifact, packed by rank 0
    data = job.store.get_bytes(f"jobs/{job.name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.extractfile("weights.txt").read() == b"trained\n"
    assert est.model_data == info["model_data"]
    assert_nothing_left(job.name, first, second, home=home)


@pytest.mark.mpirun
@pytest.mark.timeout(120)
def test_mpi_across_hosts_starts_each_hosts_processes_through_its_agent(
    sshd, home, source, tmp_path
):
    """distribution mpi over two hosts at different addresses: mpirun on the first starts
    Open MPI's daemon on the second through trainctl's remote shell (no SSH between the
    hosts), so each host's process runs under that host's environment, directory and
    interpreter; they all-reduce across both; nothing is left anywhere."""
    from tests.helpers import require_mpirun
    from trainctl.launcher.threads import usable_cpus
    from trainctl.node.pyenv import _create_overlay_venv

    require_mpirun()
    first, second = sshd.servers
    # The second host's interpreter is at a path of its own, as an SSH host's may be.
    other = tmp_path / "other-python"
    _create_overlay_venv(other)
    second_host = second.host(python=str(other / "bin" / "python"))
    est = Estimator(
        entry_point="allreduce.py",
        source_dir=str(source("mpi")),
        instance_type="ssh",
        instance_count=2,
        hosts=[*hosts_of(first), second_host.model_dump(exclude_defaults=True)],
        distribution="mpi",
        environment={"MY_FLAG": "1"},
    )
    job = est.fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    node0, node1 = (
        job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log") for rank in (0, 1)
    )
    launch = next(ln for ln in log_lines(node0) if "launching: mpirun" in ln)
    assert "-m trainctl.node.remote_start" in launch and "oob_tcp_if_include lo" in launch
    assert "[rank 0]\tSUM 0 3" in node0 and "[rank 1]\tSUM 1 3" in node0
    # each line is its process's, tagged with its rank (the second host's came through its
    # orted, started by its agent)
    ranked = [split_rank(ln) for ln in log_lines(node0)]
    places = {
        rank: json.loads(text.split(" ", 2)[2])
        for rank, text in ranked
        if text.startswith("PLACE ") and text.split()[1] == str(rank)
    }
    threads = str(max(1, usable_cpus() // 2))  # both hosts are this machine
    for rank, server, python in (
        (0, first, sys.executable),
        (1, second, str(other / "bin/python")),
    ):
        assert places[rank] == {
            "SM_CURRENT_HOST": server.address,
            "OMP_NUM_THREADS": threads,
            "MY_FLAG": "1",
            "python": python,
            "cwd": "/opt/ml/code",  # SageMaker's path in the node's own view
        }
    assert "started orted here" in node1
    # each host's processes in that node's own view: its layout at /opt/ml, a mount
    # namespace not the machine's (the second's through its orted, started by its agent)
    views = {
        rank: json.loads(text.split(" ", 2)[2])
        for rank, text in ranked
        if text.startswith("VIEW ") and text.split()[1] == str(rank)
    }
    machine = os.readlink("/proc/self/ns/mnt")
    assert sorted(views) == [0, 1], views
    assert all(v["opt_ml"] and v["mnt"] != machine for v in views.values()), views
    assert_nothing_left(job.name, first, second, home=home)
    # each agent took its endpoint (and token) out of the store as it ended
    attempt = f"jobs/{job.name}/attempts/attempt-1"
    assert not [o.key for o in job.store.list(attempt) if o.key.endswith(".remote-start.json")]


@pytest.mark.timeout(60)
def test_unreachable_host_fails_the_job_before_anything_starts(sshd, home, source, monkeypatch):
    monkeypatch.setattr(SshProvider, "connect_timeout", 1.0)
    first = sshd.servers[0]
    nobody = {"address": "127.0.0.9", "port": free_port("127.0.0.9"), "python": sys.executable}
    est = Estimator(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_type="ssh",
        instance_count=2,
        hosts=[*hosts_of(first), {**nobody, "key_file": str(sshd.client_key)}],
        distribution=TORCHRUN,
    )
    with pytest.raises(SpecError) as raised:
        est.fit(logs=False)
    message = str(raised.value)
    assert message.startswith(f"hosts[1]: root@127.0.0.9:{nobody['port']}: cannot connect")
    assert "\n" not in message
    assert not (home / "store" / "jobs").exists() or not any((home / "store" / "jobs").iterdir())
    assert not (first.home / ".trainctl" / "nodes").exists()


@pytest.mark.timeout(60)
def test_provision_is_all_or_nothing_and_names_the_host(sshd, home, source, monkeypatch):
    """Past preflight (a host going down in between), provisioning fails naming the host,
    and terminate removes what was made on the hosts that answered."""
    monkeypatch.setattr(SshProvider, "connect_timeout", 1.0)
    first = sshd.servers[0]
    port = free_port("127.0.0.9")
    spec = build_spec(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_type="ssh",
        instance_count=2,
        hosts=[*hosts_of(first), {"address": "127.0.0.9", "port": port}],
    )
    provider = SshProvider()
    with pytest.raises(SshProvisionError) as raised:
        provider.provision(CapacityRequest.of(spec), "job-half", 1)
    assert str(raised.value).startswith(
        f"cannot provision 1 ssh host(s): hosts[1]: root@127.0.0.9:{port}: cannot connect"
    )
    assert node_dirs(first, "job-half").is_dir()  # made on the host that answered
    with pytest.raises(SshTeardownError, match=r"could not clean up 1 ssh host"):
        SshProvider().terminate("job-half", grace=0)
    assert not node_dirs(first, "job-half").exists()
    assert (home / "ssh" / "job-half.json").exists()  # kept: the other host is still owed


@pytest.mark.timeout(90)
def test_terminate_from_a_fresh_process_finds_the_hosts_in_its_record(sshd, home, source):
    """A fresh process terminates a job from its record alone (a restarted controller), and
    the agents' SshProcess in the first one see their nodes lost, saying why. (Stopping a
    job, with or without its controller, is in test_provider_conformance.)"""
    first, second = sshd.servers
    sleeper = str(source("sleeper"))
    # provision + start agents in this process, terminate from another one
    spec = build_spec(
        entry_point="train.py",
        source_dir=sleeper,
        instance_type="ssh",
        instance_count=2,
        hosts=hosts_of(first, second),
    )
    provider = SshProvider()
    cluster = provider.provision(CapacityRequest.of(spec), "orphaned-job", 1)
    procs = [
        provider.node_runner(cluster, r).start(
            [sys.executable, "-c", "import time; time.sleep(60)"], {}
        )
        for r in (0, 1)
    ]
    assert len(job_processes("orphaned-job")) >= 4  # a waiter and a sleeper per node
    code = (
        "from trainctl.provisioning.ssh import SshProvider; "
        "SshProvider().terminate('orphaned-job', grace=1)"
    )
    env = {**os.environ, "TRAINCTL_HOME": str(home)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert_nothing_left("orphaned-job", first, second, home=home)
    # ended, and their exit files went with the node dirs: to their SshProcess they are lost
    assert [p.wait(timeout=10) for p in procs] == [EXIT_INFRA, EXIT_INFRA]
    for proc in procs:  # their output ends with why (the run dir itself is gone)
        last = list(proc.lines())[-1]
        assert "ended without an exit code" in last and "counting the node as lost" in last
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)  # idempotent


@pytest.mark.timeout(30)
def test_dry_run_lists_the_requests_without_connecting(tmp_path, home, source):
    key = tmp_path / "id_lab"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETKEYMATERIAL\n")
    spec = build_spec(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_type="ssh",
        instance_count=2,
        hosts=[
            {"address": "10.0.0.5", "user": "ubuntu", "key_file": str(key), "gpus": 8},
            {"address": "10.0.0.6", "port": 2222, "user": "ubuntu", "gpus": 4},
            {"address": "10.0.0.7"},  # beyond instance_count: not used
        ],
    )
    requests = SshProvider().dry_run(CapacityRequest.of(spec), "job-1", 1)
    assert requests == [
        {
            "service": "ssh",
            "operation": "Connect",
            "params": {
                "host": "10.0.0.5",
                "port": 22,
                "user": "ubuntu",
                "rank": 0,
                "python": "python3",
                "key_file": str(key),
                "host_key": "known_hosts",
            },
        },
        {
            "service": "ssh",
            "operation": "CreateNodeDir",
            "params": {
                "host": "10.0.0.5",
                "port": 22,
                "user": "ubuntu",
                "path": "~/.trainctl/nodes/job-1/attempt-1/node-0",
            },
        },
        {
            "service": "ssh",
            "operation": "ReservePort",
            "params": {"host": "10.0.0.5", "port": 22, "user": "ubuntu"},
        },
        {
            "service": "ssh",
            "operation": "Connect",
            "params": {
                "host": "10.0.0.6",
                "port": 2222,
                "user": "ubuntu",
                "rank": 1,
                "python": "python3",
                "host_key": "known_hosts",
            },
        },
        {
            "service": "ssh",
            "operation": "CreateNodeDir",
            "params": {
                "host": "10.0.0.6",
                "port": 2222,
                "user": "ubuntu",
                "path": "~/.trainctl/nodes/job-1/attempt-1/node-1",
            },
        },
    ]
    assert "SECRETKEYMATERIAL" not in json.dumps(requests)
    cluster = SshProvider().planned_cluster(CapacityRequest.of(spec), "job-1", 1)
    assert [n.address for n in cluster.nodes] == ["10.0.0.5", "10.0.0.6"]
    assert cluster.processes_per_host == 4  # the fewest GPUs of the hosts used
    assert cluster.network_env == {}  # not loopback: no interface pinning
    assert not (home / "ssh").exists()  # a dry run records nothing


@pytest.mark.timeout(30)
def test_loopback_master_pins_the_loopback_interface(home, source):
    spec = build_spec(
        entry_point="probe.py",
        source_dir=str(source("probe")),
        instance_type="ssh",
        instance_count=1,
        hosts=[SshHost(address="127.0.0.2").model_dump()],
    )
    cluster = SshProvider().planned_cluster(CapacityRequest.of(spec), "job-1", 1)
    assert cluster.network_env["GLOO_SOCKET_IFNAME"] == "lo"
    assert cluster.processes_per_host == 1
