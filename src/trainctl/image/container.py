"""Running a node's agent inside the job's container image, with docker or podman.

One container per node and attempt, named `trainctl-<job>-<attempt>-<rank>` and labelled
with the job, so a job's containers are found (and removed) by label alone. The command is a
pure function of its inputs (`container_command`), so it is golden-tested and shown verbatim
by the dry run.

What the container gets, and why:
- `--network host`: torchrun's rendezvous and NCCL/gloo traffic use the host's interfaces
  and the addresses the controller handed out, exactly as a process on the host would.
- `--ipc host`: the workers' shared memory (DataLoader, NCCL's intra-node transport) is the
  host's /dev/shm, with its size; an engine refuses `--shm-size` together with it, so the
  size flag is only given with a private IPC namespace.
- `--ulimit memlock=-1:-1` on GPU and EFA nodes: NCCL and libfabric pin host memory. CPU nodes
  do not pin, and a host without CAP_SYS_RESOURCE cannot grant an unlimited memlock (the
  container would fail to start), so they keep the engine's default.
- `--init` and the engine's `--sig-proxy`: a SIGTERM to the attached engine process reaches
  the agent inside (through the init), which saves the emergency checkpoint as it does on
  the host.
- the node's `opt/ml` at `/opt/ml`: SageMaker paths are the real ones inside the container.
- environment by name only (`-e NAME`): the engine process carries the values, so nothing
  (credentials least of all) appears on a command line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.errors import SpecError, TrainctlError, one_line
from trainctl.image.engine import Engine

if TYPE_CHECKING:
    from trainctl.spec.request import CapacityRequest

JOB_LABEL = "trainctl.job"
ATTEMPT_LABEL = "trainctl.attempt"
RANK_LABEL = "trainctl.rank"
# Every image trainctl builds carries it (value: the agent version baked in).
TOOLKIT_LABEL = "trainctl.version"
# What the agent needs of an image: python3 that imports it (with its dependencies).
TOOLKIT_PROBE = "import trainctl.node.agent"
CONTAINER_OPT_ML = "/opt/ml"
# Used only with a private IPC namespace (ipc_host=False); see the module docstring.
DEFAULT_SHM_SIZE = "16g"
PULL_TIMEOUT_SECONDS = 3600.0

# The interpreter a job image provides on PATH (python3 is in every image that has Python).
IMAGE_PYTHON = "python3"


@dataclass(frozen=True)
class Mount:
    """A host directory visible inside the container (at the same path unless `target`)."""

    source: str
    target: str | None = None
    read_only: bool = False

    def flag(self) -> str:
        spec = f"{self.source}:{self.target or self.source}"
        return f"{spec}:ro" if self.read_only else spec


def container_name(job: str, attempt: int, rank: int) -> str:
    return f"trainctl-{job}-{attempt}-{rank}"


def container_labels(job: str, attempt: int, rank: int) -> dict[str, str]:
    return {JOB_LABEL: job, ATTEMPT_LABEL: str(attempt), RANK_LABEL: str(rank)}


def container_command(
    engine: Engine,
    image: str,
    *,
    name: str,
    labels: Mapping[str, str],
    env: Iterable[str],
    node_root: str,
    agent_argv: Sequence[str],
    gpus: int,
    efa_devices: int,
    network_host: bool = True,
    ipc_host: bool = True,
    shm_size: str = DEFAULT_SHM_SIZE,
    memlock_unlimited: bool | None = None,
    mounts: Sequence[Mount] = (),
    hosts: Mapping[str, str] | None = None,
) -> list[str]:
    """The attached `<engine> run` that runs `agent_argv` in `image` as one node.

    `env` holds the NAMES of the variables the agent gets; their values come from the
    engine's own environment. `node_root` is the node's layout root on the host: its
    `opt/ml` is mounted at /opt/ml. `memlock_unlimited` defaults to "the node has GPUs or
    EFA devices". The image must have been pulled (see `ensure_image`): the run never pulls.
    `hosts` (name -> IP address) go into the container's /etc/hosts: SageMaker's algo-N.
    """
    if not agent_argv:
        raise ValueError("agent_argv is empty")
    argv = [engine.path, "run", "--rm", "--name", name]
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    argv += ["--pull", "never", "--init", "--sig-proxy=true"]
    if network_host:
        argv += ["--network", "host"]
    for name, address in sorted((hosts or {}).items()):
        argv += ["--add-host", f"{name}:{address}"]
    if ipc_host:
        argv += ["--ipc", "host"]
    else:
        argv += ["--shm-size", shm_size]
    if memlock_unlimited is None:
        memlock_unlimited = gpus > 0 or efa_devices > 0
    if memlock_unlimited:
        argv += ["--ulimit", "memlock=-1:-1"]
    if gpus > 0:
        # docker: the NVIDIA runtime hook; podman: the CDI spec nvidia-ctk generates.
        argv += ["--gpus", "all"] if engine.name == "docker" else ["--device", "nvidia.com/gpu=all"]
    for index in range(efa_devices):
        argv += ["--device", f"/dev/infiniband/uverbs{index}"]
    opt_ml = f"{node_root.rstrip('/')}/opt/ml"
    argv += ["--volume", Mount(opt_ml, CONTAINER_OPT_ML).flag()]
    for mount in mounts:
        argv += ["--volume", mount.flag()]
    for variable in sorted(set(env)):
        argv += ["-e", variable]
    # The image's own ENTRYPOINT (SageMaker images have one) must not wrap the agent.
    argv += ["--workdir", "/", "--entrypoint", agent_argv[0], image, *agent_argv[1:]]
    return argv


def ensure_image(engine: Engine, image: str, *, timeout: float = PULL_TIMEOUT_SECONDS) -> bool:
    """Make `image` present on this host: pull it only when `image inspect` fails.

    True when it was pulled. A failed pull is a SpecError("image_uri", one line).
    """
    from trainctl.image.engine import ImageBuildError
    from trainctl.image.registry import pull_image

    if engine.image_exists(image):
        return False
    try:
        pull_image(engine, image)  # plain http only for a registry on loopback
    except ImageBuildError as exc:
        raise SpecError(
            "image_uri",
            f"cannot pull {image} with {engine.name}: {str(exc).splitlines()[0]} "
            "(give an image this host can pull, or build one with `trainctl build`)",
        ) from None
    except OSError as exc:
        raise SpecError("image_uri", f"cannot pull {image} with {engine.name}: {exc}") from None
    return True


# Images (by id, per place) found able to run the agent: the probe starts a container, and
# an image id names its content, so once per process is enough.
_toolkit_found: set[tuple[str, str]] = set()

# Runs an argv where the image is (here or on a host): (exit code, output).
Runner = Callable[[list[str]], tuple[int, str]]


def check_toolkit(run: Runner, engine_path: str, image: str, *, where: str = "") -> None:
    """SpecError("image_uri", one line) unless `image` can run the trainctl agent.

    An image trainctl built says so in its TOOLKIT_LABEL; any other image is asked, once, by
    a throwaway container with no network. Without this, a job in an image lacking the agent
    would only fail when its nodes start, attempt after attempt, on capacity already paid for.
    """
    inspect = [engine_path, "image", "inspect", "--format"]
    inspect += [f'{{{{.Id}}}} {{{{index .Config.Labels "{TOOLKIT_LABEL}"}}}}', image]
    code, out = run(inspect)
    image_id, _, label = out.strip().partition(" ")
    if code == 0 and label.strip() not in ("", "<no value>"):
        return
    if code == 0 and (where, image_id) in _toolkit_found:
        return
    probe = [engine_path, "run", "--rm", "--pull", "never", "--network", "none"]
    probe += ["--entrypoint", "python3", image, "-c", TOOLKIT_PROBE]
    code, out = run(probe)
    if code != 0:
        raise SpecError(
            "image_uri",
            f"{image} cannot run the trainctl agent ({_last_line(out.encode())}); build an "
            f"image on it with build_image=True and base_image={image!r} (or `trainctl build "
            f"--base-image {image}`), which adds the toolkit, or pip install trainctl in it",
        )
    if image_id:
        _toolkit_found.add((where, image_id))


def local_runner(timeout: float = 300) -> Runner:
    """A Runner for this machine."""
    import subprocess

    def run(argv: list[str]) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 1, str(exc)
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace")

    return run


LIST_SECONDS = 60.0
REMOVE_SECONDS = 120.0


class ContainerCleanupError(TrainctlError):
    """A job's containers could not be listed or removed: the engine hung or cannot run.
    The message says how to remove them by hand."""


def _engine_call(engine: Engine, args: Sequence[str], timeout: float, by_hand: str) -> bytes:
    import subprocess

    command = f"{engine.name} {' '.join(args[:2])}"
    try:
        done = engine.run(*args, timeout=timeout)
    except subprocess.TimeoutExpired:
        problem = f"`{command}` did not answer within {timeout:g} s"
    except OSError as exc:
        problem = f"`{command}` could not run ({one_line(str(exc))})"
    else:
        return done.stdout if done.returncode == 0 else b""
    raise ContainerCleanupError(f"{problem}; {by_hand}")


def job_containers(engine: Engine, job: str) -> list[str]:
    """Ids of every container (running or not) labelled with `job` (none when the engine
    answers with an error; ContainerCleanupError when it does not answer)."""
    label = f"label={JOB_LABEL}={job}"
    by_hand = f"list and remove them yourself: {engine.name} ps -a --filter {label}"
    out = _engine_call(engine, ["ps", "-aq", "--filter", label], LIST_SECONDS, by_hand)
    return out.decode(errors="replace").split()


def remove_containers(engine: Engine, ids_or_names: Sequence[str]) -> None:
    """Kill and remove containers at once (no stop timeout: the caller already gave the
    agents their grace period through the attached engine processes)."""
    if not ids_or_names:
        return
    force = ["rm", "-f", "-t", "0"] if engine.name == "podman" else ["rm", "-f"]
    by_hand = f"remove them yourself: {engine.name} rm -f {' '.join(ids_or_names)}"
    _engine_call(engine, [*force, *ids_or_names], REMOVE_SECONDS, by_hand)


def remove_job_containers(engine: Engine, job: str) -> int:
    """Remove every container of `job`; how many there were."""
    ids = job_containers(engine, job)
    remove_containers(engine, ids)
    return len(ids)


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    return one_line(lines[-1]) if lines else "no error output"


def container_mounts(request: CapacityRequest, agent_argv: list[str]) -> list[Mount]:
    """The host directories a containerised agent reaches at their own paths: a file://
    store (from the agent's --store), checkpoint and output locations, and input channels."""
    from trainctl.spec.checks import written_uris
    from trainctl.spec.uris import parse_uri

    writable: list[str] = []
    if "--store" in agent_argv:
        writable.append(agent_argv[agent_argv.index("--store") + 1])
    writable += [uri for _, uri in written_uris(request)]
    mounts: list[Mount] = []
    for uri in writable:
        scheme, rest = parse_uri(uri)
        if scheme == "file":
            path = Path(rest).expanduser()
            path.mkdir(parents=True, exist_ok=True)  # a bind mount needs its source
            mounts.append(Mount(str(path)))
    for name, uri in sorted(request.inputs.items()):
        scheme, rest = parse_uri(uri, field=f"inputs.{name}")
        if scheme == "file":
            mounts.append(Mount(str(Path(rest).expanduser()), read_only=True))
    return mounts
