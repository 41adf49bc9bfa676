"""Capacity providers behind one small interface; one module per provider."""

from __future__ import annotations

from trainctl.errors import SpecError
from trainctl.provisioning.base import Provider
from trainctl.spec.catalog import CATALOG


def get_provider(instance_type: str, region: str | None = None) -> Provider:
    """The provider for an instance type, or a SpecError if it is not available yet.

    `region`: the job's (EC2), so a process that did not provision the job (a restarted
    controller, `trainctl stop`) finds its resources where they are.
    """
    kind = CATALOG[instance_type].provider
    if kind == "local":
        from trainctl.provisioning.local import LocalProvider

        return LocalProvider()
    if kind == "ssh":
        from trainctl.provisioning.ssh import SshProvider

        return SshProvider()
    if kind == "aws":
        import importlib.util

        if importlib.util.find_spec("boto3") is None:  # found without importing it
            raise SpecError(
                "instance_type",
                f"{instance_type!r} runs on EC2, which needs boto3: pip install 'trainctl[aws]'",
            )
        from trainctl.provisioning.aws import AwsProvider

        return AwsProvider(region=region)
    raise SpecError(
        "instance_type",
        f"{instance_type!r} needs the {kind!r} provider, which this version of trainctl "
        "does not have yet; use instance_type='local'",
    )
