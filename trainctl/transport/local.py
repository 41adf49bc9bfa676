"""Run a node agent as a local child process in a session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from trainctl.procs import descendants, signal_all
from trainctl.transport import RunningProcess


class LocalProcess(RunningProcess):
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        # A session of its own: Ctrl-C in the user's terminal reaches the controller only,
        # which then stops the job in order instead of every process dying at once.
        self._proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        self.pid = self._proc.pid

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            yield line.rstrip("\n")
        self._proc.stdout.close()

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"process {self.pid} still running") from None

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        signal_all([*descendants(self.pid), self.pid], signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
