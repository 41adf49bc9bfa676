"""Capacity providers behind one small interface (base.Provider, with optional capabilities),
found by name: the built-in ones (local, ssh, aws), and plug-ins that register themselves.

A plug-in is one installed package with an entry point in the `trainctl.providers` group
naming a `ProviderPlugin`: its name, a factory (region -> Provider), its instance types and
its job options. Nothing in trainctl is edited for it (plugins/trainctl-slurm is one):

    # pyproject.toml of the plug-in
    [project.entry-points."trainctl.providers"]
    gcp = "trainctl_gcp:PLUGIN"
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from trainctl.errors import SpecError
from trainctl.provisioning.base import Provider
from trainctl.spec.catalog import CATALOG, InstanceType, installed_plugins


@dataclass(frozen=True)
class ProviderPlugin:
    """A provider and the instance types that select it (each with `provider=name`)."""

    name: str
    factory: Callable[[str | None], Provider]  # the job's region (None: the default)
    instance_types: tuple[InstanceType, ...] = field(default=())
    # The plug-in's own job options (a pydantic model, extra="forbid"): the keys of a job's
    # `<name>:` block, `--<name>-<option>` flags, `Estimator(<name>={...})`; a provider
    # reads them as `options.model_validate(request.provider_options.get(name, {}))`.
    options: type[BaseModel] | None = None


def _local(region: str | None) -> Provider:
    from trainctl.provisioning.local import LocalProvider

    return LocalProvider()


def _ssh(region: str | None) -> Provider:
    from trainctl.provisioning.ssh import SshProvider

    return SshProvider()


def _aws(region: str | None) -> Provider:
    from trainctl.provisioning.aws import AwsProvider

    return AwsProvider(region=region)


# The built-in providers (factories that import them only when asked), and the module each
# needs installed (looked up without importing it).
BUILT_IN: dict[str, Callable[[str | None], Provider]] = {"local": _local, "ssh": _ssh, "aws": _aws}
NEEDS = {"aws": "boto3"}
_plugins: dict[str, ProviderPlugin] = {}


def register_provider(plugin: ProviderPlugin) -> None:
    """Make a provider (and its instance types) known to this process."""
    for itype in plugin.instance_types:
        if itype.provider != plugin.name:
            raise ValueError(f"{itype.name}: provider {itype.provider!r}, not {plugin.name!r}")
        CATALOG.setdefault(itype.name, itype)
    _plugins[plugin.name] = plugin


def provider_names() -> list[str]:
    _load_plugins()
    return sorted({*BUILT_IN, *_plugins})


def _load_plugins() -> None:
    for name, plugin in installed_plugins().items():
        if name not in _plugins and isinstance(plugin, ProviderPlugin):
            register_provider(plugin)


def get_provider(instance_type: str, region: str | None = None) -> Provider:
    """The provider for an instance type, or a SpecError if it is not available.

    `region`: the job's (EC2), so a process that did not provision the job (a restarted
    controller, `trainctl stop`) finds its resources where they are.
    """
    kind = CATALOG[instance_type].provider
    if kind in BUILT_IN:
        needs = NEEDS.get(kind)
        if needs is not None and importlib.util.find_spec(needs) is None:
            raise SpecError(
                "instance_type",
                f"{instance_type!r} runs on the {kind} provider, which needs {needs}: "
                f"pip install 'trainctl[{kind}]'",
            )
        return BUILT_IN[kind](region)
    if kind not in _plugins:
        _load_plugins()
    if kind in _plugins:
        return _plugins[kind].factory(region)
    raise SpecError(
        "instance_type",
        f"{instance_type!r} needs the {kind!r} provider, which is not installed (providers: "
        f"{', '.join(provider_names())})",
    )
