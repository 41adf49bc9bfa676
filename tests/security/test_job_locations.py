"""Jobs cannot reach each other's data through the locations they write to (issue 46):

- a job's checkpoint URI, output location or input may not be another job's output or
  checkpoint location (the same, above or below), in either order of submission; an
  ended job's output may be read as an input channel, and an ended job's checkpoint URI
  continued as is, nothing else;
- the locations a job writes to are claimed create-if-absent in the store, so two
  submits at the same moment cannot share one; the claim goes when the job ends, and one
  a killed submitter left behind is taken over.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.security.test_trust_boundaries import cli, finished_job, one_line_error, store_root

pytestmark = pytest.mark.e2e


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "train.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['SM_MODEL_DIR'], 'model.txt').write_text('weights')\n"
        "ck = pathlib.Path('/opt/ml/checkpoints')\n"
    )
    return d


def _store(home: Path):
    from trainctl.store import open_store

    return open_store(store_root(home).as_uri())


def _create(home: Path, src: Path, name: str, **fields):
    """A recorded (Pending) job, as submit leaves it before its controller starts."""
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec

    spec = build_spec(entry_point="train.py", source_dir=str(src), job_name=name, **fields)
    return create_job(spec, _store(home))


def _end(home: Path, name: str) -> None:
    from trainctl.record.jobstore import JobStore
    from trainctl.state import JobState

    jobs = JobStore(_store(home), name)
    jobs.transition(jobs.load(), JobState.STOPPED)


def _claims(home: Path) -> list[dict]:
    found = (store_root(home) / ".trainctl" / "claims").glob("*.json")
    return sorted((json.loads(p.read_text()) for p in found), key=lambda c: c["uri"])


@pytest.mark.timeout(120)
def test_a_job_cannot_write_into_an_ended_jobs_output(home, src, tmp_path):
    """The reported case: `outy` with its checkpoint URI on `outx`'s output location was
    accepted, restored outx's model as a checkpoint and its sync deleted it."""
    outputs = tmp_path / "outputs"
    finished_job(home, src, "outx", "--output-path", outputs.as_uri())
    model = outputs / "outx" / "output" / "model.tar.gz"
    assert model.is_file()
    theirs = (outputs / "outx" / "output").as_uri()
    attacks = [
        ("--checkpoint-s3-uri", theirs, "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", theirs + "/", "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", str(outputs / "outx" / "output"), "checkpoint_s3_uri"),
        ("--checkpoint-s3-uri", outputs.as_uri(), "checkpoint_s3_uri"),  # above it
        ("--checkpoint-s3-uri", theirs + "/sub", "checkpoint_s3_uri"),  # below it
        ("--output-path", theirs, "output_path"),  # <theirs>/<job>/output: below it
    ]
    link = tmp_path / "link-to-outputs"
    link.symlink_to(outputs)
    linked = (link / "outx" / "output").as_uri()
    attacks.append(("--checkpoint-s3-uri", linked, "checkpoint_s3_uri"))

    def attempt(attack):
        flag, value, field = attack
        args = ("--source-dir", str(src), "--job-name", "outy", flag, value)
        return field, cli("submit", "train.py", *args)

    with ThreadPoolExecutor(4) as pool:
        for field, proc in pool.map(attempt, attacks):
            line = one_line_error(proc)
            assert line.startswith(f"error: {field}: "), line
            assert "the output of job 'outx' (Completed)" in line, line
    assert model.is_file() and sorted(p.name for p in (store_root(home) / "jobs").iterdir()) == [
        "outx"
    ]
    assert _claims(home) == [], "a refused submit left a claim"
    # Read as an input channel: allowed, once it has ended (and it is read-only there).
    proc = cli(
        "submit", "train.py", "--source-dir", str(src), "--job-name", "reader",
        "--inputs", f"model={theirs}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = cli("artifacts", "outx", "get", "output/model.tar.gz", str(tmp_path / "m.tgz"))
    assert got.returncode == 0 and (tmp_path / "m.tgz").stat().st_size == model.stat().st_size


@pytest.mark.timeout(120)
def test_either_order_running_jobs_locations_are_apart(home, src, tmp_path):
    ckpt = (tmp_path / "ckpt" / "a").as_uri()
    outputs = (tmp_path / "outputs").as_uri()
    _create(home, src, "a", checkpoint_s3_uri=ckpt, output_path=outputs)
    assert [c["job"] for c in _claims(home)] == ["a", "a"]
    for made in ("ckpt/a", "outputs/a/output"):  # what a's nodes make as they write
        (tmp_path / made).mkdir(parents=True)
    cases = [
        # b's output location (<path>/b/output) lies under a's checkpoints
        (["--output-path", ckpt], "output_path", "the checkpoints of job 'a' (Pending)"),
        # b's checkpoints hold a's checkpoints
        (["--checkpoint-s3-uri", (tmp_path / "ckpt").as_uri()], "checkpoint_s3_uri", "job 'a'"),
        # b's checkpoints on a's output location
        (["--checkpoint-s3-uri", outputs + "/a/output"], "checkpoint_s3_uri", "output of job 'a'"),
        # reading where a running job writes
        (["--inputs", f"data={ckpt}"], "inputs.data", "read it once that job has ended"),
        (["--inputs", f"data={outputs}/a"], "inputs.data", "read it once that job has ended"),
    ]
    for args, field, words in cases:
        proc = cli("submit", "train.py", "--source-dir", str(src), "--job-name", "b", *args)
        line = one_line_error(proc)
        assert line.startswith(f"error: {field}: ") and words in line, line
    # the same output_path is fine: each job's output location is its own
    _create(home, src, "c", output_path=outputs)
    assert sorted(c["job"] for c in _claims(home)) == ["a", "a", "c"]
    # Ended: its claims are gone; its checkpoints may be continued at exactly their URI,
    # not above or below it; its output stays another job's.
    _end(home, "a")
    assert [c["job"] for c in _claims(home)] == ["c"]
    line = one_line_error(
        cli("submit", "train.py", "--source-dir", str(src), "--checkpoint-s3-uri", ckpt + "/x")
    )
    assert "continued at exactly their URI" in line, line
    _create(home, src, "d", checkpoint_s3_uri=ckpt)
    assert sorted(c["job"] for c in _claims(home)) == ["c", "d"]


@pytest.mark.timeout(120)
def test_tensorboard_locations_are_apart_and_continued_once_ended(home, src, tmp_path):
    tb = (tmp_path / "tb" / "a").as_uri()
    _create(home, src, "a", tensorboard_s3_uri=tb)
    assert [c["field"] for c in _claims(home)] == ["tensorboard_s3_uri"]
    for flag, field in (
        ("--tensorboard-s3-uri", "tensorboard_s3_uri"),
        ("--checkpoint-s3-uri", "checkpoint_s3_uri"),
    ):
        proc = cli("submit", "train.py", "--source-dir", str(src), "--job-name", "b", flag, tb)
        line = one_line_error(proc)
        assert line.startswith(f"error: {field}: "), line
        assert "overlaps the TensorBoard logs of job 'a' (Pending)" in line, line
    _end(home, "a")  # ended: its TensorBoard logs may be continued where they are
    _create(home, src, "b", tensorboard_s3_uri=tb)
    assert [c["job"] for c in _claims(home)] == ["b"]


def _race(home: Path, src: Path, uris: list[str], monkeypatch) -> list[object]:
    """Two submits that both passed every check before either recorded its job (the window
    an upload opens): what each got, a record or the error."""
    from trainctl.controller import submit
    from trainctl.errors import SpecError

    barrier = threading.Barrier(len(uris), timeout=30)
    upload = submit.upload_source

    def upload_then_wait(spec, store, **kwargs):
        uploaded = upload(spec, store, **kwargs)
        barrier.wait()
        return uploaded

    monkeypatch.setattr(submit, "upload_source", upload_then_wait)

    def one(i_uri: tuple[int, str]) -> object:
        i, uri = i_uri
        try:
            return _create(home, src, f"racer-{i}", checkpoint_s3_uri=uri)
        except SpecError as exc:
            return exc

    with ThreadPoolExecutor(len(uris)) as pool:
        results = list(pool.map(one, enumerate(uris)))
    monkeypatch.setattr(submit, "upload_source", upload)
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["same", "nested"])
def test_two_submits_at_once_never_share_a_checkpoint_uri(home, src, tmp_path, monkeypatch, shape):
    from trainctl.controller.remove import remove_jobs
    from trainctl.errors import SpecError

    for round_ in range(4):
        base = (tmp_path / f"shared-{round_}").as_uri()
        uris = [base, base] if shape == "same" else [base, base + "/inner"]
        results = _race(home, src, uris, monkeypatch)
        winners = [r for r in results if not isinstance(r, SpecError)]
        losers = [r for r in results if isinstance(r, SpecError)]
        # the same URI: exactly one wins; nested ones: never both (both may lose, and retry)
        assert len(winners) == 1 if shape == "same" else len(winners) <= 1, results
        for exc in losers:
            assert exc.field == "checkpoint_s3_uri" and "racer-" in str(exc), exc
        jobs_dir = store_root(home) / "jobs"
        recorded = sorted(p.name for p in jobs_dir.iterdir()) if jobs_dir.exists() else []
        assert recorded == sorted(r.name for r in winners), (recorded, results)
        assert sorted(c["job"] for c in _claims(home)) == sorted(r.name for r in winners)
        if not winners:  # both refused (each saw the other's claim): a retry wins
            winners = [_create(home, src, "racer-again", checkpoint_s3_uri=uris[1])]
        for record in winners:  # ended: the next round starts clean
            _end(home, record.name)
        assert _claims(home) == []
        for record in winners:
            remove_jobs(_store(home), [record.name])


@pytest.mark.timeout(60)
def test_a_claim_left_behind_is_taken_over(home, src, tmp_path, monkeypatch):
    """A submitter killed between its claim and its record leaves a claim no job holds:
    stale once it is older than the grace (the record follows a claim within seconds), and
    replaced; a corrupt claim holds nothing. A claim whose job is recorded holds."""
    from trainctl import claims

    uri = (tmp_path / "ck").as_uri()
    key = store_root(home) / claims.claim_key(uri)
    key.parent.mkdir(parents=True)
    key.write_text(json.dumps({"job": "ghost", "token": "t", "uri": uri, "time": 0}))
    _create(home, src, "heir", checkpoint_s3_uri=uri)
    assert [c["job"] for c in _claims(home)] == ["heir"]
    other = (tmp_path / "ck2").as_uri()
    key2 = store_root(home) / claims.claim_key(other)
    key2.write_bytes(b"\xff\xfe not json")
    _create(home, src, "heir2", checkpoint_s3_uri=other)
    young = (tmp_path / "ck3").as_uri()
    key3 = store_root(home) / claims.claim_key(young)
    key3.write_text(json.dumps({"job": "arriving", "uri": young, "time": 4e9}))
    line = one_line_error(
        cli("submit", "train.py", "--source-dir", str(src), "--checkpoint-s3-uri", young)
    )
    assert "job 'arriving' (being submitted)" in line, line


@pytest.mark.timeout(60)
def test_a_job_ends_even_if_its_claims_cannot_be_given_back(home, src, tmp_path, monkeypatch):
    """The store failing at the release does not keep a job from ending: the claim it left
    is stale once the record is terminal, and the next job takes it over."""
    from trainctl import claims
    from trainctl.errors import StoreError
    from trainctl.record.jobstore import JobStore

    uri = (tmp_path / "ck").as_uri()
    _create(home, src, "first", checkpoint_s3_uri=uri)

    def unreachable(*args, **kwargs):
        raise StoreError("the store is unreachable")

    release = claims.release_claims
    monkeypatch.setattr(claims, "release_claims", unreachable)
    _end(home, "first")
    assert JobStore(_store(home), "first").load().state.value == "Stopped"
    assert [c["job"] for c in _claims(home)] == ["first"]
    monkeypatch.setattr(claims, "release_claims", release)
    _create(home, src, "second", checkpoint_s3_uri=uri)
    assert [c["job"] for c in _claims(home)] == ["second"]
