"""Durations as users write them on the command line: `30s`, `10m`, `2h`, `7d`, `1w`."""

from __future__ import annotations

import re

from trainctl.errors import SpecError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, field: str) -> float:
    """`30s`, `10m`, `2h`, `7d`, `1w` as seconds; anything else is a SpecError naming
    `field`."""
    found = _DURATION.match(text.strip().lower())
    if not found:
        raise SpecError(field, f"{text!r} is not a duration; allowed: a number and s, m, h, d or w")
    return float(found[1]) * _UNITS[found[2]]
