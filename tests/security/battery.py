"""Runs many `trainctl` command lines in one process, for the bad-input and corrupt-state
batteries (tests/security/test_batteries.py): each through `trainctl.cli.main`, the
function the installed `trainctl` script calls, with its own argv and environment, its
stdout and stderr captured, and the tree of TRAINCTL_HOME compared before and after it.
A few hundred cases take seconds this way, where a process each would take minutes; the
batteries also send a sample through the installed script, to show it answers the same.

    python -m tests.security.battery < cases.json > results.json    (run_battery does it)

A case: {"argv": [...], "env": {NAME: value or null}}. A result: {"code", "stdout",
"stderr", "traceback" (an exception that escaped main, or null), "changed" (paths under
TRAINCTL_HOME made, removed or rewritten)}.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def tree(root: Path) -> dict[str, str]:
    """Every file and directory under `root`: relative path -> its size, mtime and inode
    ('dir' for a directory; a lock file of the store's own is not content). A rewrite
    changes the mtime or, written atomically, the inode."""
    found: dict[str, str] = {}
    todo = [str(root)] if root.exists() else []
    base = len(str(root)) + 1
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                if ".tmp-lock" in entry.name:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    found[entry.path[base:]] = "dir"
                    todo.append(entry.path)
                else:
                    st = entry.stat(follow_symlinks=False)
                    found[entry.path[base:]] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    return found


def run_case(case: dict[str, Any], home: Path) -> dict[str, Any]:
    from trainctl.cli import main

    saved_env = dict(os.environ)
    saved_argv = sys.argv
    for name, value in (case.get("env") or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    out, err = io.StringIO(), io.StringIO()
    before = tree(home)
    code: int | None = None
    escaped = None
    sys.argv = ["trainctl", *case["argv"]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        escaped = traceback.format_exc()
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    after = tree(home)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return {
        "code": code,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "traceback": escaped,
        "changed": changed,
    }


def run_battery(cases: list[dict], home: Path, timeout: float = 240) -> list[dict]:
    """The results of `cases` run in one fresh process over TRAINCTL_HOME=`home`."""
    env = {**os.environ, "TRAINCTL_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("TRAINCTL_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.security.battery"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def main() -> None:
    cases = json.load(sys.stdin)
    home = Path(os.environ["TRAINCTL_HOME"])
    results = [run_case(case, home) for case in cases]
    sys.stdout = sys.__stdout__
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
