"""Cold and warm start on EC2 stand-ins: submit -> first training step, per stage, against
the local provider's launch of the same job on the same machine.

EC2 is moto and the instances are fresh sshd servers on loopback (the stand-ins of
tests/cloud.py, the same the EC2 tests use): a cold start meets hosts that have never seen
trainctl (the agent is uploaded, the requirements' venv is built), a warm start claims the
pool the cold job left (keep_alive_period_in_seconds) and finds all of it there. Instance boot
is not in it (moto's instances are running at once; a real one boots in 30-90 s), so each
stage shown is trainctl's own work. The job: examples/digits, 2 nodes, torchrun, with a
requirements.txt (numpy, already on the hosts, so the venv is built without downloads).

Repetitions interleave local, cold and warm. Stages come from the attempt's `startup` record
(capacity, ssh, agent, code, venv, launch, total); submit -> first step adds the packaging and
upload before provisioning.

    python -m bench.coldstart [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import log, ratio_figure, summary, temp_dir

GOAL_WARM_VS_LOCAL = 1.5
GOAL_STAGE_S = 10.0
STAGES = ("capacity", "ssh", "agent", "code", "venv", "launch")
HPS = {"epochs": 1, "lr": 0.1, "seed": 0, "checkpoint-every": 0}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def _source(workdir: Path) -> Path:
    source = workdir / "digits"
    shutil.copytree(EXAMPLE, source)
    (source / "requirements.txt").write_text("numpy\n")
    return source


def _host_python(workdir: Path) -> str:
    """An interpreter that sees this one's packages (torch, numpy, boto3...) but not
    trainctl: a venv whose .pth adds the site-packages (trainctl's editable install hook in
    there is a .pth of its own, which a path entry does not run)."""
    import site
    import subprocess
    import sysconfig

    venv = workdir / "host-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    Path(purelib, "host-packages.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return str(python)


def _fit(source: Path, **fields: Any) -> tuple[float, dict[str, float]]:
    """(submit -> first step seconds, the attempt's start-up stages) of one job."""
    from trainctl import Estimator
    from trainctl.record.jobstore import JobStore
    from trainctl.record.keys import parse_iso

    est = Estimator(
        entry_point="train.py",
        source_dir=str(source),
        instance_count=2,
        hyperparameters=HPS,
        distribution={"torch_distributed": {"enabled": True}},
        base_job_name="coldstart",
        **fields,
    )
    t0 = time.time()
    job = est.fit(logs=False)
    info = job.describe()
    if info["state"] != "Completed":
        raise RuntimeError(f"job {job.name} ended {info['state']}: {info.get('failure_reason')}")
    events = JobStore(job.store, job.name).events()
    startup = next((e for e in events if e.get("type") == "startup"), None)
    if startup is None:
        raise RuntimeError(
            f"job {job.name} recorded no start-up: {[e.get('type') for e in events]}"
        )
    stages = {k: float(v) for k, v in startup.items() if k not in ("time", "type", "attempt")}
    return parse_iso(startup["time"]) - t0, stages


def measure_runs(reps: int, workdir: Path) -> dict[str, list[tuple[float, dict[str, float]]]]:
    import logging

    import pytest

    from tests.rigs.cloud import ec2_fields, stand_in_cloud
    from tests.rigs.sshd import SshdFarm, require_sshd

    require_sshd()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {
        "local": [],
        "local-s3": [],
        "cold": [],
        "warm": [],
    }
    source = _source(workdir)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINCTL_HOME", str(workdir / "home"))
        env.delenv("TRAINCTL_STORE", raising=False)
        farms: list[SshdFarm] = []

        def fresh_hosts(rep: int) -> list[Any]:
            for farm in farms:
                farm.stop_all()
            farms[:] = [SshdFarm(workdir / f"hosts-{rep}")]
            return [farms[0].start("127.0.0.2"), farms[0].start("127.0.0.3")]

        try:
            with stand_in_cloud(env, fresh_hosts(0)) as cloud:
                # The hosts' Python has torch (as a DLAMI has) but not trainctl: a cold host
                # gets the agent uploaded.
                env.setenv("TRAINCTL_AWS_NODE_PYTHON", _host_python(workdir))
                local_store = (workdir / "local-store").as_uri()
                # Each job its own checkpoints (the default): none resumes another's.
                fields = {k: v for k, v in ec2_fields(cloud).items() if k != "checkpoint_s3_uri"}
                _fit(source, store_uri=local_store)  # the local venv and page cache, once
                for rep in range(reps):
                    if rep:
                        cloud.use_hosts(fresh_hosts(rep))
                    runs["local"].append(_fit(source, store_uri=local_store))
                    # The same, with the EC2 jobs' store (S3 on moto): the store's own part.
                    runs["local-s3"].append(_fit(source))
                    runs["cold"].append(_fit(source, keep_alive_period_in_seconds=600, **fields))
                    runs["warm"].append(_fit(source, **fields))
                    for kind in runs:
                        total, stages = runs[kind][-1]
                        shown = " ".join(f"{k} {v:.2f}" for k, v in stages.items())
                        log(
                            f"coldstart rep {rep + 1} {kind}: {total:.2f} s to first step ({shown})"
                        )
        finally:
            for farm in farms:
                farm.stop_all()
    return runs


def figures_of(runs: dict[str, list[tuple[float, dict[str, float]]]]) -> list[dict[str, Any]]:
    local = [t for t, _ in runs["local"]]
    cold = [t for t, _ in runs["cold"]]
    warm = [t for t, _ in runs["warm"]]

    def stage_medians(kind: str) -> dict[str, float | None]:
        return {
            s: summary([st[s] for _, st in runs[kind] if s in st])["median"]
            for s in (*STAGES, "to_first_step")
        }

    cold_stages = stage_medians("cold")
    slowest = max((v or 0.0) for k, v in cold_stages.items() if k in STAGES)
    detail: dict[str, Any] = {kind: stage_medians(kind) for kind in runs}
    detail["cold"] = cold_stages
    detail["submit_to_first_step_s"] = {
        kind: summary([t for t, _ in runs[kind]])["median"] for kind in runs
    }
    warm_fig = ratio_figure(
        "coldstart-warm",
        "warm start on EC2 stand-ins: submit -> first step, 2 nodes",
        "s",
        "the local provider's launch of the same job",
        local,
        warm,
        goal_text=f"<= {GOAL_WARM_VS_LOCAL}x",
        goal_max=GOAL_WARM_VS_LOCAL,
        detail=detail,
    )
    cold_fig = ratio_figure(
        "coldstart-cold",
        "cold start on EC2 stand-ins (no boot): submit -> first step, 2 nodes",
        "s",
        "the local provider's launch of the same job",
        local,
        cold,
        goal_text=f"every stage < {GOAL_STAGE_S:g} s",
        detail=detail,
    )
    cold_fig["pass"] = slowest < GOAL_STAGE_S
    return [warm_fig, cold_fig]


def figures(ctx: Any) -> list[dict[str, Any]]:
    """`make bench` (`--only coldstart`)."""
    workdir = temp_dir("trainctl-coldstart-")
    try:
        # 2 repetitions (each a warm and a cold start beside the local baseline: ~25 s):
        # make bench fits 15 minutes; `python -m bench.coldstart --reps 3` runs more
        return figures_of(measure_runs(2, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = temp_dir("trainctl-coldstart-")
    try:
        runs = measure_runs(args.reps, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figs = figures_of(runs)
    print(json.dumps([{k: f[k] for k in ("name", "ratio", "ratio_spread", "pass")} for f in figs]))
    print("stage medians, seconds (slowest node):")
    print(f"  {'':8s} " + " ".join(f"{s:>8s}" for s in (*STAGES, "to_first_step")))
    for kind in ("local", "local-s3", "cold", "warm"):
        stages = figs[0]["detail"][kind]
        cells = " ".join(
            f"{'-' if stages[s] is None else format(stages[s], '.2f'):>8s}"
            for s in (*STAGES, "to_first_step")
        )
        first_step = figs[0]["detail"]["submit_to_first_step_s"][kind]
        print(f"  {kind:8s} {cells}   submit -> first step {first_step:.2f}")
    return 0 if all(f["pass"] for f in figs) else 1


if __name__ == "__main__":
    sys.exit(main())
