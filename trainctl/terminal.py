"""The rich Console every command writes through: NO_COLOR means plain text.

rich, given NO_COLOR, drops colours but still writes bold and underline escapes; a user
who sets NO_COLOR (to read output in a log viewer, to parse it) wants no escape at all,
as kubectl and git give. FORCE_COLOR and TERM=dumb keep rich's own meaning.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["console", "no_color"]


def no_color() -> bool:
    """NO_COLOR is set to something (https://no-color.org: "present and not empty")."""
    return bool(os.environ.get("NO_COLOR"))


def console(**kwargs: Any) -> Any:
    """A rich Console (rich imported here, not at module load) with `kwargs`; under
    NO_COLOR it writes no escape sequences at all (color_system None: rich then renders
    every style as plain text)."""
    from rich.console import Console

    if no_color() and kwargs.get("force_terminal") is not True:
        kwargs["color_system"] = None
    return Console(**kwargs)
