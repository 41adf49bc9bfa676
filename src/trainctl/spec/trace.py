"""Spot traces: what a spot market did over time, for replaying a job against it.

A trace is a JSON file (trainctl/replay/traces/*.json; bench/traces/README.md says where
each comes from): which instance type it watched, its prices, and how many of the instances
it asked for were available in each zone over time, as rows of non-overlapping intervals per
zone::

    {"name": "...", "description": "...", "source": "https://...",
     "instance_type": "p3.2xlarge", "pool_size": 16,
     "prices": {"spot_usd_per_hour": 0.9731, "on_demand_usd_per_hour": 3.06,
                "source": "..."},
     "capacity": [{"zone": "us-west-2a", "start_s": 0, "end_s": 2100, "available": 0}, ...],
     "preemptions": [{"zone": "us-west-2a", "at_s": 7200, "count": 2, "notice_s": 120}]}

Zones are listed in full over the trace: a zone's rows start at 0 and meet end to end (a
gap would leave its capacity unknown). Bad input (overlapping or negative intervals, an
unknown instance type, no prices, a file that is not a trace) is one SpecError naming the
row.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from trainctl.errors import SpecError

# A trace is a few MB at most (weeks at 5-minute ticks, run-length coded); a bigger file is
# not one, and is refused before it is read into memory.
MAX_TRACE_BYTES = 64 * 1024 * 1024


class TracePrices(BaseModel):
    """What the instance cost per hour during the trace, and where that figure is from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spot_usd_per_hour: float = Field(gt=0)
    on_demand_usd_per_hour: float = Field(gt=0)
    source: str = Field(min_length=1)


class CapacityRow(BaseModel):
    """[start_s, end_s) of the trace: `available` of the pool's instances could be had."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zone: str = Field(min_length=1)
    start_s: float
    end_s: float
    available: int = Field(ge=0)


class PreemptionRow(BaseModel):
    """At `at_s`, `count` running instances in `zone` were reclaimed, with `notice_s` of
    warning (AWS gives 120 s; 0: none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zone: str = Field(min_length=1)
    at_s: float = Field(ge=0)
    count: int = Field(ge=1)
    notice_s: float = Field(default=120.0, ge=0)


class SpotTrace(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    source: str = Field(min_length=1)
    instance_type: str
    pool_size: int = Field(ge=1)  # how many instances the probe asked for, per zone
    prices: TracePrices
    capacity: list[CapacityRow] = Field(min_length=1)
    preemptions: list[PreemptionRow] = []
    _index: dict[str, tuple[list[float], list[CapacityRow]]] | None = PrivateAttr(default=None)

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        from trainctl.spec.catalog import CATALOG, close_types

        known = CATALOG.get(value)
        if known is None or known.provider != "aws":
            close = [c for c in close_types(value) if CATALOG[c].provider == "aws"]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{value!r} is not an EC2 instance type{hint}")
        return value

    @property
    def zones(self) -> list[str]:
        return sorted({row.zone for row in self.capacity})

    @property
    def duration_s(self) -> float:
        return max(row.end_s for row in self.capacity)

    def available(self, zone: str, at_s: float) -> int:
        """The instances `zone` could give at `at_s` (0 past the trace's end)."""
        starts, rows = self._by_zone().get(zone, ([], []))
        i = bisect.bisect_right(starts, at_s) - 1
        if i < 0 or not rows[i].start_s <= at_s < rows[i].end_s:
            return 0
        return min(rows[i].available, self.pool_size)

    def lowest(self, zone: str, from_s: float, to_s: float) -> int:
        """The least `zone` could give at any time in [from_s, to_s]."""
        starts, rows = self._by_zone().get(zone, ([], []))
        if not rows:
            return 0
        lowest = self.available(zone, from_s)
        i = bisect.bisect_right(starts, from_s)
        while i < len(rows) and rows[i].start_s <= to_s:
            lowest = min(lowest, rows[i].available, self.pool_size)
            i += 1
        if to_s >= rows[-1].end_s:  # past the trace's end: nothing
            lowest = 0
        return lowest

    def _by_zone(self) -> dict[str, tuple[list[float], list[CapacityRow]]]:
        """Each zone's rows in time order, and their starts (a replay asks every few
        simulated seconds, of traces with thousands of rows)."""
        if self._index is None:
            index: dict[str, tuple[list[float], list[CapacityRow]]] = {}
            for row in sorted(self.capacity, key=lambda r: (r.zone, r.start_s)):
                starts, rows = index.setdefault(row.zone, ([], []))
                starts.append(row.start_s)
                rows.append(row)
            self._index = index
        return self._index


def check_trace(trace: SpotTrace) -> SpotTrace:
    """The checks a row's neighbours decide: in each zone, rows in time order, each one
    starting where the last ended (the first at 0), none empty or backwards, all zones as
    long as each other; preemptions inside the trace and in a zone it has."""
    last_end: dict[str, tuple[int, float]] = {}
    for index, row in enumerate(trace.capacity):
        where = f"capacity[{index}]"
        if row.start_s < 0:
            raise SpecError(where, f"start_s {row.start_s:g} is negative")
        if row.end_s <= row.start_s:
            raise SpecError(
                where, f"ends at {row.end_s:g} s, not after it starts ({row.start_s:g} s)"
            )
        if row.available > trace.pool_size:
            raise SpecError(
                where, f"available {row.available} is more than pool_size {trace.pool_size}"
            )
        before = last_end.get(row.zone)
        expected = 0.0 if before is None else before[1]
        if row.start_s < expected:
            raise SpecError(
                where,
                f"starts at {row.start_s:g} s, inside capacity[{before[0]}] of {row.zone} "  # type: ignore[index]
                f"(which ends at {expected:g} s): intervals overlap",
            )
        if row.start_s > expected:
            raise SpecError(
                where,
                f"starts at {row.start_s:g} s, leaving {row.zone}'s capacity unknown from "
                f"{expected:g} s",
            )
        last_end[row.zone] = (index, row.end_s)
    ends = {zone: end for zone, (_, end) in last_end.items()}
    if len(set(ends.values())) > 1:
        short = min(ends, key=lambda z: ends[z])
        raise SpecError(
            "capacity",
            f"zone {short} ends at {ends[short]:g} s, the trace at {max(ends.values()):g} s: "
            "every zone covers the whole trace",
        )
    for index, hit in enumerate(trace.preemptions):
        where = f"preemptions[{index}]"
        if hit.zone not in ends:
            raise SpecError(where, f"zone {hit.zone!r} has no capacity rows")
        if hit.at_s >= ends[hit.zone]:
            raise SpecError(where, f"at_s {hit.at_s:g} is past the trace's end")
    return trace


def parse_trace(data: Any, *, origin: str = "trace") -> SpotTrace:
    """A trace from decoded JSON, checked; SpecError (one line, naming the row) if not."""
    if not isinstance(data, dict):
        raise SpecError(origin, "is not a trace: a JSON object with name, capacity, prices")
    try:
        trace = SpotTrace.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(
            f"[{p}]" if isinstance(p, int) else str(p) for p in error.get("loc", ())
        ).replace(".[", "[")
        message = str(error.get("msg", exc)).removeprefix("Value error, ")
        if error.get("type") == "missing":
            message = "is required" + (
                ": spot and on-demand USD per hour, and their source" if where == "prices" else ""
            )
        raise SpecError(where or origin, message) from None
    return check_trace(trace)


def load_trace(path: str | Path) -> SpotTrace:
    """A trace file, checked: one SpecError naming the file or the row on bad input."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SpecError("trace", f"cannot read {path}: {exc.strerror or exc}") from None
    if size > MAX_TRACE_BYTES:
        raise SpecError("trace", f"{path} is {size} bytes; a trace is at most {MAX_TRACE_BYTES}")
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        raise SpecError("trace", f"{path} is not JSON ({type(exc).__name__})") from None
    except RecursionError:
        raise SpecError("trace", f"{path} is nested too deeply to be a trace") from None
    try:
        return parse_trace(data, origin=str(path))
    except SpecError as exc:
        if exc.field == str(path):
            raise
        raise SpecError(str(path), str(exc)) from None  # the file, then its row
