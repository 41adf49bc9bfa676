"""A job's progress and metrics as its controller sees them: steps counted per attempt,
metric values from the nodes' step messages and from log lines that match the job's
metric_definitions, the latest in the record and every one (thinned past a cap) in the
metric history, saved to the store only when something moved."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trainctl.controller.attempts import count_step
from trainctl.errors import StoreError
from trainctl.metrics import MetricRecorder, numeric_metrics
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import now_iso, parse_iso
from trainctl.record.models import TO_FIRST_STEP, Attempt, JobRecord, add_warning

# Step messages that carry a step number (and may carry metric values).
PROGRESS_EVENTS = ("step", "checkpoint", "preempted")


class Telemetry:
    """Progress and metrics of one job's record."""

    def __init__(self, jobs: JobStore, record: JobRecord, info: Callable[[str], None]) -> None:
        self.jobs = jobs
        self.record = record
        self.info = info
        self._patterns = [(m.Name, re.compile(m.Regex)) for m in record.spec.metric_definitions]
        self._recorder = MetricRecorder()  # values not yet in the store
        self._saved: tuple[str, tuple[tuple[str, float], ...]] | None = None
        self._unsaved = False  # a save failed (the store away): said once, and when it ends
        # What may have moved the progress: the nodes' lines (the watch counts them) and the
        # values recorded here; and that count when save_progress last compared.
        self.changes = 0
        self._changes_looked = -1
        self._totals_said: set[str] = set()  # how a reported total was odd (said once each)

    def metric(
        self,
        name: str,
        value: float,
        rank: int,
        step: int | None = None,
        attempt: Attempt | None = None,
    ) -> None:
        """A metric value of `attempt` (default: the current one): every value in the
        history, and the latest in the record unless it is an earlier attempt's line still
        draining."""
        self.changes += 1
        current = self.record.attempts[-1] if self.record.attempts else None
        attempt = attempt or current
        if step is None and attempt is not None:
            step = attempt.last_step
        if attempt is current:
            self.record.metrics[name] = value
        self._recorder.add(
            name, value, step=step, attempt=attempt.number if attempt else 0, rank=rank
        )

    def progress_message(self, attempt: Attempt, rank: int, msg: dict[str, Any]) -> bool:
        """A step/checkpoint/preempted message: its step counted and its metric values
        recorded for `attempt`. False if the message is not one."""
        step = msg.get("step")
        if msg.get("event") not in PROGRESS_EVENTS or not isinstance(step, int):
            return False
        self.changes += 1
        if msg["event"] == "step" or step > (attempt.last_step or -1):
            attempt.last_step_at = now_iso()  # (a save or a stop at a step reached earlier: not)
        count_step(attempt, msg["event"], step)
        total = msg.get("total_steps")
        if isinstance(total, int) and not isinstance(total, bool) and total >= 1:
            self.reported_total(total, step)
        for name, value in numeric_metrics(msg.get("metrics")).items():
            self.metric(name, value, rank, step=step, attempt=attempt)
        return True

    def reported_total(self, total: int, step: int) -> None:
        """The script's `report_step(total_steps=N)`: the job's work, for `status` and the deadline
        policy alike. A total that changes (a script that counts what is left of a resumed
        epoch as its length, say) or that is below a step already reached is said once, and
        the larger total is believed: work once known does not go away."""
        known = self.record.total_steps_reported
        reached = max([a.last_step or 0 for a in self.record.attempts] + [step])
        if known is not None and total != known and "changed" not in self._totals_said:
            self._totals_said.add("changed")
            self._say_total(total, known, reached, f"the script's total went from {known} to "
                            f"{total} steps; {max(total, known)} is kept")  # fmt: skip
        if total < reached and "below" not in self._totals_said:
            self._totals_said.add("below")
            self._say_total(total, known, reached, f"the script's total of {total} steps is "
                            f"below step {reached}, already reached")  # fmt: skip
        self.record.total_steps_reported = max(total, known or 0)

    def _say_total(self, total: int, known: int | None, reached: int, text: str) -> None:
        self.jobs.event("total_changed", reported=total, kept=max(total, known or 0),
                        reached=reached)  # fmt: skip
        text += " (a total counted from a resumed epoch's rest?)"
        add_warning(self.record, text)
        self.info(f"warning: {text}")

    def log_line(self, rank: int, line: str) -> None:
        """The metric values a node's log line gives by the job's metric_definitions."""
        for metric, pattern in self._patterns:
            if (m := pattern.search(line)) is not None:
                try:
                    value = float(m.group(1))
                except (TypeError, ValueError, IndexError):
                    continue
                self.metric(metric, value, rank)

    def save_metric_points(self, *, prompt: bool = False) -> bool:
        """The metric points seen since the last save, to the store; False if the store
        refused them (they are kept for the next save)."""
        points = self._recorder.take()
        try:
            self.jobs.save_metric_points(points, prompt=prompt)
        except Exception as exc:  # a metric flush must not end the job
            self._recorder.put_back(points)
            if not self._unsaved:
                self.info(f"could not save metrics (tried again at each save): {exc}")
            self._unsaved = True
            return False
        return True

    def save_progress(self, *, prompt: bool = True) -> None:
        """Save the record if steps or metrics moved since the last save (a store PUT each),
        and the metric points seen since. Made every few seconds from the controller's watch
        loop, so with the prompt store (Store.prompt): in a store outage a save fails in a
        second and the next one tries again, instead of holding the loop (and what it
        watches: lost nodes, due faults, stops) in the store's long backoff. `prompt=False`:
        the last save of this controller (a hand-off), which waits for the store.

        Progress comes in the nodes' lines: with none heard since the last look (`changes`),
        nothing is compared (the attempt's JSON, to see whether it moved, was a fifth of a
        spot replay's CPU, where lines come every few minutes of simulated time)."""
        saved = self.save_metric_points(prompt=prompt)
        looked = self.changes == self._changes_looked and prompt
        if not looked and not self._save_if_moved(prompt):
            return
        if saved and self._unsaved:
            self.info("the job's progress is saved again")
            self._unsaved = False

    def _save_if_moved(self, prompt: bool) -> bool:
        """The record saved if its progress moved since the last save; False if the store
        refused it (said once; the next save tries again)."""
        changes = self.changes
        progress = (
            self.record.attempts[-1].model_dump_json(),
            tuple(self.record.metrics.items()),
            self.record.total_steps_reported,
        )
        if progress != self._saved:
            try:
                self.jobs.save(self.record, prompt=prompt)
            except StoreError as exc:
                if not self._unsaved:
                    self.info(f"could not save the job's progress (tried again each save): {exc}")
                self._unsaved = True
                return False
            self._saved = progress
        self._changes_looked = changes
        return True


def startup_stages(
    controller: dict[str, float],
    nodes: list[dict[str, float]],
    *,
    launched: float,
    first_step: float,
    attempt_started: float,
) -> dict[str, float]:
    """Where an attempt's start-up went, seconds per stage: the controller's (capacity),
    each node's slowest (ssh, agent, image from the provider; code, venv from the agent),
    launch (every node launched -> the first step; a quick node's first step can come before
    a slow node says it launched) and all of it (to_first_step)."""
    stages = dict(controller)
    for node in nodes:
        for name, seconds in node.items():
            stages[name] = max(stages.get(name, 0.0), float(seconds))
    stages["launch"] = max(0.0, first_step - launched)
    stages[TO_FIRST_STEP] = first_step - attempt_started
    return {k: round(v, 3) for k, v in stages.items()}


# A relaunch's stages, in the order they come (Attempt.recovery; bench/recovery.py's too).
RECOVERY_STAGES = ("attempt_ended", "capacity", "nodes_started", "state_restored", "first_step")


def recovery_stages(previous: Attempt, attempt: Attempt, **walls: float | None) -> dict[str, float]:
    """Seconds from what interrupted `previous` (its interrupted_at) to each stage of the
    relaunch `attempt`: the attempt ended, the new one had its nodes, every node launched
    the script (`nodes_started`), the script said it resumed (`state_restored`), its first
    step; `walls`: those moments of the new attempt the record does not hold (epoch
    seconds, None: not seen)."""
    if previous.interrupted_at is None or previous.ended_at is None:
        return {}
    since = parse_iso(previous.interrupted_at)
    moments = {
        "attempt_ended": parse_iso(previous.ended_at),
        "capacity": parse_iso(attempt.started_at),
        **walls,
    }
    return {
        stage: round(max(0.0, moments[stage] - since), 3)
        for stage in RECOVERY_STAGES
        if moments.get(stage) is not None
    }
