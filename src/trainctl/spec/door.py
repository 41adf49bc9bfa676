"""`Door`: how one job field is given at each entry point, declared beside the field in
JobSpec (see trainctl.spec.fields, which reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How `trainctl submit` takes a field's value:
#   value     one typed value (--max-run 3600)
#   flag      a switch with its negation (--use-spot-instances / --no-use-spot-instances)
#   repeated  a list, one item per flag (--subnets a --subnets b)
#   pairs     a mapping, KEY=VALUE per flag, values as strings (--environment K=V)
#   typed     a mapping, KEY=VALUE per flag, values read as JSON (-p epochs=8)
#   own       parsed by a function of the CLI named after the field (hosts, distribution...)
#   argument  the command's positional argument(s)
CliKind = Literal["value", "flag", "repeated", "pairs", "typed", "own", "argument"]


@dataclass(frozen=True)
class Door:
    help: str
    cli: CliKind = "value"
    short: str | None = None  # a one-letter flag beside the long one (-p)
    old_flags: tuple[str, ...] = ()  # hidden, deprecated spellings (--checkpoint-uri)
    metavar: str | None = None
    sagemaker: str | None = None  # "same", or how the shim maps SageMaker's argument
    estimator: bool = True  # a keyword of trainctl.Estimator (entry_point is positional)
