"""The unit tier: no process is started and no connection is made, so the tier runs in
seconds on any machine (`make test-fast`). A test that needs either belongs in e2e/,
providers/ or train/."""

from __future__ import annotations

import socket
import subprocess

import pytest


class NotAUnitTest(AssertionError):
    pass


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise NotAUnitTest(f"a unit test {what}; move it to tests/e2e (or providers/, train/)")

    return refused


@pytest.fixture(autouse=True)
def no_processes_no_network(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("starts no process"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("makes no connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("makes no connection"))
    # No GPU in this tier: on a GPU machine, asking nvidia-smi would start a process.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
