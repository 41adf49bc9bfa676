"""What a node says and how: lines of several ranks made whole and tagged, torchrun's own
noise dropped when a node is stopped on purpose, the terminal's `[algo-N:R]` labels, the
per-job environment's key and the warning before a pin replaces an installed package."""

from __future__ import annotations

import io
import os
import sys

import pytest

from trainctl.node.output import LauncherNoise, RankedLines
from trainctl.protocol import ranked_line, split_rank

pytestmark = pytest.mark.timeout(30)
TAG = "\x1f{}\x1f"  # what torchrun's tee puts before each piece (TORCHRUN_PREFIX_TEMPLATE)


def test_pieces_of_several_ranks_make_whole_lines():
    """torchrun's tee forwards what it read of each worker's file, tagged; a line still being
    written comes in pieces, and another rank's piece can follow on the same output line."""
    lines = RankedLines()
    assert lines.feed(TAG.format(0) + "epoch 1") == [(0, "epoch 1")]
    # rank 1 wrote "loss=" and not yet its end; rank 0's whole line came after it
    assert lines.feed(TAG.format(1) + "loss=" + TAG.format(0) + "epoch 2") == [(0, "epoch 2")]
    assert lines.feed(TAG.format(1) + "0.5") == [(1, "loss=0.5")]
    assert lines.feed("W1126 torchrun's own line") == [(None, "W1126 torchrun's own line")]
    assert lines.feed(TAG.format(3) + "never ended") == [(3, "never ended")]
    lines.feed(TAG.format(2) + "cut" + TAG.format(3) + "x")
    assert lines.flush() == [(2, "cut")]


def test_pieces_mpirun_tags_make_whole_lines():
    """mpirun --tag-output forwards each process's output in pieces as it read them, each
    tagged `[job,rank]<stdout>:` (after a time with --timestamp-output); a line cut between
    two reads is joined again, and text that only looks like a tag outside mpirun is text."""
    lines = RankedLines(mpirun=True)
    assert lines.feed("[1,0]<stdout>:SUM 0 3") == [(0, "SUM 0 3")]
    assert lines.feed("[1,0]<stdout>:LINE 0 80 xx[1,1]<stdout>:SUM 1 3") == [(1, "SUM 1 3")]
    assert lines.feed("[1,0]<stdout>:xx") == [(0, "LINE 0 80 xxxx")]
    assert lines.feed("Sun Nov 29 04:42:36 2026[1,12]<stderr>:ValueError: x") == [
        (12, "ValueError: x")
    ]
    assert lines.feed("mpirun noticed that process rank 1 exited") == [
        (None, "mpirun noticed that process rank 1 exited")
    ]
    assert RankedLines().feed("[1,0]<stdout>:x") == [(None, "[1,0]<stdout>:x")]


def test_a_ranked_line_is_stored_readable_and_printed_with_its_host():
    from trainctl.controller.logs import LogPrinter

    stored = ranked_line(3, "epoch 1")
    assert stored == "[rank 3]\tepoch 1" and split_rank(stored) == (3, "epoch 1")
    assert split_rank("[rank 3] not ours") == (None, "[rank 3] not ours")
    out = io.StringIO()
    printer = LogPrinter(out)
    printer.node_line(1, stored)
    printer.node_line(1, "plain")
    printer.node_line(0, stored, attempt=2)
    assert out.getvalue().splitlines() == [
        "[algo-2:3] epoch 1",
        "[algo-2] plain",
        "[algo-1:3#2] epoch 1",
    ]


SIGNAL_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '  File ".../torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate',
    '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7674 got signal: 15",
]


def test_torchruns_own_account_of_a_stop_is_dropped_and_the_workers_kept():
    noise = LauncherNoise()
    kept: list[str] = []
    before = "W1126 12:00:00.000 1 torch/distributed/elastic/agent/server/api.py:753] "
    for line in [
        "epoch 3",  # before the stop: everything stays
        before + "Received 15 death signal, shutting down workers",
    ]:
        kept += noise.feed(line, stopping=False)
    assert kept == ["epoch 3", before + "Received 15 death signal, shutting down workers"]
    kept = []
    for line in [
        before + "Received 15 death signal, shutting down workers",
        "W1126 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7682 "
        "closing signal SIGTERM",
        *SIGNAL_TRACEBACK,
        "saving an emergency checkpoint",  # the worker's own line
        "Traceback (most recent call last):",  # the worker's own error
        '  File "train.py", line 3, in <module>',
        "ValueError: bad",
    ]:
        kept += noise.feed(line, stopping=True)
    assert kept == [
        "saving an emergency checkpoint",
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "ValueError: bad",
    ]
    noise.feed("Traceback (most recent call last):", stopping=True)
    assert noise.flush() == ["Traceback (most recent call last):"]  # cut short: shown


def test_one_environment_per_interpreter_however_it_is_called(tmp_path, monkeypatch):
    """`python` and `python3` (links to one interpreter) share the requirements' venv."""
    from trainctl.node import pyenv

    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("tinydep\n")
    links = tmp_path / "bin"
    links.mkdir()
    for name in ("python", "python3"):
        (links / name).symlink_to(os.path.realpath(sys.executable))
    envs = tmp_path / "envs"
    built: list[str] = []
    monkeypatch.setattr(pyenv, "_create_overlay_venv", lambda d: d.mkdir(parents=True))
    monkeypatch.setattr(pyenv, "_run", lambda argv, cwd, log: built.append(argv[0]))
    chosen = []
    for name in ("python", "python3"):
        monkeypatch.setattr(sys, "executable", str(links / name))
        chosen.append(pyenv.prepare_python(code, envs, lambda line: None))
    assert chosen[0] == chosen[1]
    assert len(built) == 1, "the second name reused the first's environment"


def test_a_pin_of_an_installed_package_warns_before_it_downloads():
    from importlib.metadata import version

    from trainctl.node.pyenv import replaced_packages

    torch_version = version("torch")
    warnings = replaced_packages(
        "torch==1.13.1\n"
        f"torch>={torch_version.split('+')[0]}  # satisfied: quiet\n"
        "pydantic\n"
        "# torch==0.1 in a comment\n"
        "-r other.txt\n"
        "not-installed-anywhere==1.0\n"
        "rich<1 ; python_version > '3'\n"
    )
    assert len(warnings) == 2, warnings
    expected = f"requirements.txt asks for torch==1.13.1 and torch {torch_version}"
    assert warnings[0].startswith(expected)
    assert "CUDA" in warnings[0] and "write 'torch' without a version" in warnings[0]
    assert "rich<1" in warnings[1]


def test_stopped_nodes_say_why(tmp_path):
    """The controller's reason, written before it stops the nodes, is what a node says."""
    from trainctl.node.agent import Agent
    from trainctl.record.keys import JobKeys
    from trainctl.store import open_store

    store = open_store(f"file://{tmp_path}")
    agent = Agent.__new__(Agent)  # the parts stopped_why uses, without staging a node
    agent.store, agent.attempt = store, 1
    agent.jobs = type("Jobs", (), {"keys": JobKeys("j"), "stop_requested": lambda self: None})()
    assert agent.stopped_why() == "stopped: the controller stopped the job"
    store.put_text(JobKeys("j").stopping(1), '{"why": "algo-2 was lost"}')
    assert agent.stopped_why() == "stopped: algo-2 was lost"
    store.put_text(JobKeys("j").stopping(1), '{"why": "stopped by the user"}')
    assert agent.stopped_why() == "stopped by the user"


def test_nodes_wait_for_a_controller_that_handed_the_job_on() -> None:
    """A lease released by a hand-off (SIGHUP) counts from its release, so nodes are there
    when the next controller takes the job a moment later; no lease at all is long gone."""
    from trainctl.node.stopping import controller_silence

    now = 1_000_000.0
    assert controller_silence({"renewed_at": now - 3}, now) == 3
    assert controller_silence({"pid": 1, "released_at": now - 1}, now) == 1
    assert controller_silence(None, now) == now


def test_a_log_copy_that_close_did_not_wait_for_is_no_error(tmp_path):
    """On a starved machine the shipper's thread can still be in a pass when close() has
    stopped waiting for it and closed the log: that pass does nothing (the bench at 2,048
    nodes had such passes die on the closed file); the stored log is close()'s, whole."""
    from trainctl.node.output import LogShipper
    from trainctl.store import LocalStore

    store = LocalStore(tmp_path / "store")
    shipper = LogShipper(tmp_path / "node.log", store, "logs/node-0.log", interval=3600)
    shipper.write("a line", shown=False)
    shipper.close()
    shipper.ship()  # the late pass
    assert store.get_text("logs/node-0.log").rstrip().endswith("a line")


def test_a_failed_exit_barrier_after_every_worker_finished_is_one_line():
    """A survivor's torchrun, whose peer's torchrun (holding the store) ended first, says so
    in c10d's C++ frames and a traceback: one line of trainctl's instead. A c10d warning not
    followed by the exit barrier stays whole."""
    from pathlib import Path

    noise = LauncherNoise()
    printed = (Path(__file__).parent.parent / "fixtures" / "exit-barrier.log").read_text()
    kept: list[str] = []
    for line in ["done 1", *printed.splitlines(), "after"]:
        kept += noise.feed(line, stopping=False)
    kept += noise.flush()
    assert kept == ["done 1", LauncherNoise.EXIT_BARRIER_SAID, "after"]
    other = [
        "[W1205 17:32:28.422471332 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl",
        "Exception raised from recvBytes at Utils.hpp:787 (most recent call first):",
        "frame #0: c10::Error::Error() + 0x9d",
        "epoch 4",
    ]
    kept = [line for raw in other for line in noise.feed(raw, stopping=False)]
    assert kept == other
