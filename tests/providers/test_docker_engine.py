"""The docker code path against a real Docker engine (a private dockerd, tests/dockerd.py):
build -> push to a loopback registry -> pull -> a 2-node job in the pulled image, then
examples/digits in docker containers: stop (SIGTERM through `docker run`'s signal proxy and
docker-init, and torchrun), and a killed node. podman covers the same ground in
test_container_run.py; the two engines differ in what matters here: image storage, build
(docker's builder), `--init`, signal proxying and what happens to a container when its
`docker run` client dies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers import FIXTURES, TORCHRUN
from tests.providers.test_container_run import (
    AGENT_DISTRIBUTIONS,
    JOB_PREFIX,
    check_killed_node_is_replaced,
    check_stop_saves_an_emergency_checkpoint,
    image_job,
    import_node_image,
)
from tests.rigs.dockerd import Dockerd, dockerd  # noqa: F401  (the session's daemon)
from tests.rigs.registry import registry  # noqa: F401
from trainctl.image import engine as engine_module
from trainctl.image.container import job_containers
from trainctl.image.engine import Engine, find_engine


@pytest.fixture(scope="module")
def docker_node_image(dockerd: Dockerd) -> str:  # noqa: F811
    """The node image of test_container_run (python, torch, trainctl), in dockerd. Not
    removed: the daemon is this module's own, and its data root goes with it (an `rmi` of
    the torch-sized image first was ~10 s of the file's teardown for nothing)."""
    tag = f"localhost/trainctl-test-node:{os.getpid()}"
    env = {**os.environ, "DOCKER_HOST": dockerd.host}
    import_node_image([dockerd.cli, "import", "-", tag], tag, env)
    return tag


@pytest.fixture(scope="module")
def docker_agent_image(dockerd: Dockerd) -> str:  # noqa: F811
    """An image with python and what the agent needs, no torch: pushing one made from the
    torch-sized node image was most of a minute of docker's compression."""
    tag = f"localhost/trainctl-test-agent:{os.getpid()}"
    env = {**os.environ, "DOCKER_HOST": dockerd.host}
    import_node_image([dockerd.cli, "import", "-", tag], tag, env, AGENT_DISTRIBUTIONS)
    return tag


@pytest.fixture
def in_docker(home, monkeypatch, dockerd: Dockerd, docker_node_image) -> Iterator[Engine]:  # noqa: F811
    """Jobs of this test use the private dockerd; none of their containers may be left."""
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "docker")
    engine = find_engine("docker")
    assert engine is not None, "docker does not answer on the private daemon"
    yield engine
    names = dockerd.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
    left = [n for n in names if n.startswith(f"trainctl-{JOB_PREFIX}-")]
    if left:  # clean up before failing so one bad test does not poison the rest
        dockerd.run("rm", "-f", *left)
    assert not left, f"containers left behind: {left}"


@pytest.mark.timeout(240)
def test_build_push_pull_then_a_two_node_job_runs_in_docker(
    in_docker,
    docker_agent_image,
    registry,  # noqa: F811
):
    """docker's builder makes the job's image (toolkit and code on the base), pushes it to
    a registry on loopback; removed here, it is pulled back by the job's preflight and both
    nodes run in it. (Training in docker's containers: the stop and kill tests below.)"""
    from trainctl.image.build import build_image, plan_build

    plan = plan_build(
        FIXTURES / "imagejob",
        "train.py",
        base_image=docker_agent_image,
        repository=f"{registry.host}/trainctl/imagejob-docker",
        s3=False,
    )
    built = build_image(plan, push=True, engine=in_docker)
    try:
        assert built.built and built.pushed, built
        assert built.commands[0][:2] == [in_docker.path, "build"]
        assert registry.has_manifest("trainctl/imagejob-docker", built.tag)
        again = build_image(plan, push=True, engine=in_docker)
        assert not again.built and not again.pushed, again
        assert in_docker.run("rmi", "-f", built.image, timeout=120).returncode == 0
        assert not in_docker.image_exists(built.image)

        job = image_job(built.image).fit(logs=False)  # preflight pulls it back
        info = job.describe()
        assert info["state"] == "Completed", info
        assert in_docker.image_exists(built.image)
        node0 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-0.log")
        node1 = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
        # every node ran in the pulled image, at its SageMaker paths
        assert "rank 0/2 in /opt/ml/code" in node0 and "rank 1/2 in /opt/ml/code" in node1
        assert "saved model to /opt/ml/model/model.txt" in node0
        files = {i.key for i in job.store.list(f"jobs/{job.name}")}
        assert f"jobs/{job.name}/output/model.tar.gz" in files
        assert f"jobs/{job.name}/checkpoints/host-1.txt" in files, files
        assert not job_containers(in_docker, job.name)
    finally:
        in_docker.run("rmi", "-f", built.image, timeout=120)


@pytest.mark.timeout(150)
def test_stop_reaches_the_agent_inside_a_docker_container(in_docker, docker_node_image):
    """The `docker run` client proxies the SIGTERM to docker-init, which hands it on, to the
    agent and through torchrun to the script."""
    check_stop_saves_an_emergency_checkpoint(in_docker, docker_node_image, distribution=TORCHRUN)


@pytest.mark.timeout(150)
def test_killed_docker_node_is_replaced_and_the_job_resumes(in_docker, docker_node_image):
    """A killed `docker run` client leaves its container running under dockerd: the kill
    must take the container too before the next attempt resumes."""
    check_killed_node_is_replaced(in_docker, docker_node_image)


# Not 30 s: the file's last test, so the module's dockerd is torn down in its teardown
# (dockerd's stop and its data root, the torch image's layers with it), slow under load.
@pytest.mark.timeout(150)
def test_engine_answer_is_not_cached_across_daemons(monkeypatch, dockerd):  # noqa: F811
    """Whether docker answers depends on DOCKER_HOST: a daemon found once must not be
    assumed for another endpoint."""
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "")
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    assert find_engine("docker") is not None
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dockerd.root / 'no-such.sock'}")
    assert find_engine("docker") is None
    assert engine_module._usable.cache_info().currsize >= 2
