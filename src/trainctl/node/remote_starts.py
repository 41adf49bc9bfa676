"""mpirun's remote starts on a node: `orted` started here when rank 0's mpirun asks, each
node's endpoint in the store, and rank 0's table of them. A part of the Agent
(trainctl.node.agent), by what it does.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from trainctl.errors import NotFoundError
from trainctl.node.remote_start import RemoteStartServer, read_endpoint

# How long a process a node's launcher (or an orted) left behind has between SIGTERM and
# SIGKILL.
STRAY_GRACE_SECONDS = 2.0


class RemoteStarts:
    """The agent's methods for this part; the Agent holds the state they use."""

    def take_remote_starts(self, python: str) -> None:
        """Start `orted` here when rank 0's mpirun asks (trainctl.node.remote_start), and say
        where in the store for rank 0."""
        from trainctl.launcher.mpi import daemon_env

        extra = daemon_env(self.cluster, python, str(self.layout.code))
        self.remote_starts = RemoteStartServer(
            self.node.address,
            lambda: self.environment(extra),
            self.layout.code,
            self.log,
            in_view=lambda argv: self.in_own_view(argv, python),
        )
        self.store.put_text(
            self.jobs.keys.remote_start(self.attempt, self.rank),
            json.dumps(self.remote_starts.endpoint()),
        )
        self.log(f"taking mpirun's remote starts at {self.node.address}:{self.remote_starts.port}")

    def remote_start_table(self) -> Path:
        """Rank 0: every node's remote-start endpoint, in a file only mpirun's remote shell
        reads, once every node's agent has said where (they start in any order)."""
        from trainctl.node.remote_start import write_endpoints

        endpoints: dict[int, dict[str, Any]] = {}
        waited = time.monotonic()
        said = False
        while len(endpoints) < len(self.cluster.nodes):
            for node in self.cluster.nodes:
                if node.rank in endpoints:
                    continue
                try:
                    key = self.jobs.keys.remote_start(self.attempt, node.rank)
                    endpoints[node.rank] = read_endpoint(self.store.get_text(key), node.host)
                except NotFoundError:
                    pass
            if len(endpoints) < len(self.cluster.nodes):
                if not said and time.monotonic() - waited > 5:
                    missing = [n.host for n in self.cluster.nodes if n.rank not in endpoints]
                    self.log(f"waiting for the agents of {', '.join(missing)} to start")
                    said = True
                time.sleep(0.2)
        path = self.layout.root / "remote-starts.json"
        write_endpoints(path, list(endpoints.values()))
        return path

    def end_remote_starts(self) -> None:
        """Take no more starts and end what they started (an orted daemonizes itself: it is
        a descendant of this agent still, as the node's subreaper)."""
        from trainctl.procs import end_descendants

        if self.remote_starts is None:
            return
        self.remote_starts.close()
        self.remote_starts = None
        try:
            self.store.delete(self.jobs.keys.remote_start(self.attempt, self.rank))
        except Exception as exc:  # a stale token opens nothing: its listener is gone
            self.log(f"could not remove the node's remote-start endpoint: {exc}")
        end_descendants(os.getpid(), grace=STRAY_GRACE_SECONDS)
