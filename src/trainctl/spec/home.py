"""Where trainctl keeps its files (TRAINCTL_HOME, default ~/.trainctl): below the settings,
so that what the settings import (the instance-type catalog's cache) can find it too."""

from __future__ import annotations

import os
from pathlib import Path


def trainctl_home() -> Path:
    return Path(os.environ.get("TRAINCTL_HOME") or Path.home() / ".trainctl").expanduser()
