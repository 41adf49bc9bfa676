"""A job's metric history: every value with its step, attempt, node and wall time.

Where values come from (the controller records both):
- `report_step(step, loss=..., acc=...)` in `trainctl.train`: a `step` control message with
  `metrics`;
- `metric_definitions` regexes over node log lines (SageMaker's semantics: the first group
  of each match), stamped with the attempt's latest reported step, if any.

Storage: `jobs/<job>/metrics/<epoch ms>-<pid>.jsonl` parts, one written every couple of
seconds while values arrive. Parts, not one growing object: S3 has no append, so one object
would be re-read and re-written each time (O(n^2) over a job); parts are written once and a
reader lists and concatenates them (readable while the job runs, from any machine). JSON
lines, not parquet: no dependency on the node or in the client, and a part is small.

Bounded: per metric and attempt, the first CAP values are all kept; past that only every
2nd, then every 4th, ... (the stride doubles each time another CAP values are kept). n
values keep about CAP x log2(n / CAP + 1), evenly spread over the run: with CAP = 10,000,
a million values keep ~66,000 and a billion ~166,000. Once MAX_DOUBLINGS doublings are
used up, a metric's history in that attempt stops growing (its latest value still shows
in the record).

Across relaunches the curve continues: a resumed attempt's steps follow on from its
checkpoint. Values of steps that were lost (reached by an attempt, then redone by the next
from an earlier checkpoint) are kept and marked `redone`, never shown twice as current.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl.clock import clock

CAP = 10_000  # values of one metric in one attempt before thinning starts
MAX_DOUBLINGS = 20  # then the history stops growing: at most CAP x 21 values
SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class _Thinning:
    seen: int = 0
    kept: int = 0
    stride: int = 1


@dataclass
class MetricRecorder:
    """The controller's side: values in, bounded points out (flushed to the store)."""

    cap: int = CAP
    pending: list[dict[str, Any]] = field(default_factory=list)
    _thin: dict[tuple[str, int], _Thinning] = field(default_factory=dict)

    def add(self, name: str, value: float, *, step: int | None, attempt: int, rank: int) -> bool:
        """Record one value; False when thinning dropped it."""
        thin = self._thin.setdefault((name, attempt), _Thinning())
        thin.seen += 1
        if (thin.seen - 1) % thin.stride or thin.kept >= self.cap * (MAX_DOUBLINGS + 1):
            return False
        thin.kept += 1
        if thin.kept % self.cap == 0:
            thin.stride *= 2
        self.pending.append(
            {
                "time": round(clock().time(), 3),
                "name": name,
                "value": value,
                "step": step,
                "attempt": attempt,
                "rank": rank,
            }
        )
        return True

    def take(self) -> list[dict[str, Any]]:
        points, self.pending = self.pending, []
        return points

    def put_back(self, points: list[dict[str, Any]]) -> None:
        """Points `take` gave that the store refused: first in line for the next take."""
        self.pending[:0] = points


def numeric_metrics(raw: Any) -> dict[str, float]:
    """The numeric values of a step message's `metrics` (others are ignored)."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue  # NaN/inf do not plot; a diverged loss shows in the logs
        out[str(name)[:128]] = float(value)
    return out


def mark_redone(points: list[dict[str, Any]], resumed_from: dict[int, int | None]) -> None:
    """Mark values of steps a later attempt redid: attempt a's value at step s is redone
    if some later attempt resumed from a checkpoint before s. `resumed_from`: attempt ->
    the step it resumed from (None: unknown or not resumed)."""
    for point in points:
        step, attempt = point.get("step"), point.get("attempt")
        if step is None or attempt is None:
            point["redone"] = False
            continue
        point["redone"] = any(
            later > attempt and start is not None and start < step
            for later, start in resumed_from.items()
        )


def latest(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> its latest current (not redone) point, in time order."""
    out: dict[str, dict[str, Any]] = {}
    for point in points:
        if not point.get("redone"):
            out[point["name"]] = point
    return out


def series(points: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The current curve of one metric: not redone, in time order."""
    return [p for p in points if p["name"] == name and not p.get("redone")]


def sparkline(values: list[float], width: int = 24) -> str:
    """A one-line chart of the last `width` values (after even thinning of the rest)."""
    if not values:
        return ""
    if len(values) > width:
        stride = len(values) / width
        values = [values[int(i * stride)] for i in range(width - 1)] + [values[-1]]
    low, high = min(values), max(values)
    span = high - low
    if span == 0:
        return SPARK[3] * len(values)
    return "".join(SPARK[min(7, int((v - low) / span * 7.999))] for v in values)


def terminal_chart(
    points: list[dict[str, Any]],
    name: str,
    *,
    width: int = 80,
    height: int = 16,
    colour: bool = False,
) -> str:
    """A terminal chart (plotext) of one metric's current curve: x is the step (or the
    value's index when no step was reported), one line per attempt, so a relaunch shows
    where the next attempt picked the curve up."""
    import plotext as plt

    curve = series(points, name)
    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    attempts = sorted({p.get("attempt") or 0 for p in curve})
    legend = []
    for attempt in attempts:
        mine = [p for p in curve if (p.get("attempt") or 0) == attempt]
        xs = [p["step"] if p.get("step") is not None else index for index, p in enumerate(mine)]
        plt.plot(xs, [p["value"] for p in mine], label=f"attempt {attempt}")
        if attempt != attempts[0] and xs:
            plt.vline(xs[0])
        legend.append(f"attempt {attempt}: steps {xs[0]}-{xs[-1]}" if xs else f"attempt {attempt}")
    last = curve[-1] if curve else None
    title = name if last is None else f"{name}: {last['value']:g}"
    if last is not None and last.get("step") is not None:
        title += f" at step {last['step']}"
    plt.title(title)
    text = plt.build()
    text = text if colour else plt.uncolorize(text)
    # plotext's own legend sits in the plot's top-left corner, where a loss curve starts and
    # where an early relaunch's line crosses it: the attempts' steps go below the chart too.
    return text.rstrip("\n") + "\n    " + " · ".join(legend) + "\n"
