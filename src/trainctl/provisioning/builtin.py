"""trainctl's own providers, as plug-ins: trainctl's pyproject.toml names each in the
`trainctl.providers` entry point group, the group a plug-in package registers in. Each
factory imports its provider only when asked (EC2's pulls boto3)."""

from __future__ import annotations

from trainctl.provisioning.base import Provider, ProviderPlugin


def _local(region: str | None) -> Provider:
    from trainctl.provisioning.local import LocalProvider

    return LocalProvider()


def _ssh(region: str | None) -> Provider:
    from trainctl.provisioning.ssh import SshProvider

    return SshProvider()


def _aws(region: str | None) -> Provider:
    from trainctl.provisioning.aws import AwsProvider

    return AwsProvider(region=region)


LOCAL = ProviderPlugin("local", _local)
SSH = ProviderPlugin("ssh", _ssh)
AWS = ProviderPlugin("aws", _aws, needs=("boto3", "trainctl[aws]"))
BUILT_IN = (LOCAL, SSH, AWS)
