"""The package's layering, checked from its source: no import cycles, one-way layers.

Data flows spec -> plan -> provision -> launch -> watch; each layer may import the layers
below it and never one above. The graph is read with `ast`, so an import inside a function
(the lazy imports that keep `trainctl --help` instant) counts like one at the top.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "trainctl"

# Every package and top-level module of trainctl, in layers from the bottom: each may import
# its own layer's siblings only where listed in SAME_LAYER, and any layer below. A module
# that is in no layer fails test_every_package_has_a_layer: place it before it lands.
# (name, what, its packages): docs/architecture.md's layer table is written from this
# (tools/docs_hooks.py), so the two cannot drift.
DESCRIBED: list[tuple[str, str, tuple[str, ...]]] = [
    ("clock", "the time the controller lives by (the wall clock, or a faster one for a replay)",
     ("trainctl.clock",)),
    ("foundation", "shared small modules: no trainctl imports but each other's", (
        "trainctl.errors", "trainctl.version", "trainctl.protocol", "trainctl.state",
        "trainctl.redact", "trainctl.procs", "trainctl.cluster", "trainctl.gpus",
        "trainctl.terminal", "trainctl.metrics", "trainctl.toolkit", "trainctl.train",
    )),
    ("spec", "the user's validated input: the job spec, its fields' doors and the settings",
     ("trainctl.spec",)),
    ("store", "file:// and s3:// stores behind one interface", ("trainctl.store",)),
    ("records and launch", "a job's record, the claims on the locations it writes to, a "
     "node's command, the source's packaging, progress bars", (
        "trainctl.record", "trainctl.claims", "trainctl.launcher", "trainctl.packaging",
        "trainctl.progress",
    )),
    ("node", "what runs on a node: imports no client package (everything above is client "
     "side)", ("trainctl.node",)),
    ("reach", "reaching a node's agent, and container images", (
        "trainctl.transport", "trainctl.image",
    )),
    ("provisioning", "where nodes come from: the provider contract and the providers",
     ("trainctl.provisioning",)),
    ("plug-in face", "the names a provider plug-in may import (nothing in trainctl imports it)",
     ("trainctl.plugin",)),
    ("controller", "one job's life", ("trainctl.controller",)),
    ("front doors", "over the controller: notebooks, diagnose runs, replays", (
        "trainctl.notebook", "trainctl.diagnose", "trainctl.replay",
    )),
    ("estimator", "the Python API", ("trainctl.estimator",)),
    ("tuning", "hyperparameter tuning", ("trainctl.tuning",)),
    ("tensorboard", "TensorBoard over jobs' logs (a tuning job's trials too)",
     ("trainctl.tensorboard",)),
    ("sagemaker and dashboard", "SageMaker's SDK on trainctl; the dashboard (it shows tuning "
     "jobs too)", ("trainctl.sagemaker", "trainctl.ui")),
    ("cli", "the `trainctl` command", ("trainctl.cli",)),
    ("package", "the package's `__init__`: the public names", ("trainctl",)),
]  # fmt: skip
LAYERS: list[tuple[str, ...]] = [packages for _, _, packages in DESCRIBED]
# Imports within one layer that are allowed (one way).
SAME_LAYER: dict[str, tuple[str, ...]] = {
    "trainctl.toolkit": ("trainctl.version",),
    "trainctl.train": ("trainctl.protocol",),
    "trainctl.image": ("trainctl.transport",),
    "trainctl.record": ("trainctl.metrics", "trainctl.claims"),
    "trainctl.launcher": ("trainctl.protocol",),
    "trainctl.notebook": ("trainctl.metrics",),
    "trainctl.diagnose": ("trainctl.train",),
    "trainctl.replay": ("trainctl.diagnose",),
}
# Narrower than their layer: imported by training scripts, or pure leaves.
ONLY: dict[str, tuple[str, ...]] = {
    "trainctl.train": ("trainctl.protocol",),
    "trainctl.toolkit": ("trainctl.version",),
    "trainctl.metrics": ("trainctl.clock",),  # (the recorder's timestamps; stdlib only)
    "trainctl.spec": (
        "trainctl.errors",
        "trainctl.version",
        "trainctl.protocol",
        "trainctl.state",
        "trainctl.redact",
    ),
}
# What runs on the user's machine (or a controller host): every layer above the node's but
# the package's own __init__.
CLIENT = tuple(p for layer in LAYERS[LAYERS.index(("trainctl.node",)) + 1 : -1] for p in layer)


def _layer_of(name: str) -> str | None:
    """The layer entry a module belongs to: the longest package prefix listed."""
    listed = [p for layer in LAYERS for p in layer]
    return max((p for p in listed if _within(name, (p,))), key=len, default=None)


def _allowed(entry: str) -> tuple[str, ...]:
    if entry in ONLY:
        return (entry, *ONLY[entry])
    level = next(i for i, layer in enumerate(LAYERS) if entry in layer)
    below = tuple(p for layer in LAYERS[:level] for p in layer)
    return (entry, *below, *SAME_LAYER.get(entry, ()))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# Not trainctl's modules: SageMaker's packages' stand-ins, imported in a job's worker
# processes under their own names (smdistributed, sagemaker_training; see the worker hook).
STAND_INS = PACKAGE / "node" / "worker_site" / "compat"


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if not p.is_relative_to(STAND_INS)
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The trainctl modules `name` imports at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_no_package_import_cycles() -> None:
    """Cycles between packages (spec <-> settings once) hide behind module-level acyclicity."""
    graph: dict[str, set[str]] = {}
    for name, deps in _graph().items():
        entry = _layer_of(name) or name
        graph.setdefault(entry, set()).update(
            d for d in (_layer_of(dep) or dep for dep in deps) if d != entry
        )
    assert _cycles(graph) == []


def test_every_package_has_a_layer() -> None:
    assert [name for name in _graph() if _layer_of(name) is None] == []


def test_layers_import_only_downwards() -> None:
    graph = _graph()
    wrong = []
    for name, deps in sorted(graph.items()):
        entry = _layer_of(name)
        if entry is None or entry == "trainctl":
            # the package's __init__ (the public names) may import anything
            continue
        allowed = _allowed(entry)
        # `trainctl.x` matches the layer entry `trainctl.x` and its modules, never a sibling
        wrong += [
            f"{name} -> {d}"
            for d in sorted(deps)
            if not any(_within(d, (a,)) for a in allowed if a != "trainctl")
        ]
    assert wrong == []


def test_node_imports_no_client_package() -> None:
    graph = _graph()
    wrong = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if _within(name, ("trainctl.node",))
        for dep in deps
        if _within(dep, CLIENT)
    ]
    assert wrong == []


def test_the_layer_table_refuses_an_upward_import() -> None:
    assert not any(_within("trainctl.controller.submit", (a,)) for a in _allowed("trainctl.node"))
    assert any(_within("trainctl.spec.settings", (a,)) for a in _allowed("trainctl.store"))
    assert "trainctl.node" not in CLIENT and "trainctl.cli" in CLIENT


def test_the_documented_layout_matches_the_tree() -> None:
    """docs/architecture.md's tree names every package and top-level module, and nothing
    that is not there."""
    import re

    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    block = text.split("```\nsrc/trainctl/\n", 1)[1].split("```", 1)[0]
    named: set[str] = set()
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # an entry of trainctl/
            entry = re.split(r"\s{2,}", line.strip())[0]  # (then its description)
            named.update(re.findall(r"([a-z_]+)(?:/|\.py)", entry))
        if not line.startswith(" "):
            break  # tests/, docs/: past trainctl's entries
    actual = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert named == actual, (sorted(named - actual), sorted(actual - named))
