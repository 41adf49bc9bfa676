#!/usr/bin/env python3
"""Write trainctl's snapshot of EC2's instance types (trainctl/spec/data/
ec2-instance-types.json.gz) from DescribeInstanceTypes, naming where it asked.

    tools/ec2-instance-types.py --region us-east-1            # AWS itself (credentials)
    tools/ec2-instance-types.py --endpoint-url http://127.0.0.1:5000 --source "moto 5.x"

The rows are trainctl.spec.ec2types.row_of's: vCPUs, memory, GPUs and their memory, EFA
interfaces, network performance. The EC2 provider's preflight refreshes a cache of the same
rows from the region it uses, so this snapshot only needs to be new enough to check job files
offline.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import boto3

from trainctl.spec.ec2types import SNAPSHOT, describe_all

OUT = Path(__file__).resolve().parents[1] / "src" / "trainctl" / "spec" / "data" / SNAPSHOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--source", default=None, help="Who answered, when not AWS itself.")
    args = parser.parse_args()
    ec2 = boto3.client("ec2", region_name=args.region, endpoint_url=args.endpoint_url)
    rows = describe_all(ec2)
    who = args.source or "AWS"
    source = f"DescribeInstanceTypes ({who}, {args.region}), {time.strftime('%Y-%m-%d')}"
    body = json.dumps(
        {"source": source, "types": dict(sorted(rows.items()))}, separators=(",", ":")
    )
    OUT.write_bytes(gzip.compress(body.encode(), mtime=0))
    print(f"{len(rows)} instance types -> {OUT} ({OUT.stat().st_size} bytes; {source})")


if __name__ == "__main__":
    main()
