"""The dashboard's file route, fuzzed: every spelling of a path that must not be served
(the raw record, a node's remote-start endpoint and token, the lease, the stop marker) is
sent to a real `trainctl ui` as raw bytes on the wire (no client normalises it first):
percent-encodings in either case, `.` segments and `%2e` ones, doubled and trailing
slashes, `/.` and `%2f.` tails, case changes, `..` climbs back into the job. None returns a
secret; the record, however spelled, comes back redacted or not at all. `trainctl
artifacts get` takes the same spellings through the same rule."""

from __future__ import annotations

import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import TRAINCTL, free_port
from tests.security.battery import run_battery
from tests.security.test_trust_boundaries import _get, finished_job, store_root

pytestmark = pytest.mark.e2e

PASSWORD = "fuzz-password-0123456789"
TOKEN = "e" * 64
JOB = "fuzzed"
# What may never come back raw, by its key in the job's directory.
FORBIDDEN = {
    "job.json": PASSWORD,
    "attempts/attempt-1/node-1.remote-start.json": TOKEN,
    "lease.json": "lease-marker-7f3a",
    "control/stop": "stop-marker-91c2",
}


def _encode(ch: str, rng: random.Random) -> str:
    """`ch` as is or percent-encoded, in upper or lower case hex."""
    if ch == "/" or rng.random() < 0.5:
        return ch
    code = f"%{ord(ch):02x}"
    return code.upper() if rng.random() < 0.5 else code


def spellings(key: str, rng: random.Random) -> list[str]:
    """Ways a URL path may name `key` (or a case variant of it) that a naive route would
    compare as different text."""
    parts = key.split("/")
    fixed = [
        key,
        "./" + key,
        "%2e/" + key,
        "%2E/" + key,
        "//" + key,
        key + "/",
        key + "/.",
        key + "%2f.",
        key + "%2F.",
        key + "%2f%2e",
        "/".join(p + "/." for p in parts),
        "/".join([*parts[:-1], "./" + parts[-1]]),
        "/./".join(parts),
        "//".join(parts),
        "%2f".join(parts),
        key.upper(),
        key.swapcase(),
        key[0].upper() + key[1:],
        f"%2e%2e/{JOB}/{key}",  # climbs: refused before anything is looked up
        f"../{JOB}/{key}",
        f"logs/../{key}",
        f"logs/%2e%2e/{key}",
        f"output/..%2f{key}",
        key.replace("/", "\\"),
        key + "%00",
        key + "%00.log",
    ]
    encoded = ["".join(_encode(c, rng) for c in key) for _ in range(16)]
    mixed = [
        "/".join(rng.choice([".", "%2e", "%2E", ""]) + "/" + _enc(p, rng) for p in parts)
        for _ in range(16)
    ]
    return fixed + encoded + mixed


def _enc(part: str, rng: random.Random) -> str:
    return "".join(_encode(c, rng) for c in part)


def _finished_job(home: Path, tmp_path: Path) -> None:
    """JOB, ended, with a secret hyperparameter its script prints."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import sys; print('args', sys.argv[1:])\n")
    finished_job(home, src, JOB, "-p", f"password={PASSWORD}")


@pytest.mark.timeout(180)
def test_no_spelling_of_a_path_serves_a_secret(home, tmp_path):
    _finished_job(home, tmp_path)
    job_dir = store_root(home) / "jobs" / JOB
    for key, marker in FORBIDDEN.items():
        path = job_dir / key
        if key != "job.json":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"marker": marker, "token": marker}))
    assert PASSWORD in (job_dir / "job.json").read_text()
    rng = random.Random(46)
    requests = sorted({s for key in FORBIDDEN for s in spellings(key, rng)})
    assert len(requests) > 200, len(requests)
    port = free_port()
    ui = subprocess.Popen([TRAINCTL, "ui", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stderr is not None and ui.stderr.readline().startswith("trainctl ui:")

        def fetch(spelling: str) -> tuple[str, int, bytes]:
            return spelling, *_get(port, f"/api/jobs/{JOB}/files/{spelling}")

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(fetch, requests))
    finally:
        ui.terminate()
        ui.wait(timeout=10)
    served_record = 0
    for spelling, status, body in answers:
        for marker in FORBIDDEN.values():
            assert marker.encode() not in body, (spelling, status, body[:200])
        assert status in (200, 400, 404), (spelling, status, body[:200])
        if status == 200:  # only ever the record, redacted
            record = json.loads(body)
            assert record["name"] == JOB and record["spec"]["hyperparameters"]["password"] == (
                "<redacted>"
            ), spelling
            served_record += 1
    assert served_record >= 10, "the record's ordinary spellings are served (redacted)"


@pytest.mark.timeout(120)
def test_artifacts_get_takes_the_same_spellings_through_the_same_rule(home, tmp_path):
    _finished_job(home, tmp_path)
    attempt = store_root(home) / "jobs" / JOB / "attempts" / "attempt-1"
    endpoint = attempt / "node-1.remote-start.json"
    endpoint.write_text(json.dumps({"token": TOKEN}))
    got = tmp_path / "got"
    served = ["./job.json", "job.json/.", "//job.json"]
    hidden = [
        "attempts/attempt-1/node-1.REMOTE-START.json",
        "attempts/./attempt-1//node-1.remote-start.json/.",
        "lease.json",
        "control/stop",
        "JOB.JSON",
    ]
    bad = ["../x/job.json", "logs/../../x", "a\x01b"]
    runs = [
        {"argv": ["artifacts", JOB, "get", path, str(got / (dest or path.replace("/", "_")))]}
        for paths, dest in ((served, None), (hidden, "x"), (bad, "y"))
        for path in paths
    ]
    results = run_battery(runs, home)
    for run, result in zip(runs, results, strict=True):
        path = run["argv"][3]
        assert result["traceback"] is None, (path, result["traceback"])
        if path in served:
            assert result["code"] == 0, (path, result["stderr"])
        elif path in hidden:
            assert result["code"] == 1 and "not found" in result["stderr"], (path, result)
        else:
            assert result["code"] == 2 and result["stderr"].startswith("error: PATH: "), result
    files = [p for p in got.rglob("*") if p.is_file()]
    assert len(files) == 3, files
    for path in files:
        text = path.read_text()
        assert PASSWORD not in text and TOKEN not in text, path
        assert json.loads(text)["spec"]["hyperparameters"]["password"] == "<redacted>"
    assert not Path(got / "x").exists() and not Path(got / "y").exists()
