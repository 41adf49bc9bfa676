"""`trainctl ui` as a user starts it, for tests that look at it in a real headless
browser (Chromium from Debian, driven by Playwright)."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import TRAINCTL, free_port, require_part

CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str:
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if path is None:
        require_part("chromium", "chromium is not installed (apt-get install chromium)")
    return path


class Dashboard:
    def __init__(self, home: Path, *args: str) -> None:
        self.port = free_port()
        env = {**os.environ, "TRAINCTL_HOME": str(home)}
        env.pop("TRAINCTL_STORE", None)
        self.proc = subprocess.Popen(
            [TRAINCTL, "ui", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert line.startswith("trainctl ui: http://127.0.0.1:"), line
        self.url = line.split()[2]

    def get(self, path: str) -> tuple[int, bytes]:
        base = self.url.split("?")[0].rstrip("/")
        try:
            with urllib.request.urlopen(base + path, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def close(self) -> None:
        """Ends the dashboard, reaps it and closes its pipes (left open, the collector warned
        of them in whichever test ran next)."""
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=5)
