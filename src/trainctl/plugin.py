"""What a provider plug-in may import from trainctl: this module, and nothing else of it.

A plug-in is a package of its own (plugins/trainctl-slurm is one) with an entry point in the
`trainctl.providers` group naming a `ProviderPlugin`. Everything it needs from trainctl is
here; every other module of trainctl may change between releases without notice, and
`tests/unit/test_plugin_face.py` fails when a plug-in in this repository imports one.

`API_VERSION` versions this face: a name here keeps its meaning within a version, a name is
added without a new version, and a name removed or changed takes a new one. A plug-in says
which version it was written for (`ProviderPlugin(api=...)`, this one by default), and a
provider written for another is refused in one line naming both, before anything is made.

The names, by what a provider does with them:

- register: `ProviderPlugin`, `InstanceType`, `API_VERSION`
- the contract: `Provider` (provision, start the agents, watch, terminate), `NodeRunner`,
  the optional capabilities `FaultInjection`, `CapacityProbe` (how many nodes provision
  could have now, asked without queueing or launching) and `SpotOutlook` (whether spot has
  room, where it cannot be counted), `make_cluster`, `ClusterInfo`, `NodeInfo`,
  `DEFAULT_MASTER_PORT`
- what provision reads: `JobSpec`, `CapacityRequest`, `get_settings` (the user's settings)
- outcomes: `NoCapacityError` (the job waits or shrinks), `StoppedOutsideError` (the owner
  ended the capacity outside trainctl), `SpecError` (bad input, exit 2), `TrainctlError`
- processes: `RunningProcess` (what `start_agent` returns), `LocalProcess` (one on this
  machine), and the tags that mark a job's processes as its own (`JOB_TAG`, `ATTEMPT_TAG`,
  `NODE_TAG`, `HOME_TAG`)
- loopback networks: `LOOPBACK`, `free_port`, `is_loopback`, `loopback_name`,
  `loopback_network_env`

(Loaded on first use: a plug-in's entry point is read by every `trainctl` command, `--help`
too, and must not import what its provider needs only to run.)
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

__all__ = [
    "API_VERSION",
    "ATTEMPT_TAG",
    "DEFAULT_MASTER_PORT",
    "HOME_TAG",
    "JOB_TAG",
    "LOOPBACK",
    "NODE_TAG",
    "CapacityProbe",
    "CapacityRequest",
    "ClusterInfo",
    "FaultInjection",
    "InstanceType",
    "JobSpec",
    "LocalProcess",
    "NoCapacityError",
    "NodeInfo",
    "NodeRunner",
    "Provider",
    "ProviderPlugin",
    "RunningProcess",
    "SpecError",
    "SpotOutlook",
    "StoppedOutsideError",
    "TrainctlError",
    "free_port",
    "get_settings",
    "is_loopback",
    "loopback_name",
    "loopback_network_env",
    "make_cluster",
]


def __getattr__(name: str) -> Any:
    where = _where()
    if name not in where:
        raise AttributeError(f"trainctl.plugin has no {name!r}: a plug-in may use {__all__}")
    module, attr = where[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


@functools.cache
def _where() -> dict[str, tuple[str, str]]:
    """name -> (the module that holds it, its name there), read from the imports below: the
    one list of where each name comes from, for type checkers and for __getattr__ alike."""
    import ast

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If))
    return {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


if TYPE_CHECKING:  # what each name is (and, read by _where, where it comes from)
    from trainctl.cluster import (
        ClusterInfo,
        NodeInfo,
        is_loopback,
        loopback_name,
        loopback_network_env,
    )
    from trainctl.errors import SpecError, TrainctlError
    from trainctl.procs import ATTEMPT_TAG, HOME_TAG, JOB_TAG, NODE_TAG
    from trainctl.provisioning.base import (
        DEFAULT_MASTER_PORT,
        CapacityProbe,
        FaultInjection,
        NoCapacityError,
        NodeRunner,
        Provider,
        ProviderPlugin,
        SpotOutlook,
        StoppedOutsideError,
        make_cluster,
    )
    from trainctl.provisioning.base import PLUGIN_API as API_VERSION
    from trainctl.provisioning.ports import LOOPBACK, free_port
    from trainctl.spec.catalog import InstanceType
    from trainctl.spec.job import JobSpec
    from trainctl.spec.request import CapacityRequest
    from trainctl.spec.settings import get_settings
    from trainctl.transport import RunningProcess
    from trainctl.transport.local import LocalProcess
