"""Fault tolerance end to end: kills, notices, relaunch, and bit-exact resume.

Real 2-node jobs of examples/digits on the local provider; faults are injected for real
(SIGKILL of every process of a node; an interruption notice relayed to a node's agent). One
process per node under the plain launcher (tests/helpers.py's `digits_estimator` says why);
one bit-exact trial and the SIGTERM grace run under torchrun, whose agent stands between the
node and the script.
"""

from __future__ import annotations

import io
import random
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, TORCHRUN, digits_estimator
from trainctl import Estimator
from trainctl.estimator import JobFailedError
from trainctl.spec.parts import Fault

pytestmark = pytest.mark.e2e

CHECKPOINT_EVERY = 10
WRITE_WINDOW_STEPS = 2
# 8 epochs of ~23 steps. The step delay only stretches time (the model does not depend on
# it): faults fire 5-6.5 s after an attempt's launch, start-up takes 2-6 s, so an attempt
# trains at most ~4.5 s before its fault; 184 steps x 80 ms outlast three such attempts.
# 4 epochs of digits: about 90 optimizer steps on 2 nodes, room for a fault per attempt.
HYPERPARAMETERS = {"epochs": 4, "lr": 0.1, "seed": 0, "checkpoint-every": CHECKPOINT_EVERY}
SLOW_STEP = 0.08  # seconds slept per step in the bit-exact trials


def digits(*, step_delay: float = 0.0, epochs: int | None = None, **kwargs) -> Estimator:
    hyperparameters = {**HYPERPARAMETERS, "step-delay": step_delay}
    if epochs is not None:
        hyperparameters["epochs"] = epochs
    return digits_estimator(hyperparameters, **kwargs)


def model_tensors(job) -> dict:
    import torch

    data = job.store.get_bytes(f"jobs/{job.name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        raw = tar.extractfile("model.pt").read()
    return torch.load(io.BytesIO(raw), weights_only=True)


def assert_bit_identical(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The uninterrupted run's model (one per test module: it is the reference)."""
    home = tmp_path_factory.mktemp("baseline-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINCTL_HOME", str(home))
    mp.delenv("TRAINCTL_STORE", raising=False)
    try:
        job = digits().fit(logs=False)
        info = job.describe()
        assert info["state"] == "Completed"
        assert len(info["attempts"]) == 1
        return model_tensors(job)
    finally:
        mp.undo()


@pytest.mark.parametrize(
    ("kinds", "distribution"),
    # The notice first (to the master) and between the kills (to the other node); the master
    # killed last and first. (Three seeded shuffles ran here before: two gave one order.)
    # One order under torchrun (the notice reaches the script through torchrun's agent).
    # The last of the second: a node reclaimed with no capacity for its replacement for 3 s
    # (a kill, then a wait for capacity), whose goodput is checked too.
    [(["notice:0", "kill:1", "kill:0"], TORCHRUN), (["kill:0", "notice:1", "nocapacity:1"], None)],
    ids=["notice-first-torchrun", "notice-between"],
)
def test_two_kills_and_a_notice_resume_bit_exact(home, baseline, kinds, distribution):
    """The bar: the model after two kills and one notice is bit-identical to the baseline;
    and where its node-time went adds up (goodput)."""
    rng = random.Random(",".join(kinds))  # the steps: fixed per order
    # At random steps, one fault per attempt: each fires once the script reports its step (a
    # condition, so the faults hit the same points of training on a fast machine and on a
    # loaded one); each next step is past the checkpoint the attempt before it resumes from.
    step = 0
    faults = []
    for kind in kinds:
        step += rng.randint(12, 25)
        wait = "+3" if kind.startswith("nocapacity") else ""
        faults.append(str(Fault.parse(f"{kind}@step{step}{wait}")))  # the form the job records
    job = digits(step_delay=SLOW_STEP, faults=faults, distribution=distribution).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed", info
    attempts = info["attempts"]
    assert attempts[-1]["outcome"] == "completed"
    assert all(a["outcome"] == "interrupted" for a in attempts[:-1]), attempts
    assert sorted(f for a in attempts for f in a["faults"]) == sorted(faults)
    for attempt in attempts[:-1]:
        assert attempt["steps_lost"] is not None, attempt
        if attempt["faults"] == [f for f in faults if f.startswith("notice")]:
            assert "interruption notice" in attempt["cause"]
            assert attempt["steps_lost"] == 0, attempt  # the emergency checkpoint saved all
        else:
            assert "lost" in attempt["cause"]
            # At most one interval, plus the steps trained while the newest checkpoint was
            # still being written (asynchronously) and uploaded when the kill came.
            assert attempt["steps_lost"] <= CHECKPOINT_EVERY + WRITE_WINDOW_STEPS, attempt
    assert_bit_identical(model_tensors(job), baseline)
    # The notice reached its node over the pipe of the controller that started it, at once
    # (told before the lease, which the node reads every control_poll_seconds, relays it)
    noticed = next(a for a in attempts if any(f.startswith("notice") for f in a["faults"]))
    rank = int(next(f for f in noticed["faults"] if f.startswith("notice")).split(":")[1][0])
    log = job.store.get_text(f"jobs/{job.name}/logs/attempt-{noticed['number']}/node-{rank}.log")
    assert "the controller's notice, over its pipe: injected fault notice:" in log
    # each relaunch's stages since what interrupted the attempt before it, in order
    from trainctl.controller.telemetry import RECOVERY_STAGES

    for attempt in attempts[1:]:
        stages = attempt["recovery"]
        assert list(stages) == list(RECOVERY_STAGES), stages  # (the script resumes: all five)
        ended, capacity, launched = (stages[k] for k in RECOVERY_STAGES[:3])
        assert ended <= capacity <= launched <= stages["first_step"], stages
        assert 0 < stages["state_restored"] <= stages["first_step"], stages
    recovered = [e for e in job.events() if e["type"] == "recovered"]
    assert [e["attempt"] for e in recovered] == [a["number"] for a in attempts[1:]]
    if distribution is None:
        assert_goodput_adds_up(info)


def assert_goodput_adds_up(info: dict) -> None:
    """Each cause measured from its own report, against what the job went through: a wait for
    capacity after the reclaim, steps redone after each kill that lost any, a save's stall,
    the loop's wait for batches, the checkpoint restored; the paid causes add up to the
    nodes' time from the ask that got them to their attempt's end, within 1 %."""
    from trainctl.record.goodput import PAID
    from trainctl.record.keys import parse_iso

    goodput, attempts = info["goodput"], info["attempts"]
    assert [a["attempt"] for a in goodput["attempts"]] == [a["number"] for a in attempts]
    paid_total = 0.0
    for attempt, measured in zip(attempts, goodput["attempts"], strict=True):
        causes = {c: s["node_hours"] * 3600 for c, s in measured["causes"].items()}
        nodes = len(attempt["nodes"])
        asked = parse_iso(attempt["requested_at"])
        held = nodes * (parse_iso(attempt["ended_at"]) - asked - attempt["waited_seconds"])
        paid = sum(causes[c] for c in PAID)
        assert paid == pytest.approx(held, rel=0.01), (attempt["number"], causes, held)
        assert paid == pytest.approx(measured["paid_node_hours"] * 3600, rel=0.01)
        assert min(causes.values()) >= 0 and causes["training"] > 0, causes
        assert causes["startup"] > 0 and causes["setup"] > 0 and causes["after"] > 0, causes
        assert (causes["redone"] > 0) == bool(attempt["steps_lost"]), (attempt, causes)
        if attempt["number"] > 1:
            assert causes["restore"] > 0, causes  # its checkpoints, back on both nodes
        paid_total += paid
    waited = [a["causes"]["waiting"]["node_hours"] * 3600 for a in goodput["attempts"]]
    assert waited[-1] >= 2 * 2.5 and sum(waited[:-1]) < 1.0, waited  # 3 s, both nodes' wait
    total = goodput["causes"]
    assert total["checkpoint"]["node_hours"] > 0 and total["data"]["node_hours"] > 0, total
    assert goodput["paid_node_hours"] * 3600 == pytest.approx(paid_total, rel=0.01)
    assert goodput["goodput"] == pytest.approx(
        total["training"]["node_hours"] / goodput["paid_node_hours"], rel=0.01
    )
    assert goodput["text"].startswith(f"{100 * goodput['goodput']:.0f} % of ")
    for said in ("steps redone after a loss", "waiting for capacity"):
        assert said in goodput["text"], goodput["text"]


def test_kill_during_relaunch_and_quick_succession(home, baseline):
    """A second kill as the next attempt starts, before it trained a step."""
    job = digits(step_delay=0.05, faults=["kill:1@step20", "kill:0@0"]).fit(logs=False)
    info = job.describe()
    assert info["state"] == "Completed"
    outcomes = [a["outcome"] for a in info["attempts"]]
    causes = [(a["outcome"], a["cause"], a.get("faults")) for a in info["attempts"]]
    assert outcomes == ["interrupted", "interrupted", "completed"], causes
    assert_bit_identical(model_tensors(job), baseline)


def test_script_ignoring_sigterm_is_killed_after_grace(home, monkeypatch, tmp_path):
    """A notice to a script that ignores SIGTERM: ended after the grace period, and the job
    still resumes from the last complete checkpoint."""
    monkeypatch.setenv("TRAINCTL_NOTICE_GRACE_SECONDS", "2")
    src = tmp_path / "digits"
    shutil.copytree(EXAMPLES / "digits", src)
    original = (src / "train.py").read_text()
    (src / "train.py").write_text(
        "import signal\n"
        "_install = signal.signal\n"
        "def _ignore_sigterm(sig, handler):\n"
        "    return _install(sig, signal.SIG_IGN if sig == signal.SIGTERM else handler)\n"
        "signal.signal = _ignore_sigterm\n" + original
    )
    # 4 epochs: enough to train before the notice and to resume after it
    hps = {**HYPERPARAMETERS, "epochs": 4, "step-delay": 0.05}
    # Under torchrun: its agent forwards the SIGTERM and the grace ends the worker it started.
    # The notice goes out once the script trains (step 25: into epoch 2; a clock could beat a
    # slow start-up and hit torchrun before the script exists), relayed by the controller.
    est = digits(
        source_dir=str(src), hyperparameters=hps, distribution=TORCHRUN, faults=["notice:1@step25"]
    )
    job = est.fit(wait=False, logs=False)
    info = job.wait(timeout=180)
    assert info["state"] == "Completed"
    first, second = info["attempts"]
    assert "interruption notice" in first["cause"]
    assert second["resumed_from_step"] >= 10  # the checkpoints before the notice survived
    assert second["resumed_from_step"] <= first["last_step"]
    node_log = job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-1.log")
    assert "did not stop within 2 s" in node_log


def test_corrupt_newest_checkpoint_falls_back(home, baseline, tmp_path):
    """A checkpoint left corrupt (by a kill mid-write) is skipped for the previous one."""
    ckpt = tmp_path / "ckpt"
    first = digits(checkpoint_s3_uri=ckpt.as_uri()).fit(logs=False)
    assert first.describe()["state"] == "Completed"
    steps = sorted(p for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert len(steps) >= 2
    newest, previous = steps[-1], steps[-2]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # truncated mid-write
    second = digits(checkpoint_s3_uri=ckpt.as_uri()).fit(logs=False)
    info = second.describe()
    assert info["state"] == "Completed"
    assert info["attempts"][0]["resumed_from_step"] == int(previous.name.split("-")[1])
    assert_bit_identical(model_tensors(second), baseline)


def test_unwritable_checkpoint_uri_is_refused_up_front(home):
    with pytest.raises(Exception) as raised:
        digits(checkpoint_s3_uri="file:///etc/hostname/ckpt").fit(logs=False)
    assert "checkpoint_s3_uri" in str(raised.value) and "not writable" in str(raised.value)
    assert not (Path(home) / "store" / "jobs").exists()


def test_user_failure_counts_against_max_restarts_but_kills_do_not(home, source):
    """Infrastructure interruptions never use the user's restart budget."""
    est = Estimator(
        entry_point="train.py",
        source_dir=str(source("fail")),
        instance_count=2,
        max_restarts=1,
        faults=["kill:0@0.3"],
    )
    with pytest.raises(JobFailedError):
        est.fit(logs=False)
    outcomes = [a["outcome"] for a in est.latest_training_job.describe()["attempts"]]
    # the kill (infrastructure) + two user failures (the first one retried once)
    assert outcomes == ["interrupted", "failed", "failed"]


def _controller_in_attempt_2(probe, reached: int):
    """A controller of a new job whose attempt 1 reached step `reached` and whose attempt 2
    has just begun, that attempt's watch and its two nodes (no process is read here)."""
    from trainctl.controller.attempts import LiveNode
    from trainctl.controller.controller import Controller
    from trainctl.controller.submit import create_job
    from trainctl.controller.watch import AttemptWatch
    from trainctl.record.keys import now_iso
    from trainctl.record.models import Attempt
    from trainctl.spec.build import build_spec
    from trainctl.store import default_store

    store = default_store()
    record = create_job(build_spec(entry_point="probe.py", source_dir=str(probe)), store)
    ctl = Controller(store, record.name)
    first = Attempt(number=1, started_at=now_iso(), last_step=reached)
    second = Attempt(number=2, started_at=now_iso())
    ctl.record.attempts = [first, second]
    nodes = {r: LiveNode(r, proc=None) for r in (0, 1)}  # type: ignore[arg-type]
    ctl._attempt = watch = AttemptWatch(ctl, nodes)  # (no thread: nothing is followed)
    ctl._nodes = nodes
    return watch, first, second, nodes


@pytest.mark.timeout(30)
def test_a_resume_is_what_rank_0_says_even_when_another_node_overtakes_it(home, source):
    """Node 1's `checkpoint` of attempt 2 can reach the controller before rank 0's `resumed`
    (two streams; CI saw it over SSH under load): that is not a run from scratch, which made
    attempt 1 lose all its 48 steps. A resume guessed from rank 0 stepping first gives way
    to the `resumed` the script sends after."""
    probe = source("probe")
    watch, first, second, nodes = _controller_in_attempt_2(probe, reached=48)
    watch._on_control(nodes[1], {"event": "checkpoint", "step": 58}, nodes)
    assert (second.resumed_from_step, first.steps_lost, second.last_step) == (None, None, 58)
    watch._on_control(nodes[0], {"event": "resumed", "step": 48}, nodes)
    assert (second.resumed_from_step, first.steps_lost) == (48, 0)

    watch, first, second, nodes = _controller_in_attempt_2(probe, reached=48)
    watch._on_control(nodes[0], {"event": "step", "step": 49}, nodes)  # before its `resumed`
    assert (second.resumed_from_step, first.steps_lost) == (0, 48)
    watch._on_control(nodes[0], {"event": "resumed", "step": 48}, nodes)
    assert (second.resumed_from_step, first.steps_lost) == (48, 0)
    watch._on_control(nodes[0], {"event": "resumed", "step": 40}, nodes)  # said once: kept
    assert (second.resumed_from_step, first.steps_lost) == (48, 0)


@pytest.mark.timeout(30)
def test_late_lines_of_an_earlier_attempt_count_for_that_attempt(home, source):
    """A node of attempt 1 whose stream still drains after attempt 2 began (its emergency
    checkpoint's step, say) must not be taken for attempt 2's node of the same rank: that
    made attempt 2 look as if it trained from scratch, and attempt 1 lose every step."""
    from trainctl.protocol import CONTROL_PREFIX

    watch, first, second, nodes = _controller_in_attempt_2(source("probe"), reached=40)
    watch.ctl._lines.put((1, 0, CONTROL_PREFIX + '{"event": "preempted", "step": 59}'))
    watch.ctl._lines.put((1, 0, None))  # attempt 1's stream ends: not attempt 2's node
    watch._drain_lines(nodes)
    assert (first.last_step, second.last_step, second.resumed_from_step) == (59, None, None)
    assert nodes[0].exit_code is None

    watch._on_control(nodes[0], {"event": "resumed", "step": 59}, nodes)
    assert (second.resumed_from_step, first.steps_lost) == (59, 0)

    # a later straggler of attempt 1 still counts for attempt 1, and its loss is redone
    watch.ctl._lines.put((1, 0, CONTROL_PREFIX + '{"event": "step", "step": 62}'))
    watch._drain_lines(nodes)
    assert (first.last_step, first.steps_lost, second.last_step) == (62, 3, None)


@pytest.mark.timeout(30)
def test_each_attempt_says_where_it_started_and_a_relaunch_from_scratch_warns(home, source):
    """The nodes' `restored` reports make the attempt's start: the files (per node: each
    restores every node's), the checkpoint files (the most any node got: each restores all
    of them), or nothing - and a relaunch with nothing after attempt 1 reached steps warns."""
    from trainctl.controller.logs import LogPrinter

    probe = source("probe")
    watch, first, second, nodes = _controller_in_attempt_2(probe, reached=40)
    copy = {"node": 0, "attempt": 1, "written_ms": 1_700_000_000_000, "size": 2_100_000}
    report = {"event": "restored", "files": 1, "bytes": 2_100_000, "from_attempt": 1}
    report |= {"largest": ["snapshot.pt"], "state": {"snapshot.pt": copy}}
    for node in nodes.values():
        watch._on_control(node, report, nodes)
        watch._on_control(node, {"event": "launched"}, nodes)
    assert second.started_from() == "restored snapshot.pt, 2.1 MB on every node, from attempt 1"
    assert second.started_from(short=True) == "snapshot.pt"
    assert [n.rank for n in second.restored.by_node] == [0, 1]
    assert second.restored.split is None
    second.resumed_from_step = 120
    assert second.started_from().startswith("step 120 (restored snapshot.pt")
    assert second.started_from(short=True) == "step 120"
    assert first.started_from() == "from scratch"

    out = io.StringIO()
    watch, first, second, nodes = _controller_in_attempt_2(probe, reached=40)
    watch.ctl.printer = LogPrinter(out)
    for node in nodes.values():
        watch._on_control(node, {"event": "restored", "checkpoint_files": 0, "files": 0}, nodes)
        watch._on_control(node, {"event": "launched"}, nodes)
    assert second.started_from() == "from scratch: nothing to restore"
    assert "warning: attempt 2 starts from scratch" in out.getvalue()
    assert "attempt 1 reached step 40" in out.getvalue()
    assert any(e["type"] == "from_scratch" for e in watch.ctl.jobs.events()), (
        watch.ctl.jobs.events()
    )
    described = watch.ctl.record.describe()["attempts"]
    assert [a["started_from"] for a in described] == [
        "from scratch",
        "from scratch: nothing to restore",
    ]


@pytest.mark.timeout(30)
def test_nodes_that_restored_different_state_are_a_split_resume_warning(home, source):
    """Node 1 put back no snapshot.pt (a copy pruned while it fetched it, a store read that
    failed) while node 0 did: before the ranks resume at different points and hang, one
    warning names the nodes and what each had; the record says so per node, and the attempt
    never reads as 'restored' on a node that restored nothing."""
    from trainctl.controller.logs import LogPrinter

    out = io.StringIO()
    watch, _, second, nodes = _controller_in_attempt_2(source("probe"), reached=40)
    watch.ctl.printer = LogPrinter(out)
    copy = {"node": 0, "attempt": 1, "written_ms": 1_700_000_000_000, "size": 2_100_000}
    restored = {"event": "restored", "files": 1, "bytes": 2_100_000, "from_attempt": 1}
    restored |= {"largest": ["snapshot.pt"], "state": {"snapshot.pt": copy}}
    watch._on_control(nodes[0], restored, nodes)
    watch._on_control(nodes[1], {"event": "restored", "files": 0, "checkpoint_files": 0}, nodes)
    for node in nodes.values():
        watch._on_control(node, {"event": "launched"}, nodes)
    said = out.getvalue()
    assert "warning: attempt 2's nodes start from different state" in said, said
    assert "snapshot.pt: algo-1 restored attempt 1, algo-1's copy of" in said, said
    assert "2.1 MB; algo-2 restored nothing" in said, said
    events = [e for e in watch.ctl.jobs.events() if e["type"] == "split_resume"]
    assert len(events) == 1 and "algo-2 restored nothing" in events[0]["differences"]
    assert second.started_from() == (
        "restored snapshot.pt, 2.1 MB on algo-1 only (nothing on algo-2), from attempt 1; "
        "not the same state on every node (split resume)"
    )
    assert second.started_from(short=True) == "split"
    by_node = watch.ctl.record.describe()["attempts"][1]["restored"]["by_node"]
    assert [n["files"] for n in by_node] == [1, 0]
