"""Spot traces (trainctl.spec.trace): the real ones in src/trainctl/replay/traces read back,
and bad input is one line naming the row, before anything is replayed."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO
from trainctl.errors import SpecError
from trainctl.spec.trace import load_trace, parse_trace

TRACES = REPO / "src" / "trainctl" / "replay" / "traces"
REAL = ["aws-p3-16node-2023-08", "aws-p3-4node-preemption-2023-08", "aws-p3-1node-2023-02"]


def _trace(**changes) -> dict:
    trace = {
        "name": "t",
        "source": "made here",
        "instance_type": "p3.2xlarge",
        "pool_size": 4,
        "prices": {"spot_usd_per_hour": 1.0, "on_demand_usd_per_hour": 3.0, "source": "s"},
        "capacity": [
            {"zone": "a", "start_s": 0, "end_s": 300, "available": 4},
            {"zone": "a", "start_s": 300, "end_s": 900, "available": 1},
            {"zone": "b", "start_s": 0, "end_s": 900, "available": 0},
        ],
    }
    trace.update(changes)
    return trace


@pytest.mark.parametrize("name", REAL)
def test_the_real_traces_read_back_with_their_sources(name: str) -> None:
    trace = load_trace(TRACES / f"{name}.json")
    assert trace.instance_type == "p3.2xlarge" and "skypilot-org/spot-traces" in trace.source
    assert trace.prices.on_demand_usd_per_hour == 3.06 and trace.prices.source
    assert trace.duration_s > 10 * 86400  # days of data
    for zone in trace.zones:
        assert 0 <= trace.available(zone, trace.duration_s / 2) <= trace.pool_size


def test_a_trace_answers_what_a_zone_had_when() -> None:
    trace = parse_trace(_trace())
    assert trace.zones == ["a", "b"] and trace.duration_s == 900
    assert [trace.available("a", t) for t in (0, 299, 300, 899, 900)] == [4, 4, 1, 1, 0]
    assert trace.available("b", 10) == 0 and trace.available("nowhere", 10) == 0


def _row(index: int, **changes) -> list[dict]:
    rows = _trace()["capacity"]
    rows[index] = {**rows[index], **changes}
    return rows


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"capacity": _row(1, start_s=200)},
            "capacity[1]: starts at 200 s, inside capacity[0] of a (which ends at 300 s): "
            "intervals overlap",
        ),
        ({"capacity": _row(1, end_s=250)}, "capacity[1]: ends at 250 s, not after it starts"),
        ({"capacity": _row(0, start_s=-5)}, "capacity[0]: start_s -5 is negative"),
        ({"capacity": _row(1, start_s=400)}, "capacity[1]: starts at 400 s, leaving a's"),
        ({"capacity": _row(2, end_s=600)}, "capacity: zone b ends at 600 s, the trace at 900 s"),
        ({"capacity": _row(0, available=5)}, "capacity[0]: available 5 is more than pool_size"),
        ({"capacity": _row(0, available=-1)}, "capacity[0].available: Input should be greater"),
        ({"instance_type": "p9.mega"}, "instance_type: 'p9.mega' is not an EC2 instance type"),
        ({"instance_type": "local"}, "instance_type: 'local' is not an EC2 instance type"),
        ({"prices": None}, "prices: Input should be"),
        ({"capacity": []}, "capacity: List should have at least 1 item"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        (
            {"preemptions": [{"zone": "c", "at_s": 10, "count": 1}]},
            "preemptions[0]: zone 'c' has no capacity rows",
        ),
        (
            {"preemptions": [{"zone": "a", "at_s": 900, "count": 1}]},
            "preemptions[0]: at_s 900 is past the trace's end",
        ),
    ],
)
def test_bad_rows_are_one_line_naming_the_row(changes: dict, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_trace(_trace(**changes))
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_no_prices_says_what_prices_a_trace_needs() -> None:
    trace = _trace()
    del trace["prices"]
    with pytest.raises(SpecError, match=r"^prices: is required: spot and on-demand USD per hour"):
        parse_trace(trace)


def test_a_file_that_is_not_a_trace_is_one_line(tmp_path) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x00\xff\xfe garbage")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([1, 2]))
    for path, message in (
        (binary, "is not JSON"),
        (deep, "trace: "),
        (listed, "is not a trace"),
        (tmp_path / "missing.json", "cannot read"),
    ):
        with pytest.raises(SpecError) as caught:
            load_trace(path)
        assert message in str(caught.value) and "\n" not in str(caught.value)
