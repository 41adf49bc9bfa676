"""Slurm's commands, as the provider calls them: sbatch, srun, squeue, scontrol, sinfo,
scancel, from whatever machine the controller runs on (a login node). Each call is one
process with a timeout; its failure is a SlurmError with Slurm's own words."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from trainctl.plugin import TrainctlError

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")
# squeue's states of an allocation that still holds (or will hold) nodes
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING")
# A node state (sinfo %T, lower case, flags such as "+drain" or "*" for not responding)
# that takes the node away from a running job, or is about to.
NODE_GONE = ("down", "drain", "fail", "maint", "reboot", "power", "unknown", "*")
CALL_SECONDS = 60


class SlurmError(TrainctlError):
    """A Slurm command failed (its stderr says why)."""


def missing_commands() -> list[str]:
    return [name for name in COMMANDS if shutil.which(name) is None]


def run(*argv: str, timeout: float = CALL_SECONDS, stdin: str | None = None) -> str:
    """A Slurm command's stdout; SlurmError when it fails."""
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()
        said = why[-1] if why else f"exit code {done.returncode}"
        # (Slurm's commands name themselves: "squeue: fatal: ..." once, not twice)
        raise SlurmError(said if said.startswith(f"{argv[0]}: ") else f"{argv[0]}: {said}")
    return done.stdout


@dataclass(frozen=True)
class Allocation:
    """One Slurm job as squeue shows it."""

    id: str
    name: str
    state: str  # PENDING, RUNNING, CANCELLED...
    reason: str  # why it is pending (or why it ended), Slurm's word
    nodelist: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def allocations(name: str | None = None, job_id: str | None = None) -> list[Allocation]:
    """Allocations by job name or id, ended ones too (while slurmctld still knows them)."""
    argv = ["squeue", "-h", "--states=all", "-o", "%i|%j|%T|%r|%N"]
    argv += [f"--name={name}"] if name else []
    argv += [f"--jobs={job_id}"] if job_id else []
    try:
        out = run(*argv)
    except SlurmError as exc:
        if job_id and "Invalid job id" in str(exc):  # ended and forgotten
            return []
        raise
    found = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            found.append(Allocation(*(p.strip() for p in parts)))
    return found


def hostnames(nodelist: str) -> list[str]:
    """`n[1-2]` as [n1, n2], in Slurm's order (the order of the allocation's tasks)."""
    return run("scontrol", "show", "hostnames", nodelist).split()


def node_fields(names: list[str]) -> dict[str, dict[str, str]]:
    """`scontrol show node`'s fields of each node (NodeAddr, State, Reason...)."""
    out = run("scontrol", "-o", "show", "node", ",".join(names))
    nodes: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        fields: dict[str, str] = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                fields[key] = value
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields
    return nodes


def node_states(names: list[str]) -> dict[str, tuple[str, str]]:
    """Each node's state (sinfo's long form: allocated, draining, down*...) and reason."""
    out = run("sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E")
    states = {}
    for line in out.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            states[parts[0].strip()] = (parts[1].strip(), parts[2].strip())
    return states


def idle_nodes(partition: str | None) -> list[str]:
    """The nodes of `partition` (None: every partition) that are idle now: "idle" in sinfo's
    long form, which leaves out idle nodes drained, powered down or not responding (sinfo's
    --states=idle counts those too)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%T"]
    argv += [f"--partition={partition}"] if partition else []
    idle = set()
    for line in run(*argv).splitlines():
        name, _, state = line.partition("|")
        if state.strip() == "idle":
            idle.add(name.strip())
    return sorted(idle)


def node_is_gone(state: str) -> bool:
    return any(word in state for word in NODE_GONE)


def steps(job_id: str) -> dict[str, str]:
    """The allocation's steps: step name -> step id (1234.0)."""
    try:
        out = run("squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i|%j")
    except SlurmError:
        return {}
    found = {}
    for line in out.splitlines():
        step, _, name = line.partition("|")
        found[name.strip()] = step.strip()
    return found


def cancel(*ids: str, signal: str | None = None) -> None:
    if ids:
        run("scancel", *([f"--signal={signal}"] if signal else []), *ids)
