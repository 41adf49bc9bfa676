"""The soak: random fault schedules through real jobs, each checked bit for bit against an
uninterrupted run and for the steps it redid.

    python -m bench.chaos [--schedules 20] [--seed 1] [--replay JSON] [--out FILE] [--keep]

A schedule is 1 to 3 events at steps of a 2-node job on local nodes with its store in S3
(moto, behind tests/rigs/faulty_s3.py's proxy), drawn from five kinds:

- `kill`: a node's processes all killed without warning (the job's fault `kill:R@stepS`);
- `notice`: a 2-minute interruption notice to a node (`notice:R@stepS`);
- `shrink`: a node killed and no capacity for it for D seconds (`nocapacity:R@stepS+D`): the
  job (min_instance_count 1) goes on with one node, then grows back;
- `controller`: kill -9 of the job's controller once the job reached step S, then `trainctl
  attach` D seconds later, which takes it over;
- `store`: the store refuses every write (503 SlowDown) for D seconds from step S.

The job (bench/chaos_job) trains to the same bits on one node or two, so every schedule,
shrinks included, must end with exactly the uninterrupted run's model. And no work may be
lost beyond what the fault model allows: an attempt ended by a kill (or a shrink's kill, or
its controller and nodes lost together) redid at most one checkpoint interval plus the
steps of one write, and one killed during a store outage (or before the nodes' first pass
after it) no more than what it trained since the outage began: what was stored before
it is never lost; one ended by a notice, or by a relaunch by choice (growing back), none;
a controller killed while its nodes trained loses nothing (they are adopted). A failing
schedule is printed as JSON: `--replay` runs it again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, Procs, log

JOB_DIR = BENCH_DIR / "chaos_job"
CHECKPOINT_EVERY = 10
WRITE_WINDOW_STEPS = 2  # steps trained while the newest checkpoint is written and uploaded
EPOCHS = 6
STEPS = EPOCHS * 1024 // 32  # chaos_job: SAMPLES // GLOBAL steps an epoch
STEP_DELAY = 0.06
KINDS = ("kill", "notice", "shrink", "controller", "store")
RUN_TIMEOUT = 420.0
ATTEMPT_FIELDS = (
    "number", "outcome", "cause", "resumed_from_step", "last_step", "last_checkpoint_step",
    "steps_lost", "faults",
)  # fmt: skip


@dataclass
class Event:
    kind: str
    step: int
    node: int = 1
    seconds: float = 0.0  # a shrink's time without capacity, the attach delay, the outage
    lag: float = 0.0  # controller and store events: seconds after the step is reached

    def fault(self) -> str | None:
        if self.kind in ("kill", "notice"):
            return f"{self.kind}:{self.node}@step{self.step}"
        if self.kind == "shrink":
            return f"nocapacity:{self.node}@step{self.step}+{self.seconds:g}"
        return None


@dataclass
class Schedule:
    number: int
    events: list[Event] = field(default_factory=list)

    def text(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str) -> Schedule:
        data = json.loads(text)
        return cls(data["number"], [Event(**e) for e in data["events"]])


def draw(number: int, rng: random.Random) -> Schedule:
    """1-3 events of distinct kinds at increasing steps, each 20+ steps after the last (so
    each hits a new attempt past its resume point)."""
    kinds = rng.sample(KINDS, rng.randint(1, 3))
    step = 0
    events = []
    for kind in kinds:
        step += rng.randint(20, 40)
        seconds = {"shrink": rng.choice([4, 8]), "controller": rng.uniform(0, 3)}.get(kind, 0.0)
        if kind == "store":
            seconds = rng.uniform(2, 5)
        lag = round(rng.uniform(0, 2), 1) if kind in ("controller", "store") else 0.0
        events.append(Event(kind, step, node=rng.randint(0, 1), seconds=round(seconds, 1), lag=lag))
    return Schedule(number, events)


# ------------------------------------------------------------------------------ the runs


class Stage:
    """What every run shares: a moto S3 server behind the faulty proxy, the environment that
    points trainctl at it, and a directory per run."""

    def __init__(self, root: Path) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        from tests.helpers import free_port
        from tests.rigs.faulty_s3 import FaultyS3Proxy

        self.root = root
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.proxy = FaultyS3Proxy(f"http://127.0.0.1:{port}").start()
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.proxy.url,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "TRAINCTL_HEARTBEAT_SECONDS": "1",
            "TRAINCTL_LEASE_SECONDS": "5",
            "TRAINCTL_ELASTIC_WAIT_SECONDS": "3",
        }.items():
            os.environ[name] = value
        self.bucket = "chaos"
        boto3.client("s3").create_bucket(Bucket=self.bucket)
        self.prefix = ""  # the run's keys in the bucket

    def home(self, name: str) -> Path:
        """The run `name`'s TRAINCTL_HOME and store (s3://chaos/<name>)."""
        home = self.root / name
        self.prefix = f"{name}/"
        os.environ["TRAINCTL_HOME"] = str(home)
        os.environ["TRAINCTL_STORE"] = f"s3://{self.bucket}/{name}"
        return home

    def save(self, name: str) -> Path:
        """A copy of the run `name`'s store (its record, node logs and statuses, manifests)
        in its directory, before the server that holds it goes away."""
        import boto3

        client = boto3.client("s3")  # through the proxy: reads pass
        dest = self.root / name / "store"
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{name}/"
        )
        for page in pages:
            for item in page.get("Contents", []):
                path = dest / item["Key"].removeprefix(f"{name}/")
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(self.bucket, item["Key"], str(path))
        return dest

    def close(self) -> None:
        self.proxy.stop()
        self.server.stop()


def estimator(**fields: Any):
    from trainctl import Estimator

    return Estimator(
        entry_point="train.py",
        source_dir=str(JOB_DIR),
        instance_count=2,
        min_instance_count=1,
        hyperparameters={
            "epochs": EPOCHS,
            "checkpoint-every": CHECKPOINT_EVERY,
            "step-delay": STEP_DELAY,
        },
        **fields,
    )


def model(job) -> dict[str, Any]:
    import torch

    data = job.store.get_bytes(f"jobs/{job.name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("model.pt")
        assert member is not None
        return torch.load(io.BytesIO(member.read()), weights_only=True)


def reached(job) -> int:
    """The step the job's nodes have reported (their statuses: whoever controls it)."""
    from trainctl.errors import StoreError

    best = 0
    try:
        for info in job.store.list(f"jobs/{job.name}/attempts"):
            if info.key.endswith(".status.json"):
                status = json.loads(job.store.get_text(info.key))
                best = max(best, int(status.get("step") or 0))
    except (StoreError, ValueError):
        pass
    return best


def wait_for_step(job, step: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reached(job) >= step:
            return True
        if job.describe()["state"] in ("Completed", "Failed", "Stopped"):
            return False
        time.sleep(0.3)
    return False


def kill_controller(job) -> None:
    lease = json.loads(job.store.get_text(f"jobs/{job.name}/lease.json"))
    os.kill(int(lease["pid"]), signal.SIGKILL)


def run(stage: Stage, schedule: Schedule, procs: Procs) -> dict[str, Any]:
    """One schedule through a job: its outcome and what the checks found."""
    from tests.rigs.faulty_s3 import Rule
    from trainctl.estimator import TrainingJob

    stage.home(f"run-{schedule.number}")
    faults = [f for e in schedule.events if (f := e.fault())]
    started = time.monotonic()
    job = estimator(faults=faults).fit(wait=False)
    attach: subprocess.Popen | None = None
    problems: list[str] = []
    outage: dict[str, int] = {}  # the store outage's first step, and a step past its end
    for event in sorted(schedule.events, key=lambda e: e.step):
        if event.kind not in ("controller", "store"):
            continue
        if not wait_for_step(job, event.step, RUN_TIMEOUT):
            problems.append(f"never reached step {event.step} for {event.kind}")
            break
        time.sleep(event.lag)
        if event.kind == "store":
            until = time.monotonic() + event.seconds
            outage["start"] = reached(job)
            stage.proxy.add(Rule(("PUT", "POST", "DELETE"), rf"^{stage.prefix}", 503, until=until))
            # The step by which the nodes are surely past it: a pass after the store is back
            # (a step the nodes' statuses report, which lags: an underestimate).
            timer = threading.Timer(event.seconds + 1.0, lambda: outage.update(end=reached(job)))
            timer.daemon = True
            timer.start()
        else:
            kill_controller(job)
            time.sleep(event.seconds)
            attach = procs.spawn(
                [str(Path(sys.executable).parent / "trainctl"), "attach", job.name],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
    deadline = started + RUN_TIMEOUT
    info = job.describe()
    while info["state"] not in ("Completed", "Failed", "Stopped") and time.monotonic() < deadline:
        time.sleep(0.5)
        info = TrainingJob.attach(job.name).describe()
    # The job's controller tears down after it records the end, and `attach` follows it
    # there: both gone soon after, or the run left them behind.
    settle = time.monotonic() + 60
    while procs.leftovers() and time.monotonic() < settle:
        time.sleep(0.5)
    if left := procs.leftovers():
        problems.append(f"{len(left)} process(es) still running 60 s after the job ended")
    if attach is not None:
        procs.end(attach, grace=30)
    return {
        "info": info,
        "problems": problems,
        "seconds": time.monotonic() - started,
        "job": job,
        "outage": outage,
    }


def check(result: dict[str, Any], schedule: Schedule, expected: dict[str, Any]) -> list[str]:
    """What the run got wrong: not Completed, another model, or more steps redone than the
    fault model allows."""
    import torch

    info = result["info"]
    problems = list(result["problems"])
    if info["state"] != "Completed":
        return [*problems, f"{info['state']}: {info.get('failure_reason')}"]
    got = model(result["job"])
    different = [k for k in expected if not torch.equal(got[k], expected[k])]
    if different:
        problems.append(f"model differs from the uninterrupted run's: {different}")
    kills = sum(e.kind in ("kill", "shrink") for e in schedule.events)
    allowed = CHECKPOINT_EVERY + WRITE_WINDOW_STEPS
    outage = result.get("outage", {})
    redone = extra = 0
    for attempt in info["attempts"][:-1]:
        lost, cause = attempt.get("steps_lost"), attempt.get("cause") or ""
        if lost is None:
            continue  # it ended before it trained a step
        redone += lost
        limit = allowed
        if "interruption notice" in cause or cause.startswith(("growing", "trying spot")):
            limit = 0
        elif "start" in outage and outage["start"] <= (attempt.get("last_step") or 0) <= outage.get(
            "end", STEPS
        ):
            # Killed while the store refused writes (or before the nodes' next pass after
            # it): what was trained since the outage began could not be stored. What was
            # stored before it must not be lost.
            limit += attempt["last_step"] - outage["start"]
            extra += attempt["last_step"] - outage["start"]
        if lost > limit:
            problems.append(f"attempt {attempt['number']} ({cause}) redid {lost} steps > {limit}")
    if redone > kills * allowed + extra:
        problems.append(
            f"{redone} steps redone in all, {kills} kill(s) allow {kills * allowed + extra}"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos")
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", action="append", default=[], help="a schedule's JSON")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "chaos-results.json")
    parser.add_argument(
        "--keep", action="store_true", help="keep the runs' stores and node logs (path logged)"
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    schedules = [Schedule.parse(t) for t in args.replay] or [
        draw(n, rng) for n in range(1, args.schedules + 1)
    ]
    procs = Procs()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as scope:
        if args.keep:
            tmp = tempfile.mkdtemp(prefix="trainctl-chaos-")
            log(f"keeping the runs in {tmp}")
        else:
            tmp = scope.enter_context(tempfile.TemporaryDirectory(prefix="trainctl-chaos-"))
        stage = Stage(Path(tmp))
        try:
            stage.home("reference")
            reference = estimator().fit(logs=False)
            assert reference.describe()["state"] == "Completed", reference.describe()
            expected = model(reference)
            for schedule in schedules:
                result = run(stage, schedule, procs)
                problems = check(result, schedule, expected)
                info = result["info"]
                row = {
                    "schedule": json.loads(schedule.text()),
                    "passed": not problems,
                    "problems": problems,
                    "seconds": round(result["seconds"], 1),
                    "attempts": [{k: a.get(k) for k in ATTEMPT_FIELDS} for a in info["attempts"]],
                    "job": result["job"].name,
                }
                if problems:  # what a failing run's record says, to read before a replay
                    job = result["job"]
                    row["events"] = [
                        {k: v for k, v in e.items() if k != "reason" or len(str(v)) < 300}
                        for e in job.events()
                    ]
                rows.append(row)
                if args.keep:
                    log(f"  its store: {stage.save(f'run-{schedule.number}')}")
                verdict = "pass" if not problems else "FAIL " + "; ".join(problems)
                log(f"schedule {schedule.number} {[e.kind for e in schedule.events]}: {verdict}")
                if problems:
                    log(f"  replay: python -m bench.chaos --replay '{schedule.text()}'")
                left = procs.cleanup()
                if left:
                    log(f"  ended {len(left)} process(es) the run left")
        finally:
            stage.close()
            procs.cleanup()
    passed = sum(r["passed"] for r in rows)
    log(f"{passed} of {len(rows)} schedules passed")
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
