"""The node agent's command and environment, as the controller starts it (and as a dry run
shows it)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainctl.spec.settings import Settings


def agent_argv(python: str, store_uri: str, job: str, attempt: int, rank: int) -> list[str]:
    """The command that starts the node agent of `rank`."""
    return [
        python,
        "-m",
        "trainctl.node.agent",
        "--store",
        store_uri,
        "--job",
        job,
        "--attempt",
        str(attempt),
        "--rank",
        str(rank),
    ]


# Settings the agent acts on: it runs under the controller's values (config.yaml included),
# not those of the host it runs on.
AGENT_SETTINGS = (
    "log_sync_seconds",
    "lease_seconds",
    "orphan_timeout_seconds",
    "notice_grace_seconds",
    "checkpoint_sync_seconds",
    "heartbeat_seconds",
    "heartbeat_timeout_seconds",
    "control_poll_seconds",
)


def agent_env(settings: Settings) -> dict[str, str]:
    """What a node agent needs from here: the settings it acts on, the TRAINCTL_* variables
    in effect, and `node_environment`. Not TRAINCTL_HOME (the node has its own), and
    nothing else: a remote node never gets this machine's credentials."""
    from trainctl.procs import ATTEMPT_TAG, CONTROLLER_TAG, HOME_TAG, JOB_TAG, NODE_TAG

    env = {f"TRAINCTL_{name.upper()}": str(getattr(settings, name)) for name in AGENT_SETTINGS}
    not_passed = {"TRAINCTL_HOME", CONTROLLER_TAG, JOB_TAG, NODE_TAG, ATTEMPT_TAG, HOME_TAG}
    env.update(
        {k: v for k, v in os.environ.items() if k.startswith("TRAINCTL_") and k not in not_passed}
    )
    env.update(settings.node_environment)
    return env
