"""Instance types trainctl knows: the embedded ones, every EC2 type, and plug-ins' types.

EC2's types come from DescribeInstanceTypes (trainctl.spec.ec2types: a shipped snapshot,
and the cache the EC2 preflight refreshes), read the first time a type is looked up, so
importing this costs nothing. Prices are on-demand USD/hour in us-east-1 from the table
ec2types names (0.0: no price known), for estimates only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    provider: str  # 'local' | 'ssh' | 'aws'
    gpus: int = 0
    gpu_memory_gib: int = 0
    vcpus: int = 0
    memory_gib: int = 0
    efa_interfaces: int = 0
    on_demand_usd_per_hour: float = 0.0  # 0.0: no price known
    gpu_name: str = ""
    network: str = ""

    def describe(self) -> dict[str, object]:
        """What `trainctl types` shows of it (JSON), prices as text too."""
        gpus = f"{self.gpus} x {self.gpu_name or 'GPU'} ({self.gpu_memory_gib} GiB)"
        price = self.on_demand_usd_per_hour
        return {
            "name": self.name,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "gpus": self.gpus,
            "gpu_name": self.gpu_name or None,
            "gpu_memory_gib": self.gpu_memory_gib,
            "efa_interfaces": self.efa_interfaces,
            "network": self.network or None,
            "on_demand_usd_per_hour": price or None,
            "gpus_text": gpus if self.gpus else "-",
            "price_text": f"${price:.4g}/h" if price else "no price known",
        }


EMBEDDED = (
    InstanceType("local", "local"),
    # SageMaker's local mode with every GPU of this machine (none: refused at submit)
    InstanceType("local_gpu", "local"),
    InstanceType("ssh", "ssh"),
)


def _ec2_types() -> dict[str, InstanceType]:
    from trainctl.spec.ec2types import ec2_rows, prices

    table, _ = prices()
    out = {}
    for name, (vcpus, mem_mib, gpus, gpu_mib, gpu_name, efa, network) in ec2_rows().items():
        out[name] = InstanceType(
            name,
            "aws",
            gpus=gpus,
            gpu_memory_gib=round(gpu_mib / 1024),
            vcpus=vcpus,
            memory_gib=round(mem_mib / 1024),
            efa_interfaces=efa,
            on_demand_usd_per_hour=table.get(name, 0.0),
            gpu_name=gpu_name,
            network=network,
        )
    return out


class Catalog(MutableMapping[str, InstanceType]):
    """Name -> InstanceType; EC2's types are read on the first lookup."""

    def __init__(self) -> None:
        self._types: dict[str, InstanceType] = {t.name: t for t in EMBEDDED}
        self._ec2_loaded = False

    def _all(self) -> dict[str, InstanceType]:
        if not self._ec2_loaded:
            self._ec2_loaded = True
            for name, itype in _ec2_types().items():
                self._types.setdefault(name, itype)
        return self._types

    def reload(self) -> None:
        """Read EC2's types again (after the cache was refreshed)."""
        self._types = {n: t for n, t in self._types.items() if t.provider != "aws"}
        self._ec2_loaded = False

    def __getitem__(self, name: str) -> InstanceType:
        return self._all()[name]

    def __setitem__(self, name: str, itype: InstanceType) -> None:
        self._all()[name] = itype

    def __delitem__(self, name: str) -> None:
        del self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        return name in self._types or name in self._all()


CATALOG = Catalog()


# Installed provider plug-ins (trainctl.provisioning.ProviderPlugin) bring instance types
# and job options.
PLUGIN_GROUP = "trainctl.providers"
_installed: dict[str, object] | None = None
_plugins_loaded = False


def installed_plugins() -> dict[str, object]:
    """What each installed plug-in's entry point names (its ProviderPlugin), by entry point
    name: the entry points read and loaded once per process."""
    global _installed
    if _installed is None:
        from importlib.metadata import entry_points

        _installed = {}
        for point in entry_points(group=PLUGIN_GROUP):
            try:
                _installed[point.name] = point.load()
            except Exception as exc:  # a broken or stale plug-in: not a reason for every
                # command to fail; its instance types are unknown, and it says why once
                import sys

                sys.stderr.write(
                    f"warning: provider plug-in {point.name!r} ({point.value}) does not load, "
                    f"left out: {type(exc).__name__}: {str(exc)[:200]}\n"
                )
    return _installed


def _load_plugin_types() -> None:
    """Add the instance types of installed provider plug-ins, once per process: each entry
    point names an object with `instance_types` (the plug-in's ProviderPlugin)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for plugin in installed_plugins().values():
        for itype in getattr(plugin, "instance_types", ()):
            if isinstance(itype, InstanceType):
                CATALOG.setdefault(itype.name, itype)


def plugin_blocks() -> dict[str, type]:
    """The option blocks of installed provider plug-ins, by plug-in name: the pydantic model
    a plug-in's `options` names (its fields are the keys of the job's `<name>:` block and
    submit's `--<name>-<field>` flags)."""
    from pydantic import BaseModel

    return {
        name: options
        for name, plugin in installed_plugins().items()
        if isinstance(options := getattr(plugin, "options", None), type)
        and issubclass(options, BaseModel)
    }


def check_instance_type(name: str) -> InstanceType:
    if name not in CATALOG:
        _load_plugin_types()
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(unknown_type(name)) from None


def find_types(pattern: str | None = None, *, gpus: bool = False) -> list[InstanceType]:
    """EC2's types whose name matches the shell glob `pattern` (ml. names too), by name."""
    from fnmatch import fnmatchcase

    if pattern and pattern.startswith("ml."):
        pattern = pattern[3:]
    return sorted(
        (
            t
            for t in CATALOG.values()
            if t.provider == "aws"
            and (not pattern or fnmatchcase(t.name, pattern))
            and (t.gpus or not gpus)
        ),
        key=lambda t: (t.name.split(".")[0], t.vcpus, t.name),  # c5.2xlarge before c5.12xlarge
    )


def close_types(name: str, n: int = 3) -> list[str]:
    """The known names closest to `name` (ml. names as SageMaker spells them)."""
    bare = name[3:] if name.startswith("ml.") else name
    found = difflib.get_close_matches(bare, list(CATALOG), n=n, cutoff=0.6)
    return [f"ml.{f}" if name.startswith("ml.") and "." in f else f for f in found]


def unknown_type(name: str) -> str:
    """One line: `name` is not a type, with the closest ones."""
    close = close_types(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (
        f"unknown instance type {name!r}{hint} (use 'local', 'ssh' or any EC2 type, e.g. "
        "p4d.24xlarge or c5.2xlarge; SageMaker's ml.<type> names them too)"
    )


def ec2_name(name: str) -> str:
    """SageMaker's `ml.p4d.24xlarge` is the EC2 type `p4d.24xlarge`: the same machine."""
    if isinstance(name, str) and name.startswith("ml.") and name[3:] in CATALOG:
        return name[3:]
    return name
