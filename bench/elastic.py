"""Spot replay: an elastic job against one that waits for its full size, on a recorded
capacity trace, on the local provider.

The trace (bench/traces/*.json) says when how many of the job's nodes are reclaimed and for
how long no replacement can be had, e.g. spot-4to2.json: 4 nodes, at 15 s into training
two of them are reclaimed and the pool has room for only 2 for 45 s. It is replayed with
injected faults (`nocapacity:2,3@15+45`: the nodes are killed and the local provider
withholds their capacity), the same way for both jobs:

- waiting: instance_count=4 - relaunches when 4 nodes can be had again (trainctl's
  behaviour without min_instance_count, and what most managed-training services do);
- elastic: instance_count=4, min_instance_count=2 - goes on with 2 after
  elastic_wait_seconds (5 s here), grows back to 4 at a checkpoint once the capacity is back.

The workload is the elastic test script (tests/fixtures/elastic/train.py: digits, global
batch 64 split over the world, every sample once per epoch) with simulated compute per
sample (--sample-delay), so a step on 2 nodes takes twice as long as on 4, as data-parallel
compute does. Measured from the job records: time from submission to Completed, and
node-seconds (nodes x seconds of each attempt: what spot capacity is paid for), elastic over
waiting, repetitions interleaved.

    python -m bench.elastic [--trace bench/traces/spot-4to2.json] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, REPO, log, summary

SOURCE = REPO / "tests" / "fixtures" / "elastic"
HYPERPARAMETERS = {
    "epochs": 4,
    "global-batch": 64,
    "max-per-worker": 16,
    "seed": 0,
    "sample-delay": 0.02,  # 4 nodes: 0.32 s a step; 2 nodes: 0.64 s
    "checkpoint-every": 4,
}
ELASTIC_WAIT_SECONDS = 5


def faults(trace: dict[str, Any]) -> list[str]:
    out = []
    for event in trace["events"]:
        nodes = ",".join(str(r) for r in event["reclaimed"])
        out.append(f"nocapacity:{nodes}@{event['at']:g}+{event['for']:g}")
    return out


def run(mode: str, trace: dict[str, Any]) -> dict[str, Any]:
    from trainctl import Estimator
    from trainctl.record.keys import parse_iso

    with tempfile.TemporaryDirectory(prefix=f"trainctl-bench-elastic-{mode}-") as home:
        os.environ["TRAINCTL_HOME"] = home
        os.environ.pop("TRAINCTL_STORE", None)
        os.environ["TRAINCTL_ELASTIC_WAIT_SECONDS"] = str(ELASTIC_WAIT_SECONDS)
        job = Estimator(
            "train.py",
            source_dir=str(SOURCE),
            instance_count=trace["nodes"],
            min_instance_count=trace["min_nodes"] if mode == "elastic" else None,
            distribution={"torch_distributed": {"enabled": True}},
            hyperparameters=HYPERPARAMETERS,
            faults=faults(trace),
        ).fit(logs=False)
        info = job.describe()
        if info["state"] != "Completed":
            raise RuntimeError(f"{mode} job {job.name} ended {info['state']}: {info}")
        attempts = info["attempts"]
        node_seconds = sum(
            len(a["nodes"]) * (parse_iso(a["ended_at"]) - parse_iso(a["started_at"]))
            for a in attempts
        )
        created = parse_iso(info["created_at"])
        return {
            "seconds": parse_iso(info["ended_at"]) - created,
            "node_seconds": node_seconds,
            "sizes": [len(a["nodes"]) for a in attempts],
            "causes": [a.get("resized") or a.get("cause") for a in attempts],
            # what a model of the run is calibrated from (bench/spot.py --check-elastic)
            "attempts": [
                {
                    "nodes": len(a["nodes"]),
                    "started_s": parse_iso(a["started_at"]) - created,
                    "ended_s": parse_iso(a["ended_at"]) - created,
                    "training_seconds": a.get("training_seconds"),
                    "resumed_from_step": a.get("resumed_from_step"),
                    "last_step": a.get("last_step"),
                    "last_checkpoint_step": a.get("last_checkpoint_step"),
                }
                for a in attempts
            ],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(BENCH_DIR / "traces" / "spot-4to2.json"))
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    trace = json.loads(Path(args.trace).read_text())
    runs: dict[str, list[dict[str, Any]]] = {"waiting": [], "elastic": []}
    for rep in range(args.reps):
        for mode in ("waiting", "elastic") if rep % 2 == 0 else ("elastic", "waiting"):
            result = run(mode, trace)
            log(f"rep {rep} {mode}: {result}")
            runs[mode].append(result)
    out: dict[str, Any] = {"trace": trace, "runs": runs}
    print(f"spot replay {Path(args.trace).name}: {trace['description']}")
    for key, label in (("seconds", "time to Completed"), ("node_seconds", "node-seconds")):
        wait, elastic = (
            summary([r[key] for r in runs["waiting"]]),
            summary([r[key] for r in runs["elastic"]]),
        )
        pairs = [e[key] / w[key] for e, w in zip(runs["elastic"], runs["waiting"], strict=True)]
        ratio = elastic["median"] / wait["median"]
        out[key] = {
            "waiting": wait,
            "elastic": elastic,
            "ratio": ratio,
            "ratio_spread": [min(pairs), max(pairs)],
        }
        print(
            f"  {label:18s} waiting {wait['median']:.1f} [{wait['min']:.1f}-{wait['max']:.1f}]"
            f"  elastic {elastic['median']:.1f} [{elastic['min']:.1f}-{elastic['max']:.1f}]"
            f"  elastic/waiting x{ratio:.2f} [{min(pairs):.2f}-{max(pairs):.2f}]"
        )
    (BENCH_DIR / "elastic-results.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
