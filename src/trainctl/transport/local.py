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
            stdin=subprocess.PIPE,  # the controller's notices, at once (tell)
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
        self._close_input()

    def _close_input(self) -> None:
        """The notice pipe closes once the agent's output has ended or it has been reaped:
        left to the garbage collector it would warn (an unclosed file) in the user's process."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except (OSError, ValueError):  # a notice half-written to an agent that died
                pass

    def tell(self, line: str) -> bool:
        stdin = self._proc.stdin
        if stdin is None:
            return False
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):  # it ended (or is ending)
            return False
        return True

    def poll(self) -> int | None:
        """The exit code, or None while the agent runs. Popen.poll() answers None while
        another thread waits for the process (the controller's main thread, at the end of
        the agent's output), even once it has exited: the machine watch then took an agent
        that had ended well, not yet reaped, for a killed node and relaunched a finished
        attempt. So the process is looked at without reaping it (the waiter does that)."""
        code = self._proc.poll()
        if code is not None or not hasattr(os, "waitid"):
            return code
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by the waiter just now: it sets the code next
            return self._proc.wait()
        if info is None:
            return None  # still running
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def wait(self, timeout: float | None = None) -> int:
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"process {self.pid} still running") from None
        self._close_input()
        return code

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        signal_all([*descendants(self.pid), self.pid], signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
