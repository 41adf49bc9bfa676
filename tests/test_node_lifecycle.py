"""A cloud node that outlives its controller halts itself (and EC2 then terminates it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainctl.node.agent import power_off


@pytest.mark.timeout(30)
def test_power_off_halts_the_machine_with_shutdown(tmp_path: Path, monkeypatch) -> None:
    # A stand-in `shutdown` (and `sudo`) first on PATH records how it was called.
    calls = tmp_path / "calls"
    for name in ("shutdown", "sudo"):
        tool = tmp_path / "bin" / name
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    said: list[str] = []
    power_off(said.append)
    expected = "shutdown -h now" if os.geteuid() == 0 else "sudo -n shutdown -h now"
    assert calls.read_text().splitlines() == [expected]
    assert said == [f"powering off this node: {expected}"]
