"""A fresh machine: the README's install line gives what the README's examples import, and
`make bench` skips a figure whose real part is missing (naming it) instead of ending in a
traceback. (The suite's machine-dependent tests on a machine without a container engine,
sshd or Slurm, under a CPU hog: tools/bare-machine.sh, which CI runs after `make test`.)"""

from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.helpers import REPO

# import name -> the distribution that provides it, where the two differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def _installed_by(extras: list[str]) -> set[str]:
    """The distributions `pip install -e ".[extras]"` brings in (trainctl's own extras
    followed where one names another)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {_requirement_name(r) for r in project["dependencies"]}
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            if (own := re.fullmatch(r"trainctl\[([\w,]+)\]", requirement)) is not None:
                todo += own.group(1).split(",")
            else:
                names.add(_requirement_name(requirement))
    return names


def _imported_by_examples() -> set[str]:
    """Every third-party module the examples import (or look up with find_spec)."""
    modules = set()
    for path in (REPO / "examples").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "find_spec"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                modules.add(str(node.args[0].value).split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "trainctl"}


def test_the_readme_install_line_gives_what_the_readme_examples_use():
    readme = (REPO / "README.md").read_text()
    line = re.search(r'pip install -e "\.\[([\w,]+)\]" "torch==2\.13\.0"', readme)
    assert line, "the README's install line names its extras and the pinned torch"
    installed = _installed_by(line.group(1).split(",")) | {"torch"}
    needed = {DISTRIBUTIONS.get(m, m) for m in _imported_by_examples()}
    assert {"numpy", "scikit-learn", "torch"} <= needed  # (the scan finds the digits example's)
    # the README's tuning example runs Optuna's search (trainctl.tuning imports it lazily)
    if "HyperparameterTuner" in readme:
        needed.add("optuna")
    assert needed <= installed, f"the README's install line lacks {sorted(needed - installed)}"


def _figure_needing(part: str):
    def measure(ctx):
        from tests.helpers import require_part

        require_part(part, f"{part} not found")
        raise AssertionError("not reached")

    return measure


def test_make_bench_skips_a_figure_whose_part_is_missing_and_names_it(monkeypatch, capsys):
    from bench import run

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(run.FIGURES, "needs-sshd", _figure_needing("sshd"))
    (row,) = run.measure_figure("needs-sshd", ctx=None)
    assert row["skipped"] == "missing part sshd: sshd not found" and row["pass"] is None
    assert run.rows({"figures": [row]}) == [
        ["needs-sshd", "-", "-", "missing part sshd: sshd not found", "-", "skipped"]
    ]
    # under CI a missing part is an error, as in the tests
    monkeypatch.setenv("CI", "true")
    (row,) = run.measure_figure("needs-sshd", ctx=None)
    assert row["error"].startswith("sshd tests cannot run under CI") and row["pass"] is False
    assert "Traceback" in capsys.readouterr().err  # (an error's traceback is shown, as before)


def test_the_docs_cli_page_shows_angle_brackets_as_text():
    """`<redacted>` in --secret-env's help is a word on the page, not an HTML tag the
    browser drops; inside a code span it stays as written."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "tools" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.cli_reference()
    assert "shown as &lt;redacted>" in page, page[:2000]
    assert "<redacted>" not in page.replace("`<redacted>`", "")
    assert "`SM_CHANNEL_<CHANNEL>`" in page  # (a code span: shown as written)
    assert hooks._text_not_tags("a <b> `<c>` d") == "a &lt;b> `<c>` d"


def test_make_venv_says_its_steps_and_shows_pips_progress():
    """A fresh `make venv` takes minutes: it names each step, and the long installs (torch,
    the package and its extras) show pip's own progress rather than --quiet, and how many
    packages are in place while pip installs them."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    steps = [line for line in recipe.splitlines() if line.strip().startswith("@echo")]
    assert [s.split('"')[1][:5] for s in steps[:3]] == ["[1/3]", "[2/3]", "[3/3]"], recipe
    installs = [line for line in recipe.splitlines() if " install " in line]
    heavy = [line for line in installs if "torch==" in line or '-e ".[dev]"' in line]
    assert len(heavy) == 2 and not any("--quiet" in line for line in heavy), installs
    # through the counter of packages put in place during pip's silent install step
    assert all("$(PY) tools/pip-progress.py install" in line for line in heavy), heavy
