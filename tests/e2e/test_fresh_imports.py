"""The layering seen from a fresh interpreter: every module imports in dependency order, and
what a node or a training script imports loads no client code and no heavy SDK."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.unit.test_architecture import CLIENT, _graph, _within


def test_every_module_imports_in_dependency_order_in_a_fresh_interpreter() -> None:
    graph = _graph()
    order: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        done.add(name)
        for dep in sorted(graph[name]):
            visit(dep)
        order.append(name)

    for name in sorted(graph):
        visit(name)
    order = [n for n in order if not n.endswith("__main__")]
    script = (
        "import importlib, json, sys\n"
        "for m in json.loads(sys.argv[1]):\n"
        "    importlib.import_module(m)"
    )
    done_proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(order)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done_proc.returncode == 0, done_proc.stderr[-2000:]


@pytest.mark.parametrize(
    "module",
    ["trainctl.node.agent", "trainctl.node.checkpoints", "trainctl.node.imds", "trainctl.train"],
)
def test_node_side_imports_stay_small(module: str) -> None:
    """What a node (or a training script) imports loads no client code and no heavy SDK."""
    heavy = ["boto3", "botocore", "paramiko", "fabric", "typer", "rich"]
    if module != "trainctl.train":  # the training helpers are for torch scripts
        heavy.append("torch")
    script = f"import json, sys, {module}\nmods = sorted(sys.modules)\nprint(json.dumps(mods))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(out.stdout)
    assert [m for m in loaded if m.split(".")[0] in heavy] == []
    assert [m for m in loaded if _within(m, CLIENT)] == []


@pytest.mark.timeout(60)
def test_a_clone_named_trainctl_does_not_shadow_the_package(tmp_path):
    """A newcomer who cloned into trainctl/ and ran a script from the folder above it got
    "cannot import name 'Estimator' from 'trainctl' (unknown location)": the clone, a folder
    named like the package, was taken for it. Under src/ it cannot be."""
    (tmp_path / "trainctl").symlink_to(REPO, target_is_directory=True)
    script = "import trainctl; from trainctl import Estimator; print(trainctl.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(REPO / "src" / "trainctl" / "__init__.py")


@pytest.mark.timeout(60)
def test_the_face_loads_nothing_until_a_name_is_used():
    """Every `trainctl` command reads the plug-ins' entry points (--help too): a plug-in's
    import of the face must not pull in what its provider needs only to run."""
    script = (
        "import sys; before = set(sys.modules); import trainctl.plugin as f; f.ProviderPlugin; "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('trainctl')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "trainctl.transport.local" not in done.stdout and "spec.settings" not in done.stdout
