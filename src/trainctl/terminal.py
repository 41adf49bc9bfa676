"""The rich Console every command writes through: NO_COLOR means plain text, and no text of
a job's (a log line, a failure, a hyperparameter) reaches the terminal as a control code.

rich, given NO_COLOR, drops colours but still writes bold and underline escapes; a user
who sets NO_COLOR (to read output in a log viewer, to parse it) wants no escape at all,
as kubectl and git give. FORCE_COLOR and TERM=dumb keep rich's own meaning.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["console", "inert", "no_color"]

# What a terminal acts on: C0 controls but tab and newline, DEL, and C1 controls (U+0080-
# U+009F; U+009B is CSI to a terminal in 8-bit mode).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A colour or weight (SGR), which a script's coloured log may keep.
_SGR = re.compile(r"\x1b\[[0-9;:]{0,64}m")


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    return "" if char == "\r" else f"\\x{ord(char):02x}"


def inert(text: str, *, keep_colour: bool = False) -> str:
    """`text` with every control character written out as `\\xNN` (a carriage return,
    a progress bar's, dropped): a log line, a failure or a hyperparameter that someone
    else wrote cannot move the cursor, retitle the window, set the clipboard (OSC 52) or
    hide what follows. `keep_colour`: colour sequences (SGR) stay, for rich to parse."""
    if not _CONTROL.search(text):
        return text
    if not keep_colour:
        return _CONTROL.sub(_shown, text)
    pieces = _SGR.split(text)
    colours = _SGR.findall(text)
    out = [_CONTROL.sub(_shown, pieces[0])]
    for colour, piece in zip(colours, pieces[1:], strict=True):
        out += [colour, _CONTROL.sub(_shown, piece)]
    return "".join(out)


def no_color() -> bool:
    """NO_COLOR is set to something (https://no-color.org: "present and not empty")."""
    return bool(os.environ.get("NO_COLOR"))


def console(**kwargs: Any) -> Any:
    """A rich Console (rich imported here, not at module load) with `kwargs`; under
    NO_COLOR it writes no escape sequences at all (color_system None: rich then renders
    every style as plain text)."""
    if no_color() and kwargs.get("force_terminal") is not True:
        kwargs["color_system"] = None
    return _inert_console()(**kwargs)


_CONSOLE: Any = None


def _inert_console() -> Any:
    """rich's Console, whose text (not its own styling) is made inert as it is written."""
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console
        from rich.segment import Segment

        class InertConsole(Console):
            # rich's one place where segments become the written string (rich >= 10).
            def _render_buffer(self, buffer: Any) -> str:
                return str(
                    super()._render_buffer(
                        Segment(inert(t), s, c) if c is None else Segment(t, s, c)
                        for t, s, c in buffer
                    )
                )

        _CONSOLE = InertConsole
    return _CONSOLE
