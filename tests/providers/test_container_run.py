"""Node agents inside the job's container image: the per-node engine command (golden) and
real jobs of examples/digits in podman containers on the local provider.

The image is made here, once per session, from this machine's Debian python3.11 and the
packages of the venv (cp311 wheels): a slim root filesystem streamed into `podman import`.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    EXAMPLES,
    FIXTURES,
    REPO,
    TORCHRUN,
    digits_estimator,
    free_port,
    require_part,
)
from tests.rigs.cloud import cloud  # noqa: F401  (moto + sshd stand-ins + IMDS)
from trainctl import Estimator
from trainctl.errors import SpecError
from trainctl.estimator import JobFailedError
from trainctl.image.container import (
    Mount,
    container_command,
    container_labels,
    container_name,
    ensure_image,
    job_containers,
)
from trainctl.image.engine import Engine, find_engine
from trainctl.spec.catalog import CATALOG
from trainctl.state import JobState

AGENT = ["python3", "-m", "trainctl.node.agent", "--store", "file:///s", "--job", "j"]
AGENT += ["--attempt", "1", "--rank", "0"]

# -- golden: the per-node engine command ---------------------------------------------------


def golden(engine: Engine, instance_type: str, rank: int = 0) -> list[str]:
    itype = CATALOG[instance_type]
    return container_command(
        engine,
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1",
        name=container_name("j", 1, rank),
        labels=container_labels("j", 1, rank),
        env={"TRAINCTL_LOG_SYNC_SECONDS": "2", "FI_PROVIDER": "efa"},
        node_root="/",
        agent_argv=AGENT,
        gpus=itype.gpus,
        efa_devices=itype.efa_interfaces,
    )


COMMON_HEAD = [
    "run", "--rm", "--name", "trainctl-j-1-0",
    "--label", "trainctl.attempt=1", "--label", "trainctl.job=j", "--label", "trainctl.rank=0",
    "--pull", "never", "--init", "--sig-proxy=true", "--network", "host", "--ipc", "host",
]  # fmt: skip
COMMON_TAIL = [
    "-e", "FI_PROVIDER", "-e", "TRAINCTL_LOG_SYNC_SECONDS",
    "--workdir", "/", "--entrypoint", "python3",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1",
    "-m", "trainctl.node.agent", "--store", "file:///s", "--job", "j",
    "--attempt", "1", "--rank", "0",
]  # fmt: skip


@pytest.mark.timeout(10)
def test_golden_gpu_type_with_efa_podman():
    """p4d.24xlarge: every GPU (CDI), its 4 EFA devices, unlimited memlock, /opt/ml."""
    argv = golden(Engine("podman", "/usr/bin/podman"), "p4d.24xlarge")
    assert argv == [
        "/usr/bin/podman", *COMMON_HEAD,
        "--ulimit", "memlock=-1:-1",
        "--device", "nvidia.com/gpu=all",
        "--device", "/dev/infiniband/uverbs0", "--device", "/dev/infiniband/uverbs1",
        "--device", "/dev/infiniband/uverbs2", "--device", "/dev/infiniband/uverbs3",
        "--volume", "/opt/ml:/opt/ml",
        *COMMON_TAIL,
    ]  # fmt: skip


@pytest.mark.timeout(10)
def test_golden_gpu_type_without_efa_docker():
    """p3.2xlarge with docker: `--gpus all`, no EFA device."""
    argv = golden(Engine("docker", "/usr/bin/docker"), "p3.2xlarge")
    assert argv == [
        "/usr/bin/docker", *COMMON_HEAD,
        "--ulimit", "memlock=-1:-1",
        "--gpus", "all",
        "--volume", "/opt/ml:/opt/ml",
        *COMMON_TAIL,
    ]  # fmt: skip
    assert not any("uverbs" in a for a in argv)


@pytest.mark.timeout(10)
def test_golden_cpu_local_node_with_mounts():
    """A local CPU node: no GPU/EFA flags, no memlock (nothing pins memory), the node
    directory's opt/ml at /opt/ml, the store and an input channel at their own paths."""
    argv = container_command(
        Engine("podman", "/usr/bin/podman"),
        "localhost/img:1",
        name="trainctl-j-2-1",
        labels=container_labels("j", 2, 1),
        env=["TRAINCTL_HEARTBEAT_SECONDS", "AWS_SECRET_ACCESS_KEY"],
        node_root="/home/u/.trainctl/nodes/j/attempt-2/node-1/",
        agent_argv=["python3", "-m", "trainctl.node.agent", "--store", "file:///st"],
        gpus=0,
        efa_devices=0,
        mounts=[Mount("/st"), Mount("/data/train", read_only=True)],
    )
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--name", "trainctl-j-2-1",
        "--label", "trainctl.attempt=2", "--label", "trainctl.job=j", "--label", "trainctl.rank=1",
        "--pull", "never", "--init", "--sig-proxy=true", "--network", "host", "--ipc", "host",
        "--volume", "/home/u/.trainctl/nodes/j/attempt-2/node-1/opt/ml:/opt/ml",
        "--volume", "/st:/st", "--volume", "/data/train:/data/train:ro",
        "-e", "AWS_SECRET_ACCESS_KEY", "-e", "TRAINCTL_HEARTBEAT_SECONDS",
        "--workdir", "/", "--entrypoint", "python3", "localhost/img:1",
        "-m", "trainctl.node.agent", "--store", "file:///st",
    ]  # fmt: skip


@pytest.mark.timeout(10)
def test_private_ipc_gets_a_large_shm_and_values_never_reach_the_command_line():
    argv = container_command(
        Engine("docker", "/usr/bin/docker"),
        "img",
        name="n",
        labels={},
        env={"AWS_SECRET_ACCESS_KEY": "very-secret-value"},
        node_root="/",
        agent_argv=["python3"],
        gpus=0,
        efa_devices=0,
        ipc_host=False,
    )
    assert argv[argv.index("--shm-size") + 1] == "16g"
    assert "--ipc" not in argv
    assert "very-secret-value" not in " ".join(argv)


# -- the image, once per session -----------------------------------------------------------

# What the node image carries: torch and examples/digits' packages, trainctl's node-side
# dependencies (paramiko, typer and rich are not used by the agent; boto3 is, for s3://
# stores), with what they require.
IMAGE_DISTRIBUTIONS = [
    "torch", "numpy", "scikit-learn", "pydantic", "pydantic-settings", "pyyaml", "pathspec",
    "boto3",
]  # fmt: skip
# What the agent itself needs: an image for what is not about the training (building,
# pushing and pulling one), whose layers are megabytes, not torch's gigabyte.
AGENT_DISTRIBUTIONS = ["pydantic", "pydantic-settings", "pyyaml", "pathspec"]
NOT_IN_IMAGE = {"setuptools"}  # torch lists it for building C++ extensions only
SITE = "usr/local/lib/python3.11/dist-packages"  # Debian's python3.11 looks here
# Parts of packages nothing imports at run time (headers, test suites).
SKIPPED_PARTS = ("torch/include", "torch/test", "torch/share")
STDLIB = Path("/usr/lib/python3.11")
STDLIB_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip"}
STDLIB_SKIPPED |= {"pydoc_data", "config-3.11-x86_64-linux-gnu", "sitecustomize.py"}


def _distributions(names: list[str]) -> list[importlib.metadata.Distribution]:
    from packaging.requirements import Requirement

    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen or name in NOT_IN_IMAGE:
            continue
        dist = importlib.metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _top_levels(site: Path, names: list[str]) -> list[Path]:
    tops: set[str] = set()
    for dist in _distributions(names):
        for file in dist.files or []:
            first = file.parts[0]
            if first.endswith(".dist-info") or first in ("..", "__pycache__"):
                continue
            tops.add(first)
    return [site / top for top in sorted(tops)]


def _system_libraries(binaries: list[Path], site: Path) -> set[str]:
    """The shared libraries outside the packages that python and the packages link to."""
    libraries: set[str] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                libraries.add(parts[2])
            elif parts and parts[0].startswith("/"):
                libraries.add(parts[0])  # the dynamic loader
    return {lib for lib in libraries if not lib.startswith(str(site))}


def write_node_rootfs(out: io.BufferedIOBase, distributions: list[str]) -> None:
    """Stream a root filesystem with python3.11, `distributions` (and what they require)
    and trainctl."""
    site = Path(importlib.metadata.distribution("pydantic").locate_file(""))
    tops = _top_levels(site, distributions)
    # dash as /bin/sh: image builds run their RUN steps with it.
    binaries = [
        Path("/usr/bin/python3.11"),
        Path("/usr/bin/dash"),
        *(STDLIB / "lib-dynload").glob("*.so"),
    ]
    for top in tops:
        if top.is_dir():
            binaries += [p for p in top.rglob("*.so*") if p.is_file()]
        elif top.suffix == ".so":
            binaries.append(top)

    def keep(skipped: set[str]):
        def check(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if info.isdir() and info.name.startswith(SITE) and info.name.endswith("/tests"):
                return None
            skip = any(info.name == s or info.name.startswith(f"{s}/") for s in skipped)
            return None if skip else info

        return check

    with tarfile.open(fileobj=out, mode="w|") as tar:
        for directory, mode in {
            "tmp": 0o1777,
            "root": 0o700,
            "etc": 0o755,
            "opt/ml": 0o755,
        }.items():
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        etc = {
            "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
            "etc/group": "root:x:0:\n",
            "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        }
        for name, text in etc.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        tar.add("/usr/bin/python3.11", arcname="usr/bin/python3.11")
        tar.add("/usr/bin/dash", arcname="usr/bin/dash")
        for link, target in {"bin": "usr/bin", "usr/bin/sh": "dash"}.items():
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for link in ("python3", "python"):
            info = tarfile.TarInfo(f"usr/bin/{link}")
            info.type, info.linkname = tarfile.SYMTYPE, "python3.11"
            tar.addfile(info)
        stdlib_skipped = {f"usr/lib/python3.11/{name}" for name in STDLIB_SKIPPED}
        tar.add(STDLIB, arcname="usr/lib/python3.11", filter=keep(stdlib_skipped))
        for library in sorted(_system_libraries(binaries, site)):
            tar.add(os.path.realpath(library), arcname=library.lstrip("/"))
        site_skipped = {f"{SITE}/{part}" for part in SKIPPED_PARTS}
        for top in tops:
            tar.add(top, arcname=f"{SITE}/{top.name}", filter=keep(site_skipped))
        tar.add(REPO / "src" / "trainctl", arcname=f"{SITE}/trainctl", filter=keep(set()))


def _podman() -> Engine:
    engine = find_engine("podman")
    if engine is None:
        require_part("podman", "podman is not installed (or does not answer)")
    if not Path("/usr/bin/python3.11").exists():
        require_part("podman", "the node image is made from /usr/bin/python3.11, which is missing")
    assert engine is not None
    return engine


def import_node_image(
    argv: list[str],
    tag: str,
    env: dict[str, str] | None = None,
    distributions: list[str] = IMAGE_DISTRIBUTIONS,
) -> None:
    """Stream the node root filesystem into `argv` (an engine's `import - TAG`): torch and
    the digits packages, or the `distributions` given."""
    started = time.monotonic()
    importer = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert importer.stdin is not None and importer.stderr is not None
    try:
        write_node_rootfs(importer.stdin, distributions)
        importer.stdin.close()
        importer.wait(timeout=180)
        assert importer.returncode == 0, importer.stderr.read().decode(errors="replace")
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.wait()
    sys.stderr.write(f"\nnode image {tag} ({argv[0]}) in {time.monotonic() - started:.1f} s\n")


# Module, not session: only this file uses it, and a session fixture's teardown (`rmi` of a
# torch-sized image, 30 s and more under load) runs in whichever test a worker ends with - it
# once timed out a 30 s test of another file in CI.
@pytest.fixture(scope="module")
def node_image() -> Iterator[str]:
    """A real image with python and torch (no host bind mounts), removed after this file."""
    engine = _podman()
    tag = f"localhost/trainctl-test-node:{os.getpid()}"
    try:
        import_node_image([engine.path, "import", "--quiet", "-", tag], tag)
        yield tag
    finally:
        engine.run("rmi", "-f", tag, timeout=120)


@pytest.fixture(scope="module")
def agent_image() -> Iterator[str]:
    """python and what the agent needs, no torch: the base of the images the tests here
    push (pushing torch's layers was most of a minute), removed after this file."""
    engine = _podman()
    tag = f"localhost/trainctl-test-agent:{os.getpid()}"
    try:
        argv = [engine.path, "import", "--quiet", "-", tag]
        import_node_image(argv, tag, distributions=AGENT_DISTRIBUTIONS)
        yield tag
    finally:
        engine.run("rmi", "-f", tag, timeout=120)


@pytest.fixture
def podman(node_image) -> Engine:
    engine = find_engine("podman")
    assert engine is not None
    return engine


JOB_PREFIX = f"ctr{os.getpid()}"  # the jobs of this test session, by name
_job_numbers = iter(range(1, 10_000))


@pytest.fixture
def in_podman(home, monkeypatch, podman) -> Iterator[Engine]:
    """Jobs of this test use podman; afterwards none of their containers may be left."""
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "podman")
    yield podman
    done = podman.run("ps", "-a", "--format", "{{.Names}}", timeout=60)
    left = [n for n in done.stdout.decode().split() if n.startswith(f"trainctl-{JOB_PREFIX}-")]
    if left:  # clean up before failing so one bad test does not poison the rest
        podman.run("rm", "-f", "-t", "0", *left, timeout=120)
    assert not left, f"containers left behind: {left}"


def digits(image: str, **fields) -> Estimator:
    """A 2-node digits job in `image`: the plain launcher (tests/helpers.py says why) unless
    the test asks for torchrun, as the first podman job here and docker's stop does."""
    hyperparameters = {"epochs": 2, "lr": 0.1, "seed": 0, "checkpoint-every": 10}
    job_name = f"{JOB_PREFIX}-{next(_job_numbers)}"
    return digits_estimator(hyperparameters, **{"image_uri": image, "job_name": job_name, **fields})


def image_job(image: str | None, **fields) -> Estimator:
    """A 2-node job of tests/fixtures/imagejob (no torch) in `image`."""
    job_name = f"{JOB_PREFIX}-{next(_job_numbers)}"
    return Estimator(
        entry_point="train.py",
        source_dir=str(FIXTURES / "imagejob"),
        instance_count=2,
        **{"image_uri": image, "job_name": job_name, **fields},
    )


# -- real jobs in podman containers --------------------------------------------------------


# (The first test of the module's node_image pays for its import inside its own timeout:
# 112 s of it under a loaded CI-like run, leaving 38 s of 150 for the job.)
@pytest.mark.timeout(330)
def test_digits_two_nodes_in_podman_containers(in_podman, node_image, capsys):
    est = digits(node_image, distribution=TORCHRUN)
    job = est.fit(wait=True, logs=True)
    console = capsys.readouterr().out
    info = job.describe()
    assert info["state"] == "Completed", info
    assert "[algo-1] rank 0/2" in console and "[algo-2] rank 1/2" in console
    assert "test_accuracy=" in console
    # the agent ran in the image, at the SageMaker paths, not on the host
    logs = {i.key.rsplit("/", 1)[-1]: i.key for i in job.store.list(f"jobs/{job.name}/logs")}
    assert set(logs) == {"node-0.log", "node-1.log"}
    node0 = job.store.get_text(logs["node-0.log"])
    assert "test_accuracy=" in node0 and "rank 1/2" in job.store.get_text(logs["node-1.log"])
    files = {i.key for i in job.store.list(f"jobs/{job.name}")}
    assert f"jobs/{job.name}/output/model.tar.gz" in files
    assert any(k.startswith(f"jobs/{job.name}/checkpoints/") for k in files), files
    data = job.store.get_bytes(f"jobs/{job.name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert "model.pt" in tar.getnames()
    assert not job_containers(in_podman, job.name)


@pytest.mark.timeout(120)
def test_failing_script_in_containers_fails_and_leaves_nothing(in_podman, node_image, tmp_path):
    source = tmp_path / "fail"
    shutil.copytree(FIXTURES / "fail", source)
    est = digits(node_image, source_dir=str(source), hyperparameters={})
    with pytest.raises(JobFailedError) as raised:
        est.fit(logs=False)
    info = raised.value.job.describe()
    assert info["state"] == "Failed"
    assert info["failure_reason"] == "algo-2: ValueError: learning rate 10.0 is too large"
    assert not job_containers(in_podman, raised.value.job.name)


@pytest.mark.timeout(120)
def test_stop_reaches_the_agent_inside_and_saves_an_emergency_checkpoint(in_podman, node_image):
    check_stop_saves_an_emergency_checkpoint(in_podman, node_image)


def check_stop_saves_an_emergency_checkpoint(engine: Engine, image: str, **fields) -> None:
    """job.stop() SIGTERMs the engine processes; the signal reaches the agents inside
    (sig-proxy + init), the script checkpoints and exits, and no container is left."""
    est = digits(image, hyperparameters={"epochs": 8, "step-delay": 0.2}, **fields)
    job = est.fit(wait=False)
    _wait_for_log(job, "hyperparameters:", timeout=90)
    deadline = time.monotonic() + 60  # a periodic checkpoint: the training loop is running
    while not job.store.list(f"jobs/{job.name}/checkpoints") and time.monotonic() < deadline:
        time.sleep(0.3)
    info = job.stop()
    assert info["state"] == "Stopped", info
    text = "".join(job.store.get_text(i.key) for i in job.store.list(f"jobs/{job.name}/logs"))
    assert "preempted: emergency checkpoint at step" in text, text[-3000:]
    assert not job_containers(engine, job.name)


@pytest.mark.timeout(60)
def test_missing_image_is_a_clear_error_before_anything_is_made(in_podman, home):
    missing = "trainctl-no-such-image:1"
    with pytest.raises(SpecError) as raised:
        digits(missing).fit(logs=False)
    assert raised.value.field == "image_uri"
    assert str(raised.value).startswith(f"image_uri: cannot pull {missing} with podman: ")
    assert "\n" not in str(raised.value)
    assert not (home / "nodes").exists()
    assert not (home / "controllers").exists() or not any((home / "controllers").iterdir())
    with pytest.raises(SpecError):
        ensure_image(in_podman, missing)


@pytest.fixture
def image_without_agent(in_podman, tmp_path) -> Iterator[str]:
    """A real image that has no python, so no trainctl agent (busybox only)."""
    from tests.rigs.registry import import_busybox_image

    tag = import_busybox_image(tmp_path, f"localhost/trainctl-test-busybox:{os.getpid()}")
    yield tag
    in_podman.run("rmi", "-f", tag, timeout=120)


@pytest.mark.timeout(60)
def test_image_that_cannot_run_the_agent_is_refused_before_anything_is_made(
    in_podman, image_without_agent, home
):
    """Without this check its nodes would fail at start, attempt after attempt."""
    with pytest.raises(SpecError) as raised:
        digits(image_without_agent).fit(logs=False)
    message = str(raised.value)
    assert message.startswith(f"image_uri: {image_without_agent} cannot run the trainctl agent (")
    assert "build_image=True" in message and "\n" not in message
    assert not (home / "nodes").exists()
    assert not job_containers(in_podman, "")  # the probe's container is gone too


@pytest.mark.timeout(120)
def test_ssh_hosts_refuse_an_image_that_cannot_run_the_agent(
    in_podman, image_without_agent, sshd, home
):
    """Each host's engine is asked at preflight: a clear error, and no job is made."""
    hosts = [server.host(user="root").model_dump() for server in sshd.servers[:2]]
    est = digits(image_without_agent, instance_type="ssh", hosts=hosts)
    with pytest.raises(SpecError) as raised:
        est.fit(logs=False)
    assert raised.value.field in ("hosts[0]", "hosts[1]")
    assert f"{image_without_agent} cannot run the trainctl agent (" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not (home / "controllers").exists() or not any((home / "controllers").iterdir())


@pytest.mark.timeout(60)
def test_framework_version_job_builds_the_toolkit_onto_the_framework_image(in_podman, home):
    """AWS's framework images have SageMaker's toolkit, not trainctl's agent: the job's image
    is built on the framework image, and the dry run shows the build and the container."""
    from trainctl.spec.frameworks import framework_image

    plan = digits(None, framework_version="2.3").fit(dry_run=True)
    build = next(r for r in plan["requests"] if r["service"] == "image")
    assert build["operation"] == "Build"
    assert build["params"]["base_image"] == framework_image("2.3", gpu=False)
    image = build["params"]["image"]
    assert image.startswith("localhost/trainctl/digits:")
    for node in plan["nodes"]:
        agent = node["agent"]
        assert agent[:3] == [in_podman.path, "run", "--rm"] and image in agent
    assert not in_podman.image_exists(image)  # a dry run builds nothing


def test_framework_version_for_remote_hosts_needs_a_repository(home, sshd, monkeypatch):
    monkeypatch.delenv("TRAINCTL_IMAGE_REPOSITORY", raising=False)
    hosts = [server.host(user="root").model_dump() for server in sshd.servers[:2]]
    est = digits(None, instance_type="ssh", hosts=hosts, framework_version="2.3")
    with pytest.raises(SpecError) as raised:
        est.fit(logs=False)
    assert raised.value.field == "framework_version" and "image_repository" in str(raised.value)


@pytest.mark.timeout(30)
def test_image_without_an_engine_is_refused_before_anything_is_made(home, monkeypatch):
    import trainctl.image.engine as engine_module

    monkeypatch.setattr(engine_module, "find_engine", lambda preferred=None: None)
    with pytest.raises(SpecError) as raised:
        digits("localhost/any:1").fit(logs=False)
    assert raised.value.field == "image_uri"
    assert "needs docker or podman" in str(raised.value)
    assert not (home / "nodes").exists()


@pytest.mark.timeout(60)
def test_dry_run_shows_the_container_command(in_podman, node_image, home):
    plan = digits(node_image).fit(dry_run=True)
    for node in plan["nodes"]:
        agent = node["agent"]
        assert agent[:3] == [in_podman.path, "run", "--rm"]
        assert f"trainctl-{plan['job']}-1-{node['rank']}" in agent
        assert agent[agent.index("--entrypoint") + 1 : agent.index("--entrypoint") + 3] == [
            "python3",
            node_image,
        ]
        root = home / "nodes" / plan["job"] / "attempt-1" / f"node-{node['rank']}"
        assert f"{root}/opt/ml:/opt/ml" in agent
        assert node["env"]["SM_MODEL_DIR"] == "/opt/ml/model"


def _wait_for_log(job, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in job.store.list(f"jobs/{job.name}/logs"):
            if text in job.store.get_text(info.key):
                return
        assert job.state not in (JobState.FAILED, JobState.COMPLETED), job.describe()
        time.sleep(0.3)
    raise AssertionError(f"{text!r} never appeared in the logs")


@pytest.mark.timeout(150)
def test_killed_node_container_is_replaced_and_the_job_resumes(in_podman, node_image):
    check_killed_node_is_replaced(in_podman, node_image)


def check_killed_node_is_replaced(engine: Engine, image: str) -> None:
    """A fault kill of algo-2 removes its container (the machine is gone); the next attempt
    runs in new containers, resumes from the checkpoint and completes."""
    hyperparameters = {"epochs": 4, "lr": 0.1, "seed": 0, "checkpoint-every": 10}
    est = digits(
        image,
        hyperparameters={**hyperparameters, "step-delay": 0.1},
        faults=["kill:algo-2@6"],
    )
    job = est.fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    attempts = info["attempts"]
    assert [a["outcome"] for a in attempts] == ["interrupted", "completed"], attempts
    assert "lost" in attempts[0]["cause"], attempts[0]
    assert not job_containers(engine, job.name)


# -- the whole chain: build -> push -> pull -> run -------------------------------------------


@pytest.mark.timeout(240)
def test_build_push_pull_then_a_two_node_job_runs_in_the_pulled_image(
    in_podman, agent_image, module_registry
):
    """The job's image is built on a base image (toolkit and code baked in), pushed to a
    registry on loopback and removed here; the job then pulls it and runs in it."""
    from trainctl.image.build import build_image, plan_build

    plan = plan_build(
        FIXTURES / "imagejob",
        "train.py",
        base_image=agent_image,
        repository=f"{module_registry.host}/trainctl/imagejob",
        s3=False,  # a file:// store: the node image needs no boto3
    )
    assert 'RUN python3 -c "import pathspec, pydantic, pydantic_settings, yaml"' in plan.dockerfile
    built = build_image(plan, push=True, engine=in_podman)
    try:
        assert built.built and built.pushed
        assert module_registry.has_manifest("trainctl/imagejob", built.tag)
        again = build_image(plan, push=True, engine=in_podman)  # same inputs: nothing to do
        assert not again.built and not again.pushed, again
        assert in_podman.run("rmi", "-f", built.image, timeout=120).returncode == 0
        assert not in_podman.image_exists(built.image)

        job = image_job(built.image).fit(logs=False)  # preflight pulls it back
        info = job.describe()
        assert info["state"] == "Completed", info
        assert in_podman.image_exists(built.image)
        node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
        assert "rank 1/2 in /opt/ml/code" in node1
        assert not job_containers(in_podman, job.name)
    finally:
        in_podman.run("rmi", "-f", built.image, timeout=120)


@pytest.mark.timeout(240)
def test_digits_on_two_ssh_hosts_in_containers(in_podman, node_image, sshd):
    """instance_type="ssh" with an image: each host's engine runs its node's agent in the
    image (the hosts are loopback sshd servers on this machine, sharing its podman)."""
    hosts = [server.host(user="root") for server in sshd.servers[:2]]
    est = digits(node_image, instance_type="ssh", hosts=[h.model_dump() for h in hosts])
    job = est.fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "rank 1/2" in node1
    node0 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "saved model to /opt/ml/model/model.pt" in node0  # the image's paths, not the host's
    assert f"jobs/{job.name}/output/model.tar.gz" in {
        i.key for i in job.store.list(f"jobs/{job.name}/output")
    }
    assert not job_containers(in_podman, job.name)


@pytest.mark.timeout(300)
def test_ec2_job_in_its_image_on_stand_in_instances(in_podman, node_image, cloud):  # noqa: F811
    """An EC2 job with image_uri: moto launches the instances, the sshd stand-ins run each
    node's agent in the image through their engine, the store is S3 (moto), and the
    nodes' credentials come from the IMDS stand-in."""
    from tests.rigs.cloud import ec2_digits

    est = ec2_digits(cloud, job_name=f"{JOB_PREFIX}-ec2", image_uri=node_image, max_wait=180)
    job = est.fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    node0 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
    assert "saved model to /opt/ml/model/model.pt" in node0
    keys = {o["Key"] for o in cloud.s3.list_objects_v2(Bucket=cloud.bucket)["Contents"]}
    assert f"models/{job.name}/output/model.tar.gz" in keys
    assert not job_containers(in_podman, job.name)


@pytest.mark.timeout(240)
def test_ec2_job_in_an_image_without_the_agent_fails_at_once_and_leaves_nothing(
    in_podman,
    image_without_agent,
    cloud,  # noqa: F811
):
    """EC2 hosts exist only once paid for: the image is checked on each as its node starts,
    and an image that cannot run the agent fails the job then (no relaunch), with every
    instance and resource gone."""
    from tests.rigs.cloud import ec2_digits
    from tests.rigs.cloud import job_resources as _job_resources

    est = ec2_digits(cloud, job_name=f"{JOB_PREFIX}-ec2-noagent", image_uri=image_without_agent)
    with pytest.raises(JobFailedError) as raised:
        est.fit(logs=False)
    info = raised.value.job.describe()
    assert f"{image_without_agent} cannot run the trainctl agent" in info["failure_reason"], info
    assert len(info["attempts"]) == 1, info["attempts"]
    assert _job_resources(cloud.ec2, raised.value.job.name) == {
        "instances": [],
        "security_groups": [],
        "key_pairs": [],
    }


@pytest.mark.timeout(240)
def test_ssh_job_with_build_image_pushes_to_the_repository_its_hosts_pull_from(
    in_podman, agent_image, sshd, module_registry, monkeypatch
):
    """build_image=True for remote hosts: built here, pushed to image_repository, pulled
    by each host's engine; the job's record names the image it ran."""
    from trainctl.record.jobstore import JobStore

    repository = f"{module_registry.host}/trainctl/imagejob-ssh"
    monkeypatch.setenv("TRAINCTL_IMAGE_REPOSITORY", repository)
    hosts = [server.host(user="root").model_dump() for server in sshd.servers[:2]]
    est = image_job(
        None, instance_type="ssh", hosts=hosts, build_image=True, base_image=agent_image
    )
    try:
        job = est.fit(logs=False)
        assert job.describe()["state"] == "Completed"
        image = JobStore(job.store, job.name).load().spec.image_uri
        assert image is not None and image.startswith(repository + ":")
        assert module_registry.has_manifest("trainctl/imagejob-ssh", image.rsplit(":", 1)[1])
        assert not job_containers(in_podman, job.name)
    finally:
        for ref in _images_of(in_podman, repository):
            in_podman.run("rmi", "-f", ref, timeout=120)


def _images_of(engine: Engine, repository: str) -> list[str]:
    done = engine.run("images", "--format", "{{.Repository}}:{{.Tag}}", timeout=60)
    lines = done.stdout.decode().split() if done.returncode == 0 else []
    return [line for line in lines if line.startswith(repository + ":")]


def test_build_image_for_remote_hosts_needs_a_repository(home, sshd, monkeypatch):
    monkeypatch.delenv("TRAINCTL_IMAGE_REPOSITORY", raising=False)
    hosts = [server.host(user="root").model_dump() for server in sshd.servers[:2]]
    with pytest.raises(SpecError) as raised:
        digits(None, instance_type="ssh", hosts=hosts, build_image=True).fit(logs=False)
    assert raised.value.field == "build_image" and "image_repository" in str(raised.value)


@pytest.mark.timeout(240)
def test_local_job_with_build_image_runs_in_the_image_built_for_it(in_podman, node_image):
    from trainctl.record.jobstore import JobStore

    est = digits(None, build_image=True, base_image=node_image)
    image = None
    try:
        job = est.fit(logs=False)
        assert job.describe()["state"] == "Completed"
        image = JobStore(job.store, job.name).load().spec.image_uri
        assert image is not None and image.startswith("localhost/trainctl/digits:")
        assert not job_containers(in_podman, job.name)
    finally:
        if image:
            in_podman.run("rmi", "-f", image, timeout=120)


def sm_hosts_in(image: str, **fields) -> Estimator:
    """The classic SM_HOSTS process-group script (tests/e2e/test_sagemaker_scripts.py) in the
    image: its names are SageMaker's algo-N, mapped in each container (--add-host)."""
    from tests.e2e.test_sagemaker_scripts import SOURCE

    base = {
        "entry_point": "sm_hosts_pg.py",
        "source_dir": str(SOURCE),
        "instance_count": 2,
        "image_uri": image,
        "job_name": f"{JOB_PREFIX}-{next(_job_numbers)}",
        "hyperparameters": {"port": free_port()},
    }
    return Estimator(**{**base, **fields})


@pytest.mark.timeout(150)
def test_sm_hosts_process_group_in_podman_containers(in_podman, node_image):
    from tests.e2e.test_sagemaker_scripts import check_sm_hosts_job, model_files

    job = sm_hosts_in(node_image).fit(logs=False)
    check_sm_hosts_job(job)
    assert json.loads(model_files(job)["leader.json"])["hosts"] == ["algo-1", "algo-2"]
    assert not job_containers(in_podman, job.name)


@pytest.mark.timeout(200)
def test_sm_hosts_process_group_on_ssh_hosts_in_containers(in_podman, node_image, sshd):
    from tests.e2e.test_sagemaker_scripts import check_sm_hosts_job, model_files

    hosts = [server.host(user="root").model_dump() for server in sshd.servers[:2]]
    job = sm_hosts_in(node_image, instance_type="ssh", hosts=hosts).fit(logs=False)
    check_sm_hosts_job(job)
    assert json.loads(model_files(job)["leader.json"])["hosts"] == ["algo-1", "algo-2"]
    assert not job_containers(in_podman, job.name)


NOTEBOOK_CELLS = [
    # What the notebook had: `from sagemaker.pytorch import PyTorch` - the one changed line.
    "from trainctl.sagemaker import PyTorch",
    """role = "arn:aws:iam::111122223333:role/service-role/AmazonSageMaker-ExecutionRole"
estimator = PyTorch(
    entry_point="train.py",
    source_dir=SOURCE_DIR,
    role=role,
    image_uri=IMAGE_URI,
    instance_count=2,
    instance_type="local",
    base_job_name=BASE_JOB_NAME,
    hyperparameters={"epochs": 2, "lr": 0.1, "seed": 0, "checkpoint-every": 10},
    distribution={"torch_distributed": {"enabled": True}},
    metric_definitions=[{"Name": "train:loss", "Regex": r"epoch \\d+/\\d+ loss=([0-9.]+)"}],
)""",
    "estimator.fit()",
    "print(estimator.model_data)\nprint(estimator.latest_training_job.describe()['state'])",
    "df = estimator.training_job_analytics.dataframe()\nprint(df.to_json(orient='records'))",
]


@pytest.mark.timeout(240)
def test_sagemaker_notebook_runs_with_one_changed_import(in_podman, node_image, tmp_path):
    """A SageMaker local-mode notebook (PyTorch in a container image), its import changed
    to trainctl.sagemaker, executed cell by cell in a real kernel (nbclient)."""
    import nbformat
    from nbclient import NotebookClient

    parameters = (
        f"SOURCE_DIR = {str(EXAMPLES / 'digits')!r}\nIMAGE_URI = {node_image!r}\n"
        f"BASE_JOB_NAME = {JOB_PREFIX + '-nb'!r}"
    )
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(parameters)] + [
        nbformat.v4.new_code_cell(source) for source in NOTEBOOK_CELLS
    ]
    NotebookClient(
        notebook,
        timeout=200,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    path = tmp_path / "sagemaker-notebook.ipynb"
    nbformat.write(notebook, path)  # kept with the test's files, outputs included

    def text(cell: int) -> str:  # streams, and what rich displays in a notebook
        outputs = notebook.cells[cell].outputs
        return "".join(
            o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs
        )

    assert "[algo-1]" in text(3) and "Completed" in text(3)  # fit() streamed both nodes
    model, state = text(4).split()
    assert model.endswith("/output/model.tar.gz") and state == "Completed"
    rows = json.loads(text(5))
    assert [r["metric_name"] for r in rows] == ["train:loss", "train:loss"]
    assert all(r["value"] > 0 for r in rows)
    assert not job_containers(in_podman, f"{JOB_PREFIX}-nb")


HUNG_ENGINE = """#!/bin/sh
# Lists the job's two containers; hangs when asked to remove them (a stuck engine).
case "$1" in
  ps) echo c0ffee01; echo c0ffee02 ;;
  rm) echo "$@" > "$(dirname "$0")/rm-args"; exec sleep 30 ;;
esac
"""


@pytest.mark.timeout(90)  # (passes in a second; a loaded CI machine took 30 s)
def test_an_engine_that_hangs_at_teardown_is_one_line_and_the_rest_is_removed(
    home, tmp_path, monkeypatch
):
    """`podman rm` that never answers: teardown says which containers are left and how to
    remove them, in one line, after removing the job's node directories all the same."""
    import trainctl.image.container as container_module
    from trainctl.image.container import ContainerCleanupError
    from trainctl.provisioning.local import ENGINE_MARKER, LocalProvider

    engine = tmp_path / "bin" / "podman"
    engine.parent.mkdir()
    engine.write_text(HUNG_ENGINE)
    engine.chmod(0o755)
    monkeypatch.setattr(container_module, "REMOVE_SECONDS", 0.5)
    provider = LocalProvider()
    nodes = provider.nodes_dir("hung-job")
    (nodes / "attempt-1" / "node-0").mkdir(parents=True)
    (nodes / ENGINE_MARKER).write_text(str(engine))
    with pytest.raises(ContainerCleanupError) as raised:
        provider.terminate("hung-job", grace=0)
    assert str(raised.value) == (
        "`podman rm -f` did not answer within 0.5 s; remove them yourself: "
        "podman rm -f c0ffee01 c0ffee02"
    )
    assert (engine.parent / "rm-args").read_text().split()[-2:] == ["c0ffee01", "c0ffee02"]
    assert not nodes.exists()
