"""A real Slurm cluster on this machine for the Slurm provider's tests: munged, slurmctld and
one slurmd per node (Slurm's multiple-slurmd mode: each node its own NodeName and port on
127.0.0.1, as Debian's slurm-wlm builds it), all under one temp dir with their own ports,
sockets, state and logs, so a test touches nothing of the machine's.

Two partitions over the same nodes, whole nodes to a job: `batch` (the default) and
`urgent`, which preempts it (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE with a
GraceTime): the preempted job's steps (what `srun` started, as the provider's node agents
will be) get SIGTERM, then SIGKILL after the grace, and the job is requeued; a batch script
outside any step gets no signal. (A preemptible QoS would need slurmdbd and a database.)

`stop()` cancels every job of the rig, shuts the daemons down (scontrol shutdown, then
munged -s), and ends whatever still runs with the rig's SLURM_CONF in its environment (job
steps outlive `scontrol shutdown` by design); the caller's tmp dir goes with the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import free_port, require_part

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue")


def missing_slurm() -> str | None:
    """Why the rig cannot run here (None: it can)."""
    for program in PROGRAMS:
        if shutil.which(program) is None and not Path("/usr/sbin", program).exists():
            return f"{program} is not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the rig runs slurmd as root (it starts jobs as their users)"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmRig:
    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2, grace_seconds: int = 10) -> None:
        require_part("slurm", missing_slurm())
        self.root = root
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.grace_seconds = grace_seconds
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._started: list[str] = []

    # -- starting -----------------------------------------------------------------------
    def start(self) -> SlurmRig:
        try:
            self._start_munge()
            self._write_conf()
            self._run([_program("slurmctld"), "-i"])
            self._started.append("slurmctld")
            for node in self.nodes:
                (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
                self._run([_program("slurmd"), "-N", node])
            self._started.append("slurmd")
            self.wait_idle(len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(parents=True, mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._run(
            [
                _program("munged"),
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={munge / 'log'}",
                f"--pid-file={munge / 'pid'}",
                f"--seed-file={munge / 'seed'}",
            ]
        )
        self._started.append("munged")

    def _write_conf(self) -> None:
        root = self.root
        for sub in ("state", "log", "spool"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
            f"CPUs={self.cpus} State=UNKNOWN"
            for n in self.nodes
        )
        names = ",".join(self.nodes)
        grace = self.grace_seconds
        batch = f"Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={grace}"
        whole = "OverSubscribe=EXCLUSIVE"  # a job's nodes are its own (and can be preempted)
        self.conf.write_text(
            f"""ClusterName=rig
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=batch Nodes={names} {batch} {whole}
PartitionName=urgent Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2 {whole}
"""
        )

    def _run(self, argv: list[str]) -> None:
        subprocess.run(argv, env=self.env, check=True, capture_output=True, timeout=30)

    # -- looking ------------------------------------------------------------------------
    def slurm(self, *argv: str, timeout: float = 30) -> str:
        """A Slurm command (sinfo, squeue, scontrol...) against the rig; its stdout."""
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                states = self.node_states()
            except (RuntimeError, subprocess.TimeoutExpired):
                states = {}
            if sum(state == "idle" for state in states.values()) >= count:
                return
            time.sleep(0.3)
        raise RuntimeError(f"the rig's nodes did not come up idle: {states}")

    def queue(self) -> list[str]:
        """Job ids still in the queue (pending or running)."""
        return self.slurm("squeue", "-h", "-o", "%i").split()

    # -- stopping -----------------------------------------------------------------------
    def _pids(self) -> list[int]:
        files = [self.root / "slurmctld.pid", self.root / "munge" / "pid"]
        files += [self.root / f"slurmd-{n}.pid" for n in self.nodes]
        pids = []
        for path in files:
            try:
                pids.append(int(path.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        return pids

    def stop(self) -> None:
        pids = self._pids()
        if "slurmd" in self._started:
            try:
                jobs = self.queue()
                if jobs:
                    self.slurm("scancel", *jobs)
                deadline = time.monotonic() + 20
                while self.queue() and time.monotonic() < deadline:
                    time.sleep(0.3)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        if "slurmctld" in self._started:
            subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
            _alive(p) for p in pids if p not in self._munge()
        ):
            time.sleep(0.2)
        if "munged" in self._started:
            subprocess.run(
                [_program("munged"), "-s", f"--socket={self.munge_socket}"],
                capture_output=True,
                timeout=30,
            )
        for pid in {*pids, *self._rig_processes()}:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _rig_processes(self) -> list[int]:
        """Every process with this rig's SLURM_CONF in its environment: the daemons, and the
        job steps (slurmstepd, the scripts) that `scontrol shutdown` leaves running."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if mark in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def _munge(self) -> set[int]:
        try:
            return {int((self.root / "munge" / "pid").read_text().split()[0])}
        except (OSError, ValueError, IndexError):
            return set()

    def __enter__(self) -> SlurmRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (OSError, IndexError):
        return False
    return state != "Z"


def job_allocations(rig: SlurmRig, job: str) -> list[str]:
    """The rig's allocations of a trainctl job still in the queue (any attempt)."""
    out = rig.slurm("squeue", "-h", "-o", "%i %j")
    return [line for line in out.splitlines() if f" trainctl-{job}-a" in f" {line.split()[-1]}"]


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """One rig per test process, 3 nodes (a drained node's job relaunches on the other two),
    its SLURM_CONF in this process's environment for every trainctl process the tests start
    (the controller runs Slurm's commands as a login node would)."""
    rig = SlurmRig(tmp_path_factory.mktemp("slurm"), nodes=3, grace_seconds=10)
    with rig:
        before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(rig.conf)
        try:
            yield rig
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = before
