"""Following a node through the store alone: how a controller that did not start a node (one
that took the job over from a dead controller) adopts it.

Every agent keeps three objects of its own in the store, whoever its controller is: its log
(shipped every `log_sync_seconds`), its status (progress when it changes, and a heartbeat
a third of `heartbeat_timeout_seconds` apart: Settings.status_seconds) and, at the end, its
result, written after the log's last lines. `StoreFollower.lines()` turns them back into
what the agent would have said on its pipe:
the log's lines in order, each exactly once, the progress as control messages, the result
last. A node whose status stops changing for `lost_after` seconds is lost (EXIT_INFRA); the
time the store refused the follower's own reads (S3 throttling the job's prefix refuses the
node's writes too) is not counted as the node's silence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainctl.errors import NotFoundError, StoreError
from trainctl.protocol import EXIT_INFRA, message
from trainctl.record.keys import JobKeys
from trainctl.store import Store
from trainctl.transport import RunningProcess

# Status fields, each standing for the control message of the same name: flags once set,
# steps whenever they change.
_FLAGS = ("launched", "idle", "notice", "uploading")
_STEPS = ("resumed", "step", "checkpoint")


class StoreFollower(RunningProcess):
    """A node's agent, followed through its objects in the store (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        job: str,
        attempt: int,
        rank: int,
        *,
        lost_after: float,
        poll_interval: float = 0.5,
        kill: Callable[[], None] | None = None,
        notify: Callable[[], None] | None = None,
        log_offset: int = 0,
        lost: str | None = None,
    ) -> None:
        """`log_offset`: where in the node's log to start (what was already shown); `lost`:
        why the controller before had counted the node lost (then it is, unless its result
        is there: no wait for its silence)."""
        self.store = store
        self.log_offset = log_offset
        self.keys = JobKeys(job)
        self.attempt = attempt
        self.rank = rank
        self.lost_after = lost_after
        self.poll_interval = poll_interval
        self._kill = kill
        self._notify = notify
        self._code: int | None = None
        self._adopted_at = time.time()
        self._lost = lost
        self.beats_after_adoption = 0  # heartbeats seen after the first look: it was alive
        # When the store last refused this follower a read: the node's writes were likely
        # refused too (S3's SlowDown is per prefix), so its silence counts from then.
        self._store_refused_at = 0.0

    # -- what the store says ---------------------------------------------------------------
    def _json(self, key: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.store.get_text(key)))
        except NotFoundError:
            return None  # not there yet
        except StoreError:  # unreadable now (S3 throttling the job, an outage): next poll
            self._store_refused_at = time.time()
            return None
        except ValueError:
            return None

    def status(self) -> dict[str, Any] | None:
        return self._json(self.keys.node_status(self.attempt, self.rank))

    def result(self) -> dict[str, Any] | None:
        return self._json(self.keys.node_result(self.attempt, self.rank))

    def state(self) -> str:
        """'done' (a result is recorded), 'alive' (a fresh heartbeat) or 'gone'."""
        if self.result() is not None:
            return "done"
        status = self.status()
        beat = float(status.get("time", 0)) if status else 0.0
        return "alive" if time.time() - beat <= self.lost_after else "gone"

    def _log_from(self, offset: int) -> bytes:
        try:
            return self.store.get_range(self.keys.log(self.attempt, self.rank), offset)
        except StoreError:  # not shipped yet (NotFoundError), or a hiccup: next poll
            return b""

    # -- RunningProcess --------------------------------------------------------------------
    def lines(self) -> Iterator[str]:
        offset = self.log_offset
        said: dict[str, Any] = {}
        last_beat: float | None = None
        if self._lost is not None and self.result() is None:
            self._code = EXIT_INFRA
            yield f"[trainctl] algo-{self.rank + 1} was lost before the takeover: {self._lost}"
            return
        while True:
            data = self._log_from(offset)
            *complete, _partial = data.split(b"\n")
            for raw in complete:
                offset += len(raw) + 1
                yield raw.decode("utf-8", errors="replace").rstrip("\r")
            status = self.status() or {}
            yield from self._progress(status, said)
            if status.get("time") != last_beat and status.get("time") is not None:
                if last_beat is not None:
                    self.beats_after_adoption += 1
                last_beat = status["time"]
                yield message("heartbeat", rank=self.rank)
            result = self.result()
            if result is not None:
                rest = self._log_from(offset)  # the log's last lines precede the result
                for raw in rest.split(b"\n"):
                    if raw:
                        yield raw.decode("utf-8", errors="replace").rstrip("\r")
                yield message("result", **result)
                self._code = int(result.get("exit_code", EXIT_INFRA))
                return
            beat = float(last_beat) if last_beat is not None else self._adopted_at
            silent = time.time() - max(beat, self._store_refused_at)
            if silent > self.lost_after:
                self._code = EXIT_INFRA
                yield (
                    f"[trainctl] algo-{self.rank + 1}: no heartbeat in the store for "
                    f"{silent:.0f} s; counting the node as lost"
                )
                return
            time.sleep(self.poll_interval)

    def _progress(self, status: dict[str, Any], said: dict[str, Any]) -> Iterator[str]:
        for flag in _FLAGS:
            if status.get(flag) and not said.get(flag):
                said[flag] = True
                yield message(flag, rank=self.rank)
        for field in _STEPS:
            value = status.get(field)
            if isinstance(value, int) and value != said.get(field):
                said[field] = value
                yield message(field, rank=self.rank, step=value)

    def poll(self) -> int | None:
        if self._code is None and (result := self.result()) is not None:
            return int(result.get("exit_code", EXIT_INFRA))
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"node {self.rank} of attempt {self.attempt} still running")
            time.sleep(self.poll_interval)
        return code

    def terminate(self) -> None:
        """A stop reaches an adopted node as an interruption notice that its controller
        relays (`notify`: in the lease the agent reads): its agent stops the workers (they
        save their emergency checkpoint) and ends."""
        if self.poll() is None and self._notify is not None:
            self._notify()

    def kill(self) -> None:
        if self._kill is not None:
            self._kill()
