"""The installed `trainctl` command's usage errors and its `--` rule, in a real process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_cli_input import _assert_no_job, _installed


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["submit", "--bogus"], ("No such option: --bogus",), id="option"),
        pytest.param(["status"], ("Missing argument 'JOB'",), id="argument"),
        pytest.param(
            ["submit", "src/train.py", "--instance-count", "abc"],
            ("'--instance-count'", "integer"),
            id="type",
        ),
        pytest.param(["nosuchcmd"], ("No such command 'nosuchcmd'",), id="command"),
    ],
)
def test_usage_errors_of_the_command_are_one_line(
    cli_home: Path, src: Path, args: list[str], words: tuple[str, ...]
) -> None:
    """The installed `trainctl` (main(), as users run it): click's usage block and boxed
    message become one `error:` line that says where help is, exit 2, and no job."""
    import subprocess

    from tests.helpers import TRAINCTL

    done = subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert lines[0].endswith("--help')")
    for word in words:
        assert word in lines[0]
    _assert_no_job(cli_home)


@pytest.mark.timeout(60)
def test_words_after_double_dash_are_the_scripts_arguments(cli_home: Path, src: Path) -> None:
    """`trainctl submit multinode.py ... -- 50 10` runs `multinode.py 50 10 --lr 0.1` on
    every node: after `--` even an option-like word is the script's."""
    import json

    done = _installed(
        "submit", "src/train.py", "--instance-count", "2", "--distribution", "torch_distributed",
        "-p", "lr=0.1", "--dry-run", "-o", "json", "--", "50", "10", "--verbose",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for node in json.loads(done.stdout)["nodes"]:
        command = node["command"]
        at = command.index("train.py")
        assert command[at:] == ["train.py", "50", "10", "--verbose", "--lr", "0.1"], command
    _assert_no_job(cli_home)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--", "50", "10"], ("entry_point", "before `--`"), id="no-entry-point"),
        pytest.param(
            ["src/train.py", "50", "10"], ("unexpected extra argument", "after `--`"), id="no-dash"
        ),
    ],
)
def test_script_arguments_in_the_wrong_place_are_one_line(
    cli_home: Path, src: Path, args: list[str], words: tuple[str, ...]
) -> None:
    done = _installed("submit", *args)
    assert done.returncode == 2, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], lines[0]
    _assert_no_job(cli_home)
