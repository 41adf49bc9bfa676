"""Instance types trainctl knows: the embedded ones and the EC2 GPU types users pick.

Prices are on-demand USD/hour in us-east-1 (list prices; used for estimates only).
"""

from __future__ import annotations

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
    on_demand_usd_per_hour: float = 0.0


def _ec2(name: str, gpus: int, gpu_mem: int, vcpus: int, mem: int, efa: int, price: float):
    return InstanceType(name, "aws", gpus, gpu_mem, vcpus, mem, efa, price)


CATALOG: dict[str, InstanceType] = {
    t.name: t
    for t in [
        InstanceType("local", "local"),
        # SageMaker's local mode with every GPU of this machine (none: refused at submit)
        InstanceType("local_gpu", "local"),
        InstanceType("ssh", "ssh"),
        _ec2("p3.2xlarge", 1, 16, 8, 61, 0, 3.06),
        _ec2("p3.8xlarge", 4, 64, 32, 244, 0, 12.24),
        _ec2("p3.16xlarge", 8, 128, 64, 488, 0, 24.48),
        _ec2("p3dn.24xlarge", 8, 256, 96, 768, 1, 31.212),
        _ec2("p4d.24xlarge", 8, 320, 96, 1152, 4, 32.7726),
        _ec2("p4de.24xlarge", 8, 640, 96, 1152, 4, 40.9657),
        _ec2("p5.48xlarge", 8, 640, 192, 2048, 32, 98.32),
        _ec2("g5.xlarge", 1, 24, 4, 16, 0, 1.006),
        _ec2("g5.2xlarge", 1, 24, 8, 32, 0, 1.212),
        _ec2("g5.4xlarge", 1, 24, 16, 64, 0, 1.624),
        _ec2("g5.8xlarge", 1, 24, 32, 128, 1, 2.448),
        _ec2("g5.12xlarge", 4, 96, 48, 192, 1, 5.672),
        _ec2("g5.16xlarge", 1, 24, 64, 256, 1, 4.096),
        _ec2("g5.24xlarge", 4, 96, 96, 384, 1, 8.144),
        _ec2("g5.48xlarge", 8, 192, 192, 768, 1, 16.288),
    ]
}


# Installed provider plug-ins (trainctl.provisioning.ProviderPlugin) bring instance types.
PLUGIN_GROUP = "trainctl.providers"
_plugins_loaded = False


def plugin_entry_points() -> list:
    from importlib.metadata import entry_points

    return list(entry_points(group=PLUGIN_GROUP))


def _load_plugin_types() -> None:
    """Add the instance types of installed provider plug-ins, once per process: each entry
    point names an object with `instance_types` (the plug-in's ProviderPlugin)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in plugin_entry_points():
        for itype in getattr(entry.load(), "instance_types", ()):
            if isinstance(itype, InstanceType):
                CATALOG.setdefault(itype.name, itype)


def check_instance_type(name: str) -> InstanceType:
    if name not in CATALOG:
        _load_plugin_types()
    try:
        return CATALOG[name]
    except KeyError:
        families = sorted({n.split(".")[0] for n in CATALOG if "." in n})
        sagemaker = " (SageMaker's ml.<type> names these too)" if name.startswith("ml.") else ""
        raise ValueError(
            f"unknown instance type {name!r}; use 'local', 'ssh' or an EC2 GPU type "
            f"({', '.join(families)}: e.g. p3.2xlarge){sagemaker}"
        ) from None


def ec2_name(name: str) -> str:
    """SageMaker's `ml.p4d.24xlarge` is the EC2 type `p4d.24xlarge`: the same machine."""
    if isinstance(name, str) and name.startswith("ml.") and name[3:] in CATALOG:
        return name[3:]
    return name
