"""Convert SkyPilot's public spot traces into trainctl's trace format (trainctl.spec.trace).

    python bench/traces/convert_skypilot.py SPOT_TRACES_CHECKOUT [--out src/trainctl/replay/traces]

SPOT_TRACES_CHECKOUT is a copy of https://github.com/skypilot-org/spot-traces: spot
availability and preemption of AWS p3.2xlarge (one V100) measured by asking EC2 for N
instances every 5 minutes, published with Wu et al., "Can't Be Late: Optimizing Spot
Instance Savings under Deadlines" (NSDI 2024). Each of its files is one zone:
{"metadata": {"gap_seconds": 300}, "data": [instances available at each tick, ...]}.

Each trace written here gathers one data set's zones; equal ticks in a row become one
interval, and every zone is cut to the shortest zone's length (a trace covers the same time
in every zone). Prices (the data sets have none): the on-demand list price of p3.2xlarge
(AWS's price list, as trainctl's instance catalog has it) and the spot price the traces'
authors use for it in their simulator (us-west-2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# where trainctl reads its named traces (trainctl estimate --trace NAME, bench/spot.py)
OUT = HERE.parent.parent / "src" / "trainctl" / "replay" / "traces"
REPO = "https://github.com/skypilot-org/spot-traces"
PRICES = {
    "spot_usd_per_hour": 0.9731,
    "on_demand_usd_per_hour": 3.06,
    "source": "on-demand: AWS's list price for p3.2xlarge (us-east-1, us-east-2, us-west-2); "
    "spot: the p3.2xlarge us-west-2 price the traces' authors use in their simulator "
    "(sky_spot/utils.py, COSTS), one price for the whole trace",
}
# name -> (folder in the checkout, instances asked for per zone, what it is)
DATA_SETS = {
    "aws-p3-16node-2023-08": (
        "availability/16-node/aws-08-27-2023",
        16,
        "16 x p3.2xlarge asked for every 5 minutes in 3 zones (us-east-2b, us-west-2a, "
        "us-west-2c) from 2023-08-27: how many EC2 would give at each tick",
    ),
    "aws-p3-4node-preemption-2023-08": (
        "preemption/4-node/aws-08-03-2023",
        4,
        "4 x p3.2xlarge held and relaunched in 3 zones (us-east-1f, us-east-2a, us-west-2c) "
        "from 2023-08-03, 13 days: how many were running at each 5-minute tick",
    ),
    "aws-p3-1node-2023-02": (
        "availability/1-node/aws-02-15-2023",
        1,
        "1 x p3.2xlarge asked for every 5 minutes in 9 zones of us-east-1, us-east-2 and "
        "us-west-2 from 2023-02-15, 45 days",
    ),
}


def runs(values: list[int], gap: float, length: int) -> list[tuple[float, float, int]]:
    """Run-length intervals [start, end) of the first `length` ticks."""
    out: list[tuple[float, float, int]] = []
    for tick, value in enumerate(values[:length]):
        start = tick * gap
        if out and out[-1][2] == value:
            out[-1] = (out[-1][0], start + gap, value)
        else:
            out.append((start, start + gap, value))
    return out


def convert(checkout: Path, name: str) -> dict:
    folder, pool, description = DATA_SETS[name]
    zones = {}
    gap = None
    for path in sorted((checkout / folder).glob("*.json")):
        raw = json.loads(path.read_text())
        gap = raw["metadata"]["gap_seconds"]
        zones[path.name.split("_")[0]] = [int(v) for v in raw["data"]]
    if not zones or gap is None:
        raise SystemExit(f"no trace files in {checkout / folder}")
    length = min(len(values) for values in zones.values())
    capacity = [
        {"zone": zone, "start_s": start, "end_s": end, "available": min(value, pool)}
        for zone, values in sorted(zones.items())
        for start, end, value in runs(values, gap, length)
    ]
    days = length * gap / 86400
    return {
        "name": name,
        "description": f"{description}; {days:.1f} days in each zone",
        "source": f"{REPO} ({folder}), from Wu et al., Can't Be Late, NSDI 2024",
        "instance_type": "p3.2xlarge",
        "pool_size": pool,
        "prices": PRICES,
        "capacity": capacity,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkout", type=Path)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    from trainctl.spec.trace import parse_trace

    for name in DATA_SETS:
        trace = convert(args.checkout, name)
        parse_trace(trace)  # what is written is a trace trainctl reads
        path = args.out / f"{name}.json"
        # one row per line: small diffs, readable
        rows = ",\n".join("    " + json.dumps(row) for row in trace["capacity"])
        head = {k: v for k, v in trace.items() if k != "capacity"}
        text = json.dumps(head, indent=2)[:-2] + ',\n  "capacity": [\n' + rows + "\n  ]\n}\n"
        path.write_text(text)
        print(f"{path}: {len(trace['capacity'])} intervals", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
