"""trainctl's Slurm provider, a plug-in as any third party would ship one: this package
registers itself through the `trainctl.providers` entry point (pyproject.toml) and imports
from trainctl only its plug-in face, `trainctl.plugin`, with its
instance type (`slurm`) and its job options (the `slurm:` block, `--slurm-*` flags,
`Estimator(slurm={...})`)."""

from __future__ import annotations

from trainctl.plugin import InstanceType, Provider, ProviderPlugin
from trainctl_slurm.options import SlurmOptions


def _provider(region: str | None) -> Provider:
    from trainctl_slurm.provider import SlurmProvider

    return SlurmProvider()


PLUGIN = ProviderPlugin(
    "slurm",
    _provider,
    (InstanceType("slurm", "slurm"),),
    options=SlurmOptions,
)

__all__ = ["PLUGIN", "SlurmOptions"]
