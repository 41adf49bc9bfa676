"""The face a provider plug-in may rely on (trainctl.plugin): the repository's plug-ins import
nothing else of trainctl, every name the face lists is there and documented, and trainctl's
own providers are found the way a plug-in is (the `trainctl.providers` entry point group)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import pytest

import trainctl.plugin as face
from tests.helpers import REPO
from trainctl.errors import SpecError
from trainctl.provisioning import _plugins, get_provider, provider_names, register_provider
from trainctl.provisioning.builtin import BUILT_IN

PLUGINS = REPO / "plugins"


def _trainctl_imports(path: Path) -> set[str]:
    """The trainctl modules a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "trainctl"}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] == "trainctl":
                found.add(node.module)
    return found


def test_the_repositorys_plugins_import_only_the_plugin_face():
    files = sorted(PLUGINS.glob("*/*/**/*.py"))
    assert any(f.parts[-2] == "trainctl_slurm" for f in files)  # (the scan finds Slurm's)
    beyond = {
        f"{f.relative_to(REPO)}: {name}"
        for f in files
        for name in _trainctl_imports(f)
        if name != "trainctl.plugin"
    }
    assert not beyond, f"plug-ins import trainctl beyond trainctl.plugin: {sorted(beyond)}"


def test_the_scan_catches_an_import_past_the_face(tmp_path):
    sneaky = tmp_path / "provider.py"
    sneaky.write_text(
        "def f():\n    from trainctl.record import JobRecord\nimport trainctl.plugin\n"
    )
    assert _trainctl_imports(sneaky) == {"trainctl.record", "trainctl.plugin"}


def test_every_name_of_the_face_is_there_and_documented():
    assert isinstance(face.API_VERSION, int)
    documented = set(re.findall(r"`(\w+)`", face.__doc__ or ""))
    for name in face.__all__:
        assert getattr(face, name) is not None, name
        assert name in documented, f"trainctl.plugin's docstring does not say what {name} is for"
    assert set(dir(face)) == set(face.__all__)
    # the names type checkers see are the ones the face gives
    assert set(face._where()) == set(face.__all__), set(face._where()) ^ set(face.__all__)


def test_trainctls_own_providers_are_named_in_the_plugin_group():
    """Where trainctl is installed (its metadata there), its entry points name its built-in
    providers, in the group plug-ins use; a copy without metadata still knows them."""
    points = {
        e.name: e.value
        for e in importlib.metadata.entry_points(group="trainctl.providers")
        if e.value.startswith("trainctl.")
    }
    if points:  # (an older editable install may predate them: then only the fallback)
        assert points == {
            p.name: f"trainctl.provisioning.builtin:{p.name.upper()}" for p in BUILT_IN
        }
    assert {"local", "ssh", "aws"} <= set(provider_names())


@pytest.fixture
def registry():
    before = dict(_plugins)
    yield
    _plugins.clear()
    _plugins.update(before)


def test_a_plugin_written_for_another_api_is_refused_by_name(registry, monkeypatch):
    from trainctl.spec.catalog import CATALOG

    monkeypatch.setitem(CATALOG, "old.small", face.InstanceType("old.small", "oldcloud"))
    register_provider(
        face.ProviderPlugin("oldcloud", lambda region: None, api=face.API_VERSION + 1)  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(
        SpecError,
        match=r"'old.small' runs on the oldcloud plug-in, written for trainctl's plug-in API 2; "
        r"this trainctl has API 1",
    ):
        get_provider("old.small")


def test_a_provider_whose_module_is_missing_says_what_to_install(registry, monkeypatch):
    from trainctl.spec.catalog import CATALOG

    monkeypatch.setitem(CATALOG, "needy.small", face.InstanceType("needy.small", "needy"))
    register_provider(
        face.ProviderPlugin("needy", lambda region: None, needs=("no_such_sdk", "needy[cloud]"))  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(SpecError, match=r"needs no_such_sdk: pip install 'needy\[cloud\]'"):
        get_provider("needy.small")
