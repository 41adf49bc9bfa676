"""Goodput: the share of a job's paid node-time that made training progress, and where the
rest (badput) went, by cause, in node-hours and in money.

The categories follow Google's ml-goodput-measurement (program start-up, data loading,
checkpoint saves and restores, progress lost to disruptions) and NVIDIA's lost work time,
measured from what the controller and the nodes already report for each attempt, in the
order time meets them: a wait for capacity (no node paid for yet), provisioning (paid from
here), setup (ssh, agent, image, code, environment) and restoring state, process start-up
(launch to the first step), training (the first step to the last), and after the last step
(uploads, teardown, or the interruption that ended it) to the attempt's end.

Inside training: the loop held by checkpoint saves (Checkpointer), waiting for data (where
the script's loader goes through trainctl.train.batches), and the steps a later attempt
trained again (steps_lost, at the attempt's own pace); what is left is productive. An
attempt that never reached a step spent all its node-time from its nodes to its end on
getting there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from trainctl.record.keys import TO_FIRST_STEP, parse_iso

if TYPE_CHECKING:
    from trainctl.record.models import Attempt, JobRecord

# Causes in the order time meets them; "training" is the goodput. "waiting" is not paid.
CAUSES: dict[str, str] = {
    "waiting": "waiting for capacity (unpaid)",
    "provisioning": "provisioning",
    "setup": "image, code and environment",
    "restore": "restoring state",
    "startup": "process start-up",
    "data": "data loading",
    "checkpoint": "checkpoint stalls",
    "redone": "steps redone after a loss",
    "after": "after the last step (upload, teardown, interruption)",
    "training": "training (goodput)",
}
PAID = [c for c in CAUSES if c != "waiting"]


class Share(BaseModel):
    """Node-time of one cause: node-hours, and dollars where the capacity has a price."""

    model_config = ConfigDict(extra="forbid")

    node_hours: float
    usd: float | None = None


class AttemptGoodput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int
    nodes: int
    paid_node_hours: float
    goodput: float | None  # training's share of the paid node-time (None: nothing paid)
    causes: dict[str, Share]


class Goodput(BaseModel):
    """A job's (or a tuning run's) goodput and badput by cause, over its attempts."""

    model_config = ConfigDict(extra="forbid")

    paid_node_hours: float
    goodput: float | None
    usd: float | None  # the paid node-time at each attempt's price (None: unpriced)
    causes: dict[str, Share]
    attempts: list[AttemptGoodput]


def goodput_text(data: dict[str, Any]) -> str:
    """A job's goodput (`rounded`) in words, for `status`, the notebook and the dashboard:
    '62 % of 1.2 node-h paid, $3.10; badput: restoring state 3 %, ...; 0.1 node-h waiting
    for capacity (unpaid)'."""
    paid = data["paid_node_hours"]
    if data["goodput"] is None or paid <= 0:
        return "no node-time paid yet"
    money = f", ${data['usd']:,.2f}" if data.get("usd") is not None else ""
    causes = data["causes"]
    parts = [
        f"{CAUSES[c].split(' (')[0]} {100 * causes[c]['node_hours'] / paid:.0f} %"
        for c in PAID
        if c != "training" and causes[c]["node_hours"] >= 0.005 * paid
    ]
    text = f"{100 * data['goodput']:.0f} % of {_hours(paid)} paid{money}"
    if parts:
        text += "; badput: " + ", ".join(parts)
    if (waited := causes["waiting"]["node_hours"]) > 0:
        text += f"; {_hours(waited)} waiting for capacity (unpaid)"
    return text


# A bar's colours, one per cause (training green; the rest warm to cool as time meets them).
COLOURS = {
    "waiting": "#d0d7de",
    "provisioning": "#8c959f",
    "setup": "#bf8700",
    "restore": "#fb8f44",
    "startup": "#e16f24",
    "data": "#8250df",
    "checkpoint": "#0969da",
    "redone": "#cf222e",
    "after": "#6e7781",
    "training": "#1a7f37",
}


def bars_html(data: dict[str, Any]) -> str:
    """A bar per attempt, its paid node-time split by cause (widths to the largest attempt),
    for the notebook's view; each segment's title says the cause and its node-hours."""
    import html

    widest = max((a["paid_node_hours"] for a in data["attempts"]), default=0.0)
    if widest <= 0:
        return ""
    rows = []
    for a in data["attempts"]:
        segments = "".join(
            f"<span title='{html.escape(data['legend'][c]['label'])}: {s['node_hours']:.4f} "
            f"node-h' style='display:inline-block;height:12px;background:"
            f"{data['legend'][c]['colour']};width:"
            f"{100 * s['node_hours'] / widest:.2f}%'></span>"
            for c, s in a["causes"].items()
            if c != "waiting" and s["node_hours"] > 0
        )
        share = "-" if a["goodput"] is None else f"{100 * a['goodput']:.0f} %"
        rows.append(
            f"<div style='display:flex;align-items:center;gap:6px'><span style='width:5em'>"
            f"attempt {a['attempt']}</span><span style='flex:1;display:flex'>{segments}</span>"
            f"<span style='width:3.5em;text-align:right'>{share}</span></div>"
        )
    legend = " ".join(
        f"<span style='color:{v['colour']}'>&#9632;</span> {html.escape(v['label'])}"
        for c, v in data["legend"].items()
        if c != "waiting"
    )
    return "".join(rows) + f"<div style='font-size:11px'>{legend}</div>"


def _hours(node_hours: float) -> str:
    return f"{node_hours:.3g} node-h" if node_hours < 10 else f"{node_hours:,.1f} node-h"


def attempt_seconds(attempt: Attempt, now: float) -> dict[str, float]:
    """Seconds of each cause in one attempt, per node (multiply by its nodes)."""
    started = parse_iso(attempt.started_at)
    ended = parse_iso(attempt.ended_at) if attempt.ended_at else max(now, started)
    startup = attempt.startup or {}
    requested = parse_iso(attempt.requested_at) if attempt.requested_at else None
    if requested is None:  # a record from before the field: its capacity stage says
        requested = started - startup.get("capacity", 0.0)
    waited = min(attempt.waited_seconds or 0.0, max(0.0, started - requested))
    out = dict.fromkeys(CAUSES, 0.0)
    out["waiting"] = waited
    out["provisioning"] = max(0.0, started - requested - waited)
    restore = attempt.restored.seconds if attempt.restored else 0.0
    if TO_FIRST_STEP not in startup:  # it never trained: all of it went to getting there
        spent = max(0.0, ended - started)
        out["restore"] = min(restore, spent)
        out["setup"] = spent - out["restore"]
        return out
    first = min(max(requested + startup[TO_FIRST_STEP], started), ended)
    launched = min(max(first - startup.get("launch", 0.0), started), first)
    out["restore"] = min(restore, launched - started)
    out["setup"] = launched - started - out["restore"]
    out["startup"] = first - launched
    last = parse_iso(attempt.last_step_at) if attempt.last_step_at else first
    last = min(max(last, first), ended)
    out["after"] = ended - last
    span = last - first
    done = (attempt.last_step or 0) - (attempt.resumed_from_step or 0)
    redone = span * min(1.0, (attempt.steps_lost or 0) / done) if done > 0 else 0.0
    # Each carved out of the training span in turn, never more than is left of it.
    for cause, seconds in (
        ("checkpoint", attempt.checkpoint_stall_seconds or 0.0),
        ("data", attempt.data_wait_seconds or 0.0),
        ("redone", redone),
    ):
        out[cause] = min(max(0.0, seconds), span)
        span -= out[cause]
    out["training"] = span
    return out


def attempt_price(record: JobRecord, number: int) -> float | None:
    """Dollars a node-hour for `number`'s capacity (its instances' billed average)."""
    priced = [i for i in record.instances if i.attempt == number and i.usd is not None]
    seconds = sum(i.seconds for i in priced)
    if not priced or seconds <= 0:
        return None
    return sum(i.usd or 0.0 for i in priced) / (seconds / 3600)


def goodput(record: JobRecord, now: float | None = None) -> Goodput | None:
    """The job's goodput over its attempts so far (None before its first attempt)."""
    from trainctl.clock import clock

    if not record.attempts:
        return None
    now = clock().time() if now is None else now
    return combine([_attempt(record, a, now) for a in record.attempts])


def _attempt(record: JobRecord, attempt: Attempt, now: float) -> AttemptGoodput:
    nodes = max(1, len(attempt.nodes))
    price = attempt_price(record, attempt.number)
    causes = {
        cause: Share(
            node_hours=seconds * nodes / 3600,
            usd=None if price is None or cause == "waiting" else seconds * nodes / 3600 * price,
        )
        for cause, seconds in attempt_seconds(attempt, now).items()
    }
    paid = sum(causes[c].node_hours for c in PAID)
    return AttemptGoodput(
        attempt=attempt.number,
        nodes=nodes,
        paid_node_hours=paid,
        goodput=causes["training"].node_hours / paid if paid > 0 else None,
        causes=causes,
    )


def combine(attempts: list[AttemptGoodput]) -> Goodput:
    """Attempts (of one job, or of a tuning run's trials) summed."""
    causes: dict[str, Share] = {}
    for cause in CAUSES:
        shares = [a.causes[cause] for a in attempts]
        priced = [s.usd for s in shares if s.usd is not None]
        causes[cause] = Share(
            node_hours=sum(s.node_hours for s in shares),
            usd=sum(priced) if priced and len(priced) == len(shares) else None,
        )
    paid = sum(causes[c].node_hours for c in PAID)
    paid_usd = [causes[c].usd for c in PAID]
    return Goodput(
        paid_node_hours=paid,
        goodput=causes["training"].node_hours / paid if paid > 0 else None,
        usd=None if any(u is None for u in paid_usd) else sum(u or 0.0 for u in paid_usd),
        causes=causes,
        attempts=attempts,
    )


def of_jobs(records: list[JobRecord]) -> dict[str, Any] | None:
    """Several jobs' goodput together (a tuning run's trials), as JSON data: the causes
    summed over every attempt of every job, and each job's share ("jobs")."""
    each = [(r.name, g) for r in records if (g := goodput(r)) is not None]
    if not each:
        return None
    out = rounded(combine([a for _, g in each for a in g.attempts]))
    del out["attempts"]
    out["jobs"] = [
        {
            "job": name,
            "paid_node_hours": round(g.paid_node_hours, 6),
            "goodput": None if g.goodput is None else round(g.goodput, 4),
        }
        for name, g in each
    ]
    return out


def rounded(value: Goodput) -> dict[str, Any]:
    """As JSON for `status -o json` and describe(): node-hours to 6 places, shares to 4."""

    def share(s: Share) -> dict[str, Any]:
        return {
            "node_hours": round(s.node_hours, 6),
            "usd": None if s.usd is None else round(s.usd, 4),
        }

    out = {
        "paid_node_hours": round(value.paid_node_hours, 6),
        "goodput": None if value.goodput is None else round(value.goodput, 4),
        "usd": None if value.usd is None else round(value.usd, 4),
        "causes": {c: share(s) for c, s in value.causes.items()},
        "attempts": [
            {
                "attempt": a.attempt,
                "nodes": a.nodes,
                "paid_node_hours": round(a.paid_node_hours, 6),
                "goodput": None if a.goodput is None else round(a.goodput, 4),
                "causes": {c: share(s) for c, s in a.causes.items()},
            }
            for a in value.attempts
        ],
    }
    # (the words and colours with the figures: the dashboard draws the same bars)
    legend = {c: {"label": label, "colour": COLOURS[c]} for c, label in CAUSES.items()}
    return {**out, "text": goodput_text(out), "legend": legend}
