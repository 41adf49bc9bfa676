"""Jobs in Jupyter: logs in one updating output area, and HTML views of a job.

In a notebook, `fit(logs=True)` used to print each log line as its own output block: a
long job made thousands of blocks. `NotebookLogPrinter` keeps one display area per call and
updates it in place (at most every UPDATE_SECONDS) with the latest lines of every node; all
lines stay in the store (`job.logs()`, `trainctl logs`).

`job_html(info, points)` is a job's rich repr: state, attempts, cost, latest metrics and a
small chart per metric (inline SVG: nothing is fetched).
"""

from __future__ import annotations

import html
import time
from collections import deque
from typing import Any

UPDATE_SECONDS = 0.5
TAIL_LINES = 40
STATE_COLOURS = {"Completed": "#1a7f37", "Failed": "#cf222e", "Stopped": "#9a6700"}


class NotebookLogPrinter:
    """LogPrinter's interface, drawing into one display area that is updated in place."""

    def __init__(self, tail: int = TAIL_LINES) -> None:
        from IPython.display import display

        self.lines: deque[str] = deque(maxlen=tail)
        self.count = 0
        self._dirty = False
        self._last = 0.0
        self.handle = display(self._bundle(), raw=True, display_id=True)

    def node_line(
        self, rank: int, line: str, *, attempt: int | None = None, stamp: str | None = None
    ) -> None:
        label = f"algo-{rank + 1}" if attempt in (None, 1) else f"algo-{rank + 1}#{attempt}"
        self._add(("" if stamp is None else f"{stamp} ") + f"[{label}] {line}")

    def info(self, message: str) -> None:
        self._add(f"[trainctl] {message}")

    def _add(self, text: str) -> None:
        self.lines.append(text)
        self.count += 1
        self._dirty = True
        if time.monotonic() - self._last >= UPDATE_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self._dirty and self.handle is not None:
            self.handle.update(self._bundle(), raw=True)
            self._dirty = False
        self._last = time.monotonic()

    def _bundle(self) -> dict[str, str]:
        hidden = self.count - len(self.lines)
        head = f"... {hidden} earlier line(s): job.logs() has them all\n" if hidden > 0 else ""
        text = head + "\n".join(self.lines)
        return {
            "text/plain": text,
            "text/html": "<pre style='max-height:24em;overflow:auto;font-size:12px'>"
            + html.escape(text)
            + "</pre>",
        }


def log_printer(stream: Any = None) -> Any:
    """The printer for `fit(logs=True)` and `wait(logs=True)`: one updating area in a
    notebook, lines on `stream` (stdout) anywhere else."""
    import sys

    from trainctl.progress import in_notebook

    if stream in (None, sys.stdout) and in_notebook():
        return NotebookLogPrinter()
    from trainctl.controller.logs import LogPrinter

    return LogPrinter(stream or sys.stdout)


def svg_chart(values: list[float], width: int = 240, height: int = 60) -> str:
    """A small inline SVG line chart of `values`."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    coords = " ".join(
        f"{i * step:.1f},{height - 4 - (v - low) / span * (height - 8):.1f}"
        for i, v in enumerate(values)
    )
    return (
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}'>"
        f"<polyline fill='none' stroke='#0969da' stroke-width='1.5' points='{coords}'/></svg>"
    )


def job_html(info: dict[str, Any], points: list[dict[str, Any]]) -> str:
    """A job's HTML view (describe() and its metric history)."""
    from trainctl.metrics import latest, series

    esc = html.escape
    state = info["state"]
    colour = STATE_COLOURS.get(state, "#0969da")
    from trainctl.record.costs import cost_text

    rows = [
        ("state", f"<b style='color:{colour}'>{esc(state)}</b>"),
        ("instances", esc(f"{info['instance_count']} x {info['instance_type']}")),
        ("duration", esc("-" if info["duration_s"] is None else f"{info['duration_s']:.1f} s")),
        ("model", esc(info.get("model_data") or "-")),
    ]
    rows.append(("cost", esc(cost_text(info.get("cost")))))
    if goodput := info.get("goodput"):
        from trainctl.record.goodput import bars_html

        rows.append(("goodput", esc(goodput["text"]) + bars_html(goodput)))
    if info.get("progress"):
        from trainctl.record.models import progress_text

        rows.append(("progress", esc(progress_text(info["progress"]))))
    if info.get("waiting") and state in ("Pending", "Provisioning"):
        rows.append(("waiting", esc(info["waiting"])))
    if info.get("failure_reason"):
        rows.append(("failure", esc(info["failure_reason"])))
    if info.get("attempts"):
        current = info["attempts"][-1]
        if len(by_node := current.get("restored_by_node") or {}) > 1:
            rows.append(("restored", esc(" · ".join(f"{k}: {v}" for k, v in by_node.items()))))
        if split := (current.get("restored") or {}).get("split"):
            rows.append(("split resume", f"<b style='color:#cf222e'>{esc(split)}</b>"))
    last = latest(points)
    if last:
        rows.append(
            ("metrics", esc(", ".join(f"{k}={p['value']:g}" for k, p in sorted(last.items()))))
        )
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{k}</th><td style='text-align:left'>"
        f"{v}</td></tr>"
        for k, v in rows
    )
    attempts = "".join(
        "<tr>"
        + "".join(
            f"<td>{esc(str(a.get(key) if a.get(key) is not None else '-'))}</td>"
            for key in ("number", "outcome", "started_from", "last_step", "steps_lost")
        )
        + f"<td>{len(a.get('nodes') or []) or '-'}</td>"
        + f"<td style='text-align:left'>{esc(_attempt_cause(a))}</td></tr>"
        for a in info.get("attempts", [])
    )
    attempts_table = (
        "<table><tr><th>#</th><th>outcome</th><th>started from</th><th>last step</th>"
        f"<th>steps lost</th><th>nodes</th><th>cause</th></tr>{attempts}</table>"
        if attempts
        else ""
    )
    charts = "".join(
        f"<div style='display:inline-block;margin-right:1em'><div>{esc(name)}</div>"
        f"{svg_chart([p['value'] for p in series(points, name)])}</div>"
        for name in sorted(last)
    )
    return (
        f"<div class='trainctl-job'><h4 style='margin:0'>{esc(info['name'])}</h4>"
        f"<table>{body}</table>{attempts_table}{charts}</div>"
    )


def _attempt_cause(attempt: dict[str, Any]) -> str:
    """How the attempt began (an elastic job's size change) and how it ended."""
    return "; ".join(t for t in (attempt.get("resized"), attempt.get("cause")) if t) or "-"
