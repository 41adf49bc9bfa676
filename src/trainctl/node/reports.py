"""What a node's agent tells the controller beside its workers' output: its own control
messages, a heartbeat on the pipe, its status in the store (for a controller that takes the
attempt over), the saved state it stored, the ranks' first step. A part of the Agent
(trainctl.node.agent), by what it does.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from trainctl.node.output import emit, yielding

# How often the agent looks for the ranks' first optimizer step (a few names in a folder).
FIRST_STEP_LOOK_SECONDS = 0.5


class NodeReports:
    """The agent's methods for this part; the Agent holds the state they use."""

    def stored_state(self) -> None:
        """A sync put more of this attempt's saved state in the store: a relaunch now
        resumes from it, so the controller may relaunch by choice (back to spot), and a
        `ckptN` fault counts the files. The first time in the node's status too, for a
        controller that takes the attempt over; then only told."""
        files = sum(s.stored_files for s in (self.sync, self.workdir) if s is not None)
        if not self.status.snapshot().get("state_stored"):
            self.say("state_stored", files=files)
        else:
            emit("state_stored", rank=self.rank, files=files)

    def say(self, event: str, **fields: Any) -> None:
        """A control message of the agent's own, for the controller and the node's status."""
        self.status.observe({"event": event})
        emit(event, rank=self.rank, **fields)
        if event != "heartbeat":
            self.write_status()

    def write_status(self) -> None:
        if self.finished:
            return
        try:
            key = self.jobs.keys.node_status(self.attempt, self.rank)
            snapshot = self.status.snapshot()
            self.prompt_store.put_text(key, json.dumps(snapshot))
            self.status.written(snapshot)
        except Exception as exc:  # the store retries; a missed beat is not a lost node
            self.log(f"could not record the node's status: {exc}")

    def heartbeat(self) -> None:
        """On the controller's pipe, every heartbeat_seconds whatever the store is doing: a
        status write that the store's retries hold up must not look like a lost node."""
        while not self.stopping and not self.finished:
            time.sleep(self.settings.heartbeat_seconds)
            emit("heartbeat", rank=self.rank)

    def keep_status(self) -> None:
        """The node's status in the store, for a controller that takes over (its own thread:
        see heartbeat): written when it changes (`say` writes its events at once; steps
        wait for the next look), else every status_seconds, which keeps it fresh for a
        follower (a third of the time after which one counts the node lost)."""
        refresh = self.settings.status_seconds(len(self.cluster.nodes))
        look = min(refresh, self.settings.heartbeat_seconds)
        self.write_status()
        due = time.time() + random.uniform(0.0, refresh)  # (spread: see LogShipper._run)
        while not self.stopping and not self.finished:
            time.sleep(look)
            if self.status.changed() or time.time() >= due:
                self.write_status()
                due = time.time() + refresh

    def watch_first_step(self) -> None:
        """`first_step` once a rank's optimizer first steps (the worker hook notes it), with
        how long ago: when training began, for a script that reports no steps of its own (a
        fault aimed N s after it)."""
        from trainctl.node.ranks import first_stepped

        while not self.stopping and not self.finished:
            time.sleep(FIRST_STEP_LOOK_SECONDS)
            at = first_stepped(self.ranks_dir) if self.ranks_dir is not None else None
            if at is not None:
                self.say("first_step", ago=round(max(0.0, time.time() - at), 3))
                return

    def start_watching(self) -> None:
        """The agent's threads beside the job: the lease and the controller's pipe, spot
        notices (EC2), the heartbeat, the node's status, the ranks' first step."""
        background = [(self.watch_lease, "lease-watch"), (self.watch_pipe, "pipe-watch")]
        if self.settings.imds:
            background.append((self.watch_spot_notices, "imds"))
        background += [(self.heartbeat, "heartbeat"), (self.keep_status, "status")]
        background.append((self.watch_first_step, "first-step"))
        for work, name in background:
            threading.Thread(target=yielding(work), name=name, daemon=True).start()
