"""The daily habits of CLI users, through the installed `trainctl` (a pty where the width or
the colour matters): --version, clean help, TAB completion of job names, whole job names
and URIs at 80 columns, `logs -f` exiting like `attach`, the failure of a script that exits
non-zero without a traceback, NO_COLOR/FORCE_COLOR, `ls` like `aws s3 ls`, `artifacts get`
of a folder, and `rm`/`prune`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import TRAINCTL, on_a_terminal

pytestmark = pytest.mark.timeout(120)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7])[;m]")  # an SGR that sets a colour
FAILING = "import sys\nprint('step 7')\nsys.exit(3)\n"
# a model file and a folder of outputs, so the job has a folder to download
SAVING = """import os
out = os.environ.get("SM_OUTPUT_DATA_DIR", "output")
os.makedirs(os.path.join(out, "steps", "step-2"), exist_ok=True)
for name in ("steps/step-2/a.txt", "steps/step-2/b.txt", "top.txt"):
    with open(os.path.join(out, name), "w") as f:
        f.write(name)
print("saved")
"""
TICKING = """import json, os, time
rank = json.loads(os.environ["SM_HOSTS"]).index(os.environ["SM_CURRENT_HOST"])
for i in range(3):
    print(f"tick {i} node {rank}", flush=True)
    time.sleep(0.3)
"""
LONG_NAME = "a-job-whose-name-is-long-enough-to-be-cut-at-80"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRAINCTL, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A TRAINCTL_HOME with two ended jobs: one that failed with `exit 3` after printing
    "step 7" (a long name), one that completed and saved a folder of outputs."""
    root = tmp_path_factory.mktemp("habits")
    src = root / "src"
    src.mkdir()
    (src / "fail.py").write_text(FAILING)
    (src / "save.py").write_text(SAVING)
    (src / "tick.py").write_text(TICKING)
    env = {**os.environ, "TRAINCTL_HOME": str(root / "home"), "COLUMNS": "80"}
    env.pop("TRAINCTL_STORE", None)
    env.pop("FORCE_COLOR", None)
    env.pop("NO_COLOR", None)
    failed = run(env, "submit", "fail.py", "--source-dir", str(src), "--job-name", LONG_NAME)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    saved = run(env, "submit", "save.py", "--source-dir", str(src), "--job-name", "saver")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    ticked = run(
        env,
        "submit",
        "tick.py",
        "--source-dir",
        str(src),
        "--job-name",
        "ticker",
        "--instance-count",
        "2",
    )
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    return env, root


def test_version_and_help_follow_click_conventions(made):
    env, _ = made
    version = run(env, "--version")
    assert version.returncode == 0 and re.fullmatch(r"trainctl \d+\.\d+\.\S+\n", version.stdout)
    for command in ("logs", "artifacts", "submit", "rm", "ls"):
        shown = run(env, command, "--help").stdout
        assert "<bool>" not in shown and "<str>" not in shown and "{" not in shown, shown
    logs = run(env, "logs", "--help").stdout
    assert "Usage: trainctl logs [OPTIONS] JOB" in logs
    assert re.search(r"-f, --follow\s+Keep printing", logs), logs
    # a docstring's lines are one paragraph that wraps to the terminal
    assert "follows until the job ends and then, like `attach`" in " ".join(logs.split())


def _option_names() -> dict[str, list[str]]:
    """Every command's option names (the click tree the installed command is made of)."""
    import typer

    from trainctl.cli import app, tidy_help

    root = tidy_help(typer.main.get_command(app))
    return {
        name: [
            opt
            for param in command.params
            if param.param_type_name == "option" and not param.hidden
            for opt in (*param.opts, *param.secondary_opts)
        ]
        for name, command in root.commands.items()
    }


def test_help_shows_every_option_name_whole_at_any_width(made):
    """No name cut with "…" (typer's tables did at 80 and at 120 columns), no line wider
    than the terminal but an option's own names, and `<redacted>` shown as a word."""
    env, _ = made
    names = _option_names()
    for columns in (40, 80, 120):  # (click's help is never narrower than 50)
        for command in ("submit", "tune", "logs"):  # the longest option names
            shown = run({**env, "COLUMNS": str(columns)}, command, "--help").stdout
            assert "…" not in shown, shown
            for name in names[command]:
                assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,/=]|$)", shown, re.M), (
                    columns, command, name, shown,
                )  # fmt: skip
            for line in shown.splitlines():
                width = max(columns, 50)
                assert len(line) <= width or line.strip().startswith("-"), (columns, line)
    submit = run({**env, "COLUMNS": "80"}, "submit", "--help").stdout
    assert submit.count("<redacted>") >= 2, submit  # --secret-env, --secret-hyperparameters
    assert "\x1b[" not in submit  # plain text: nothing for NO_COLOR to take out


def test_tab_completes_job_names_for_every_command_that_takes_one(made):
    env, _ = made
    for words in ("trainctl status a-j", "trainctl logs -f a-j", "trainctl rm saver a-j"):
        done = subprocess.run(
            [TRAINCTL],
            env={
                **env,
                "_TRAINCTL_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - 1),
            },
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and done.stdout.split() == [LONG_NAME], (words, done)
    # a field of a few values completes them
    offered = subprocess.run(
        [TRAINCTL],
        env={
            **env,
            "_TRAINCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": "trainctl submit train.py --distribution ",
            "COMP_CWORD": "4",
        },
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert offered.stdout.split() == ["torch_distributed", "mpi", "none"], offered
    # As a user asks for it: from bash, which typer finds among the command's parents (the
    # `exit` keeps bash from replacing itself with the command).
    script = subprocess.run(
        ["bash", "-c", '"$0" --show-completion; exit $?', TRAINCTL],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert script.returncode == 0 and "_TRAINCTL_COMPLETE" in script.stdout, script


def test_jobs_shows_whole_names_at_80_columns_and_piped(made):
    env, _ = made
    code, screen = on_a_terminal(env, "jobs", columns=80)
    assert code == 0
    plain = ANSI.sub("", screen)
    assert LONG_NAME in plain and "saver" in plain
    assert all(len(line) <= 80 for line in plain.splitlines()), plain
    piped = run({**env, "COLUMNS": "40"}, "jobs")
    assert piped.returncode == 0 and LONG_NAME in piped.stdout and "…" not in piped.stdout
    row = next(line for line in piped.stdout.splitlines() if LONG_NAME in line)
    assert "Failed" in row and "1 x local" in row


def test_an_empty_jobs_names_the_store_it_looked_at(tmp_path):
    env = {**os.environ, "TRAINCTL_HOME": str(tmp_path / "empty")}
    env.pop("TRAINCTL_STORE", None)
    done = run(env, "jobs")
    assert done.returncode == 0 and done.stdout == ""
    store = (tmp_path / "empty" / "store").resolve().as_uri()
    assert done.stderr.strip() == f"No jobs in {store} (TRAINCTL_HOME={tmp_path / 'empty'})."


def test_a_script_exiting_3_without_a_traceback_fails_with_its_exit_code(made):
    env, root = made
    info = json.loads(run(env, "status", LONG_NAME, "-o", "json").stdout)
    assert info["failure_reason"] == "algo-1: exit code 3", info
    assert "step 7" in (info["failure_detail"] or "")  # context, not the cause
    # at 60 columns the store URI is never broken (the terminal wraps it, a copy gets it
    # whole) and the attempt's cause is one line
    code, screen = on_a_terminal(env, "status", LONG_NAME, columns=60)
    plain = ANSI.sub("", screen).replace("\r", "")
    assert code == 0
    store_uri = (root / "home" / "store" / "jobs" / LONG_NAME).resolve().as_uri()
    assert store_uri in plain, plain
    attempts = plain[plain.index("attempts") :].strip().splitlines()
    assert len(attempts) == 3, attempts  # title, header, the one attempt on one line


def test_logs_follow_ends_with_the_verdict_and_exits_like_attach(made):
    env, _ = made
    failed = run(env, "logs", "-f", LONG_NAME)
    assert failed.returncode == 1
    assert failed.stdout.rstrip().splitlines()[-3:-1] == [
        "[trainctl] failure: algo-1: exit code 3",
        "[trainctl]   step 7",
    ], failed.stdout
    assert f"[trainctl] job {LONG_NAME}: Failed in" in failed.stdout
    completed = run(env, "logs", "-f", "saver")
    assert completed.returncode == 0 and "[trainctl] job saver: Completed in" in completed.stdout
    assert run(env, "logs", LONG_NAME).returncode == 0  # without -f: the logs, exit 0


def test_node_colours_follow_no_color_term_and_force_color(made):
    env, _ = made
    _, coloured = on_a_terminal(env, "logs", "saver")
    assert "\x1b[" in coloured and "[algo-1]" in ANSI.sub("", coloured)
    assert COLOUR.search(coloured), coloured
    _, uncoloured = on_a_terminal({**env, "NO_COLOR": "1"}, "logs", "saver")
    assert "[algo-1] saved" in uncoloured and "\x1b[" not in uncoloured
    # no escape at all under NO_COLOR (rich alone keeps bold): tables, status, trees
    for command in (("jobs",), ("status", "saver"), ("artifacts", "saver")):
        _, shown = on_a_terminal({**env, "NO_COLOR": "1"}, *command)
        assert "saver" in shown and "\x1b[" not in shown, (command, shown)
        _, bold = on_a_terminal(env, *command)
        assert "\x1b[" in bold, command  # (and with colour, they have styles)
    _, dumb = on_a_terminal({**env, "TERM": "dumb"}, "logs", "saver")
    assert "[algo-1] saved" in dumb and "\x1b[" not in dumb
    forced = run({**env, "FORCE_COLOR": "1"}, "logs", "saver")
    assert "\x1b[" in forced.stdout  # a pipe, coloured on request


def test_ls_lists_one_level_like_aws_s3_ls(made):
    env, root = made
    store = (root / "home" / "store").resolve().as_uri()
    top = run(env, "ls", store)
    assert top.returncode == 0
    assert [line.split() for line in top.stdout.splitlines()] == [
        ["PRE", "jobs/"],
        ["PRE", "sources/"],
    ]
    job = run(env, "ls", "-h", f"{store}/jobs/saver")
    assert re.search(r"^\s+PRE\s+logs/$", job.stdout, re.M), job.stdout
    assert re.search(r"^\S+ \S+\s+\d+\.\d KiB  job\.json$", job.stdout, re.M), job.stdout
    everything = run(env, "ls", "--recursive", f"{store}/jobs/saver")
    assert f"{store}/jobs/saver/logs/attempt-1/node-0.log" in everything.stdout
    assert "PRE" not in everything.stdout
    one = run(env, "ls", f"{store}/jobs/saver/job.json")
    assert one.returncode == 0 and one.stdout.rstrip().endswith(" job.json")
    for missing in (f"{store}/jobs/no-such-job", "no-such-folder"):
        gone = run(env, "ls", missing)
        assert (gone.returncode, gone.stdout) == (1, ""), gone
        assert gone.stderr.strip() == f"error: nothing at {missing}"
    scheme = run(env, "ls", "ftp://host/x")
    assert scheme.returncode == 2 and scheme.stderr.count("\n") == 1 and "ftp" in scheme.stderr


def test_artifacts_get_downloads_a_folder_and_dest_slash_means_into(made, tmp_path):
    env, _ = made
    listed = run(env, "artifacts", "saver", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    into = tmp_path / "into"
    got = run(env, "artifacts", "saver", "get", "output", f"{into}/")
    assert got.returncode == 0, got.stderr
    tarball = into / "output" / "output.tar.gz"
    assert tarball.is_file(), sorted(p.name for p in into.rglob("*"))
    # each file it wrote, a line each (not only the folder's name)
    written = sorted(str(p) for p in into.rglob("*") if p.is_file())
    assert sorted(got.stdout.splitlines()) == written and str(tarball) in written, got.stdout
    logs = run(env, "artifacts", "saver", "get", "logs/attempt-1", str(tmp_path / "logs"))
    assert logs.returncode == 0, logs.stderr
    assert (tmp_path / "logs" / "node-0.log").read_text().count("saved") >= 1
    one = run(env, "artifacts", "saver", "get", "job.json", f"{tmp_path / 'records'}/")
    assert one.returncode == 0 and (tmp_path / "records" / "job.json").is_file()


def _copy_home(root: Path, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    shutil.copytree(root / "home", home, symlinks=True)
    env = {**os.environ, "TRAINCTL_HOME": str(home)}
    env.pop("TRAINCTL_STORE", None)
    return env


def test_rm_deletes_ended_jobs_and_refuses_a_running_one(made, tmp_path):
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    _, root = made
    env = _copy_home(root, tmp_path)
    home = Path(env["TRAINCTL_HOME"])
    store = open_store((home / "store").as_uri())
    src = root / "src"
    # A detached controller killed before its end leaves its log on this machine: gc finds it
    # and files it where the controller would have (the job's prefix), rm deletes both.
    stray = home / "controllers" / "saver.log"
    stray.parent.mkdir(exist_ok=True)
    stray.write_text("[trainctl] job saver: Completed\n")
    found = json.loads(run(env, "gc", "-o", "json").stdout)["found"]
    assert [(f["kind"], f["job"]) for f in found] == [("controller-log", "saver")], found
    assert run(env, "gc", "--yes").returncode == 0 and not stray.exists()
    filed = home / "store" / "jobs" / "saver" / "controller.log"
    assert filed.read_text() == "[trainctl] job saver: Completed\n"
    stray.write_text("again\n")
    pending = create_job(build_spec(entry_point="save.py", source_dir=str(src)), store)
    before = sorted(p for p in (home / "store").rglob("*"))

    refused = run(env, "rm", "saver", pending.name, "--yes")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused
    assert f"job {pending.name} is Pending" in refused.stderr
    assert sorted(p for p in (home / "store").rglob("*")) == before, "rm changed something"
    unasked = run(env, "rm", "saver")  # not a terminal: only --yes deletes
    assert unasked.returncode == 2 and "--yes" in unasked.stderr
    assert (home / "store" / "jobs" / "saver" / "job.json").is_file()

    removed = run(env, "rm", "saver", "--yes", "-o", "json")
    assert removed.returncode == 0 and json.loads(removed.stdout) == {"removed": ["saver"]}
    assert not (home / "store" / "jobs" / "saver").exists() and not stray.exists()
    listed = json.loads(run(env, "jobs", "-o", "json").stdout)
    assert sorted(j["name"] for j in listed) == sorted([LONG_NAME, "ticker", pending.name])
    assert run(env, "rm", "saver", "--yes").returncode == 1  # gone: not found


def test_prune_deletes_by_age_and_state_and_never_a_running_job(made, tmp_path):
    from trainctl.controller.submit import create_job
    from trainctl.spec.build import build_spec
    from trainctl.store import open_store

    _, root = made
    env = _copy_home(root, tmp_path)
    home = Path(env["TRAINCTL_HOME"])
    store = open_store((home / "store").as_uri())
    pending = create_job(build_spec(entry_point="save.py", source_dir=str(root / "src")), store)

    assert run(env, "prune", "--older-than", "7x", "--yes").returncode == 2
    young = run(env, "prune", "--older-than", "1d", "--yes")
    assert young.returncode == 0 and young.stdout == ""
    # says which ended jobs it looked for, and how many there are
    assert "No ended jobs that ended more than 1d ago in " in young.stderr, young.stderr
    assert "(3 ended job(s) in all)" in young.stderr, young.stderr
    as_json = run(env, "prune", "--older-than", "1d", "--yes", "-o", "json")
    assert json.loads(as_json.stdout) == {"removed": []}
    failed = run(env, "prune", "--state", "failed", "--yes")
    assert failed.stdout == f"removed {LONG_NAME}\n", failed
    rest = run(env, "prune", "--yes", "-o", "json")
    assert sorted(json.loads(rest.stdout)["removed"]) == ["saver", "ticker"], rest
    names = [j["name"] for j in json.loads(run(env, "jobs", "-o", "json").stdout)]
    assert names == [pending.name]


def _ticks(out: str) -> list[str]:
    return [line for line in out.splitlines() if " tick " in line]


def test_logs_filters_times_and_merge(made, tmp_path):
    env, root = made
    stored = root / "home" / "store" / "jobs" / "ticker" / "logs" / "attempt-1"
    for log in stored.glob("node-*.log"):  # every stored line starts with its time
        assert all(STAMP.match(line) for line in log.read_text().splitlines()), log

    second = run(env, "logs", "ticker", "--node", "1").stdout
    assert _ticks(second) == [f"[algo-2] tick {i} node 1" for i in range(3)]
    assert (
        run(env, "logs", "ticker", "--node", "algo-1").stdout
        == run(env, "logs", "ticker", "-n", "0").stdout
    )
    whole = run(env, "logs", "ticker").stdout.splitlines()
    # --tail: each node's last lines (kubectl's, per container), in their order
    each = [[line for line in whole if line.startswith(f"[algo-{n}] ")] for n in (1, 2)]
    assert run(env, "logs", "ticker", "--tail", "2").stdout.splitlines() == (
        each[0][-2:] + each[1][-2:]
    )
    assert run(env, "logs", "ticker", "--attempt", "2").stdout == ""
    # --rank on nodes of one process each: the node's rank is its worker's
    assert _ticks(run(env, "logs", "ticker", "--rank", "1").stdout) == _ticks(second)
    assert not any(
        line.startswith("[algo-2] [trainctl]")
        for line in run(env, "logs", "ticker", "--rank", "1").stdout.splitlines()
    )  # (the node agent's own lines are no worker's)
    # --no-prefix: the script's lines alone; -o json: a JSON object a line
    bare = run(env, "logs", "ticker", "-n", "1", "--no-prefix").stdout
    assert [line for line in bare.splitlines() if line.startswith("tick ")] == [
        f"tick {i} node 1" for i in range(3)
    ]
    assert "[algo-" not in bare
    objects = [
        json.loads(line) for line in run(env, "logs", "ticker", "-o", "json").stdout.splitlines()
    ]
    ticks = [o for o in objects if " tick " in f" {o['line']}"]
    assert [(o["node"], o["rank"], o["attempt"], o["line"]) for o in ticks[:3]] == [
        ("algo-1", 0, 1, f"tick {i} node 0") for i in range(3)
    ]
    assert all(STAMP.match(o["time"] + " ") for o in objects), objects

    # --merge interleaves the nodes by each line's time: stamps set here (node 0's ticks at
    # :00, :02, :04, node 1's at :01, :03, :05), not left to when each node got a CPU
    merging = _copy_home(root, tmp_path / "merge")
    logs = Path(merging["TRAINCTL_HOME"]) / "store/jobs/ticker/logs/attempt-1"
    for node in (0, 1):
        path = logs / f"node-{node}.log"
        stamped = []
        for line in path.read_text().splitlines():
            if " tick " in line:
                tick = int(line.split()[2])
                line = f"2026-01-01T00:00:0{2 * tick + node}.000Z" + line[24:]
            stamped.append(line)
        path.write_text("\n".join(stamped) + "\n")
    merged = _ticks(run(merging, "logs", "ticker", "--merge").stdout)
    order = [(int(line.split()[2]), int(line.split()[4])) for line in merged]
    assert order == [(i, n) for i in range(3) for n in (0, 1)], merged
    timed = run(env, "logs", "ticker", "--timestamps", "--merge").stdout.splitlines()
    assert timed and all(STAMP.match(line) for line in timed), timed
    assert [line[:24] for line in timed] == sorted(line[:24] for line in timed)

    # --since leaves out what is older: one line of a copy made three days old
    env2 = _copy_home(root, tmp_path)
    old = Path(env2["TRAINCTL_HOME"]) / "store/jobs/ticker/logs/attempt-1/node-0.log"
    lines = old.read_text().splitlines()
    first_tick = next(i for i, line in enumerate(lines) if "tick 0" in line)
    lines[first_tick] = "2020-01-01T00:00:00.000Z" + lines[first_tick][24:]
    old.write_text("\n".join(lines) + "\n")
    recent = _ticks(run(env2, "logs", "ticker", "--since", "1d", "--node", "0").stdout)
    assert recent == ["[algo-1] tick 1 node 0", "[algo-1] tick 2 node 0"]
    # ... or since a time (kubectl's --since-time, aws logs tail --since): UTC unless it says
    for when in ("2021-01-01T00:00:00Z", "2021-01-01", "2021-01-01T01:00:00+01:00"):
        since = _ticks(run(env2, "logs", "ticker", "--since", when, "--node", "0").stdout)
        assert since == recent, when
    everything = _ticks(run(env2, "logs", "ticker", "--since", "2019-12-31", "-n", "0").stdout)
    assert len(everything) == 3

    for bad, field in (
        (["--since", "ten minutes"], "--since"),
        (["--since", "2026-13-01"], "--since"),
        (["-o", "yaml"], "--output"),
        (["--node", "gpu-3"], "--node"),
        (["--tail", "-1"], "--tail"),
    ):
        done = run(env, "logs", "ticker", *bad)
        assert done.returncode == 2 and done.stdout == "", (bad, done)
        assert done.stderr.count("\n") == 1 and f"error: {field}:" in done.stderr, done.stderr


def test_the_same_filters_from_python(made, monkeypatch):
    import io

    from trainctl.controller.logs import log_selection
    from trainctl.estimator import TrainingJob

    env, _ = made
    monkeypatch.setenv("TRAINCTL_HOME", env["TRAINCTL_HOME"])
    out = io.StringIO()
    TrainingJob.attach("ticker").logs(stream=out, node="algo-2", tail=1)
    assert out.getvalue() == "[algo-2] tick 2 node 1\n"
    ranks = log_selection(ranks=[3])
    assert ranks.keeps(0, None, "[rank 3]\tloss 1") and not ranks.keeps(0, None, "[rank 2]\tx")
    assert not ranks.keeps(0, None, "a line of no worker")


def test_jobs_filters_fits_80_columns_and_watches_like_kubectl_get(made, tmp_path):
    env, root = made
    names = lambda out: [line.split()[0] for line in out.splitlines()[1:]]  # noqa: E731
    assert names(run(env, "jobs", "--state", "failed").stdout) == [LONG_NAME]
    assert names(run(env, "jobs", "-s", "Completed", "-s", "FAILED").stdout) == [
        "ticker", "saver", LONG_NAME,
    ]  # fmt: skip
    assert names(run(env, "jobs", "--limit", "1").stdout) == ["ticker"]  # the newest
    assert names(run(env, "jobs", "sav*").stdout) == ["saver"]
    none = run(env, "jobs", "nothing-*")
    assert none.returncode == 0 and none.stdout == "" and "No matching jobs" in none.stderr
    for bad, field in ((["-s", "Runnning"], "--state"), (["--limit", "0"], "--limit")):
        done = run(env, "jobs", *bad)
        assert done.returncode == 2 and done.stderr.startswith(f"error: {field}: "), done.stderr
    # a pipe gets every column, the cost among them; 80 columns leave out the least needed
    # first (a cost where nothing is priced), never a time's digits nor the name
    wide = run(env, "jobs").stdout.splitlines()
    assert wide[0].split() == [
        "NAME", "STATE", "INSTANCES", "CREATED", "DURATION", "ATTEMPTS", "COST",
    ]  # fmt: skip
    _, narrow = on_a_terminal({**env, "NO_COLOR": "1"}, "jobs", columns=80)
    lines = [line for line in narrow.replace("\r", "").splitlines() if line]
    assert all(len(line) <= 80 for line in lines), lines
    assert "COST" not in lines[0] and "CREATED" in lines[0], lines
    assert all(re.search(r" \d\d-\d\d \d\d:\d\d(\s|$)", line) for line in lines[1:]), lines
    assert "…" not in narrow and LONG_NAME in narrow

    # tuning trials are hidden unless asked for (their tuning job lists them)
    copy = _copy_home(root, tmp_path)
    record = Path(copy["TRAINCTL_HOME"]) / "store" / "jobs" / "ticker" / "job.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "tuning_job": "tune-train-x"}))
    assert "ticker" not in names(run(copy, "jobs").stdout)
    assert "ticker" in names(run(copy, "jobs", "--all").stdout)

    # --watch: the list again whenever it changes, until Ctrl-C (exit 130)
    watching = subprocess.Popen(
        [TRAINCTL, "jobs", "--watch", "--all"], env=copy, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = [watching.stdout.readline() for _ in range(4)]  # header and 3 jobs
        assert first[0].startswith("NAME") and "ticker" in "".join(first), first
        removed = run(copy, "rm", "ticker", "--yes")
        assert removed.returncode == 0, removed.stderr
        again = [watching.stdout.readline() for _ in range(4)]  # a blank line, the new list
        assert again[0] == "\n" and again[1].startswith("NAME"), again
        assert "ticker" not in "".join(again[1:]) and "saver" in "".join(again), again
        watching.send_signal(signal.SIGINT)
        assert watching.wait(timeout=30) == 130
    finally:
        watching.kill()
        watching.wait()


def test_events_shows_a_jobs_timeline(made):
    env, _ = made
    shown = run(env, "events", "saver")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert re.match(r"\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} +\+0\.0s  state +- -> Pending", lines[0])
    assert any("Starting -> Training" in line for line in lines), lines
    assert any(" agents_started " in line and "nodes=1" in line for line in lines), lines
    # what the nodes were told for their checkpoint interval (Checkpointer.due)
    assert any(
        " checkpoint_policy " in line and "capacity that is not reclaimed" in line for line in lines
    ), lines
    states = run(env, "events", "saver", "--type", "state").stdout.splitlines()
    assert states and all(line.split()[3] == "state" for line in states), states
    assert states[-1].endswith("-> Completed")
    stored = [
        json.loads(line) for line in run(env, "events", "saver", "-o", "json").stdout.splitlines()
    ]
    assert len(stored) == len(lines) and stored[0]["type"] == "state"
    assert {"time", "type"} <= set(stored[-1])
    missing = run(env, "events", "no-such-job")
    assert missing.returncode == 1 and missing.stderr.startswith("error: job 'no-such-job'")
