"""What a job would do, without doing it: the dry run behind `submit --dry-run` and
`Estimator.fit(dry_run=True)`, and the node agent command the controller really runs.

A plan is `{"job", "provider", "requests": [{"service", "operation", "params"}...],
"nodes": [{"rank", "host", "address", "agent", "command", "env"}...]}`: every mutating call
provisioning would make (the provider's own builders produce them, so they are the calls a
real submit sends), and per node the agent command, the launcher command the agent runs and
the environment it gets. No mutating call is made; secret-looking values are redacted.
Addresses and ids that exist only after launch are shown as placeholders.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.cluster import ClusterInfo
from trainctl.controller.agents import agent_argv, agent_env
from trainctl.redact import Redactor, redact_env
from trainctl.spec.job import JobSpec
from trainctl.store import Store

if TYPE_CHECKING:
    from trainctl.provisioning.base import NodeRunner


def _source_request(spec: JobSpec, store: Store, max_bytes: int, name: str) -> dict[str, Any]:
    from trainctl.packaging import package_source
    from trainctl.record.locations import source_target

    with tempfile.TemporaryDirectory(prefix="trainctl-plan-") as tmp:
        packaged = package_source(
            Path(spec.source_dir), Path(tmp) / "sourcedir.tar.gz", max_bytes=max_bytes
        )
        target, key = source_target(spec, name, store, packaged.sha256)
        uploaded = target.matches(key, packaged.path)  # (as create_job decides)
    operation, params = target.put_request(key)
    params.update(bytes=packaged.size, files=packaged.file_count, sha256=packaged.sha256)
    if uploaded:
        params["skipped"] = "already there (same content)"
    return {**operation, "params": params}


def _node_env(spec: JobSpec, cluster: ClusterInfo, rank: int, extra: dict[str, str]) -> dict:
    from trainctl.launcher.layout import Layout, sagemaker_env
    from trainctl.spec.catalog import CATALOG

    itype = CATALOG[spec.instance_type]
    env = dict(cluster.network_env)
    env.update(
        sagemaker_env(
            spec,
            cluster,
            rank,
            Layout(Path(cluster.node(rank).root)),
            num_gpus=itype.gpus,
            num_cpus=itype.vcpus or os.cpu_count() or 1,
        )
    )
    env.update(extra)
    env.update(spec.environment)
    return Redactor.for_spec(spec).env(redact_env(env))


def _agent_command(
    runner: NodeRunner, cluster: ClusterInfo, rank: int, store_uri: str
) -> list[str]:
    """What starts the node's agent: the agent itself, or the engine command that runs it in
    the job's image."""
    from trainctl.spec.settings import get_settings

    argv = agent_argv(runner.python, store_uri, cluster.job, cluster.attempt, rank)
    return runner.command(argv, set(agent_env(get_settings())))


def plan_job(spec: JobSpec, store: Store | None = None) -> dict[str, Any]:
    """The dry run of submitting `spec` (see the module docstring)."""
    from trainctl.controller.submit import generate_job_name, validate_offline
    from trainctl.launcher import build_node_command
    from trainctl.provisioning import get_provider
    from trainctl.spec.request import CapacityRequest
    from trainctl.spec.settings import get_settings
    from trainctl.store import default_store

    store = store or default_store()
    validate_offline(spec, store.uri)
    provider = get_provider(spec.instance_type, spec.region)
    name = spec.job_name or generate_job_name(spec.entry_point)
    max_bytes = int(get_settings().max_source_mb * 1024 * 1024)
    requests = [_source_request(spec, store, max_bytes, name)]
    if spec.builds_image:
        # What the submit would build (and push): the plan hashes the inputs, builds nothing.
        from trainctl.controller.submit import image_build_target
        from trainctl.image.build import plan_for_spec

        repository, push = image_build_target(spec)
        build = plan_for_spec(spec, repository=repository)
        requests.append(
            {
                "service": "image",
                "operation": "BuildAndPush" if push else "Build",
                "params": {"image": build.image, "base_image": build.base_image},
            }
        )
        spec = spec.model_copy(update={"image_uri": build.image})
    capacity_request = CapacityRequest.of(spec)
    requests += provider.dry_run(capacity_request, name, 1)
    cluster = provider.planned_cluster(capacity_request, name, 1)
    nodes = []
    for node in cluster.nodes:
        runner = provider.node_runner(cluster, node.rank)
        command = build_node_command(spec, cluster, node.rank, python=runner.python)
        nodes.append(
            {
                "rank": node.rank,
                "host": node.host,
                "address": node.address,
                "agent": _agent_command(runner, cluster, node.rank, store.uri),
                "command": command.argv,
                "env": _node_env(spec, cluster, node.rank, command.env),
            }
        )
    from trainctl.provisioning.base import WarmPools

    capacity = provider.capacity_plan(capacity_request) if isinstance(provider, WarmPools) else None
    # (a secret hyperparameter is in each node's command line and SM_HPS too)
    return Redactor.for_spec(spec).tree(
        {
            "job": name,
            "provider": provider.name,
            "instance_type": spec.instance_type,
            "instance_count": spec.instance_count,
            **({"capacity": capacity} if capacity else {}),
            "requests": requests,
            "nodes": nodes,
        }
    )
