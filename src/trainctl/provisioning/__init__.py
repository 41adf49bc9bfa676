"""Capacity providers behind one small interface (base.Provider, with optional capabilities),
found by name in the `trainctl.providers` entry point group: trainctl's own (local, ssh, aws:
builtin.py, named by trainctl's pyproject.toml) and plug-ins, registered the same way.

A plug-in is one installed package with an entry point in that group naming a
`ProviderPlugin`: its name, a factory (region -> Provider), its instance types and its job
options. It imports from trainctl only `trainctl.plugin` (the face, versioned by its
API_VERSION), and nothing in trainctl is edited for it (plugins/trainctl-slurm is one):

    # pyproject.toml of the plug-in
    [project.entry-points."trainctl.providers"]
    gcp = "trainctl_gcp:PLUGIN"
"""

from __future__ import annotations

import importlib.util

from trainctl.errors import SpecError
from trainctl.provisioning.base import PLUGIN_API, Provider, ProviderPlugin
from trainctl.provisioning.builtin import BUILT_IN
from trainctl.spec.catalog import CATALOG, installed_plugins

__all__ = ["ProviderPlugin", "get_provider", "provider_names", "register_provider"]

_plugins: dict[str, ProviderPlugin] = {}


def register_provider(plugin: ProviderPlugin) -> None:
    """Make a provider (and its instance types) known to this process."""
    for itype in plugin.instance_types:
        if itype.provider != plugin.name:
            raise ValueError(f"{itype.name}: provider {itype.provider!r}, not {plugin.name!r}")
        CATALOG.setdefault(itype.name, itype)
    _plugins[plugin.name] = plugin


def _load_plugins() -> None:
    for plugin in installed_plugins().values():
        if isinstance(plugin, ProviderPlugin) and plugin.name not in _plugins:
            register_provider(plugin)
    # A copy of the package without its metadata (what a node or a controller host runs
    # from) has no entry points: its own providers are still these.
    for plugin in BUILT_IN:
        _plugins.setdefault(plugin.name, plugin)


def provider_names() -> list[str]:
    _load_plugins()
    return sorted(_plugins)


def get_provider(instance_type: str, region: str | None = None) -> Provider:
    """The provider for an instance type, or a SpecError if it is not available.

    `region`: the job's (EC2), so a process that did not provision the job (a restarted
    controller, `trainctl stop`) finds its resources where they are.
    """
    kind = CATALOG[instance_type].provider
    if kind not in _plugins:
        _load_plugins()
    plugin = _plugins.get(kind)
    if plugin is None:
        raise SpecError(
            "instance_type",
            f"{instance_type!r} needs the {kind!r} provider, which is not installed "
            f"(providers: {', '.join(provider_names())})",
        )
    if plugin.api != PLUGIN_API:
        raise SpecError(
            "instance_type",
            f"{instance_type!r} runs on the {kind} plug-in, written for trainctl's plug-in "
            f"API {plugin.api}; this trainctl has API {PLUGIN_API}: install matching versions",
        )
    if plugin.needs is not None and importlib.util.find_spec(plugin.needs[0]) is None:
        module, install = plugin.needs
        raise SpecError(
            "instance_type",
            f"{instance_type!r} runs on the {kind} provider, which needs {module}: "
            f"pip install '{install}'",
        )
    return plugin.factory(region)
