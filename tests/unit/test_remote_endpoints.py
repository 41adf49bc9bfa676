"""Rank 0 reads every node's remote-start endpoint from the store (trainctl.node.remote_start):
a stored copy that is not one is a line naming the host, never a traceback."""

from __future__ import annotations

import json

import pytest

from trainctl.node.remote_start import read_endpoint

GOOD = {"address": "10.0.0.2", "port": 41234, "token": "ab" * 32}


def test_an_endpoint_as_the_agent_stores_it_is_read_back():
    assert read_endpoint(json.dumps(GOOD), "algo-2") == GOOD


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "\x00\xff not json",
        "[" * 50_000,
        "[1, 2]",
        json.dumps({**GOOD, "port": "41234"}),
        json.dumps({"address": "10.0.0.2", "port": 41234}),
    ],
    ids=["empty", "binary", "deep", "a list", "port as text", "no token"],
)
def test_anything_else_is_one_line_naming_the_host(stored):
    with pytest.raises(ValueError) as raised:
        read_endpoint(stored, "algo-2")
    assert str(raised.value) == "the remote-start endpoint of algo-2 in the store is unreadable"
