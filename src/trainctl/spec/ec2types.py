"""Every EC2 instance type, from EC2's own DescribeInstanceTypes; prices from a named table.

The types (vCPUs, memory, GPUs and their memory, EFA interfaces, network performance) come
from DescribeInstanceTypes: a snapshot ships with trainctl (data/ec2-instance-types.json.gz,
written by tools/ec2-instance-types.py, which names where it asked), and a cache of the same
rows (HOME/cache/ec2-instance-types.json) is kept from the region trainctl talks to: the EC2
preflight asks for the job's types, `trainctl types --refresh` for every type. The cache's
rows win and its new types join. Nothing here calls AWS at import or lookup: a job file is
checked offline.

On-demand prices are a shipped table (data/ec2-prices.csv) whose header names its source;
a type not in it has no price ("no price known"), never a guessed one.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any

SNAPSHOT = "ec2-instance-types.json.gz"
PRICES = "ec2-prices.csv"
CACHE_NAME = "ec2-instance-types.json"
# One row per type: [vcpus, memory MiB, GPUs, GPU memory MiB, GPU name, EFA interfaces,
# network performance]
Row = list[Any]


def row_of(item: dict[str, Any]) -> Row:
    """The row of one DescribeInstanceTypes entry."""
    gpu = item.get("GpuInfo") or {}
    gpus = gpu.get("Gpus") or []
    network = item.get("NetworkInfo") or {}
    return [
        int((item.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
        int((item.get("MemoryInfo") or {}).get("SizeInMiB") or 0),
        sum(int(g.get("Count") or 0) for g in gpus),
        int(gpu.get("TotalGpuMemoryInMiB") or 0),
        str(gpus[0].get("Name") or "") if gpus else "",
        int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0),
        str(network.get("NetworkPerformance") or ""),
    ]


def describe_all(ec2: Any, types: list[str] | None = None) -> dict[str, Row]:
    """Every type the region's DescribeInstanceTypes lists (or those of `types`), as rows."""
    rows: dict[str, Row] = {}
    kwargs = {"InstanceTypes": sorted(set(types))} if types else {}
    for page in ec2.get_paginator("describe_instance_types").paginate(**kwargs):
        for item in page.get("InstanceTypes", []):
            rows[str(item["InstanceType"])] = row_of(item)
    return rows


def cache_path() -> Path:
    from trainctl.spec.home import trainctl_home

    return trainctl_home() / "cache" / CACHE_NAME


def refresh_cache(ec2: Any, region: str, types: list[str] | None = None) -> int:
    """Ask EC2's DescribeInstanceTypes for every type (or those of `types`) and keep the
    answer in the cache, over what it held; the number of types EC2 described."""
    rows = describe_all(ec2, types)
    if not rows:
        return 0
    path = cache_path()
    merged = {**_cached(), **rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    source = f"DescribeInstanceTypes in {region}, {time.strftime('%Y-%m-%d')}"
    tmp.write_text(json.dumps({"source": source, "types": merged}))
    tmp.replace(path)
    return len(rows)


def _snapshot() -> dict[str, Any]:
    raw = resources.files("trainctl.spec").joinpath("data", SNAPSHOT).read_bytes()
    return json.loads(gzip.decompress(raw))


def _cached() -> dict[str, Row]:
    try:
        data = json.loads(cache_path().read_text())
        rows = data["types"]
        return {str(k): list(v) for k, v in rows.items() if isinstance(v, list) and len(v) == 7}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # no cache, or one cut short: the snapshot stands


def prices() -> tuple[dict[str, float], str]:
    """USD/hour on demand by type, and the table's source (its `# source:` line)."""
    text = resources.files("trainctl.spec").joinpath("data", PRICES).read_text()
    source = next(
        (
            line[len("# source:") :].strip()
            for line in text.splitlines()
            if line.startswith("# source:")
        ),
        "",
    )
    rows = csv.reader(line for line in io.StringIO(text) if not line.startswith("#"))
    table = {name: float(price) for name, price in list(rows)[1:] if name}
    return table, source


# Types EC2 still runs that the snapshot's answer no longer lists (moto's copy of
# DescribeInstanceTypes dropped the P3s but p3dn; the public spot traces the replays use are
# p3's), with the figures of EC2's instance-type pages. Under the snapshot and the cache.
PREVIOUS_GENERATION: dict[str, Row] = {
    "p3.2xlarge": [8, 62464, 1, 16384, "V100", 0, "Up to 10 Gigabit"],
    "p3.8xlarge": [32, 249856, 4, 65536, "V100", 0, "10 Gigabit"],
    "p3.16xlarge": [64, 499712, 8, 131072, "V100", 0, "25 Gigabit"],
}


def ec2_rows() -> dict[str, Row]:
    """The snapshot's rows, with the cache's over them."""
    return {**PREVIOUS_GENERATION, **_snapshot()["types"], **_cached()}


def snapshot_source() -> str:
    return str(_snapshot().get("source", ""))
