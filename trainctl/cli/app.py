"""The `trainctl` app: its shared options, exit codes and one-line error handling."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import typer

app = typer.Typer(
    name="trainctl",
    help="Managed training for PyTorch: submit jobs, follow their logs, fetch their models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

OutputOpt = typer.Option("text", "-o", "--output", help="Output format: text or json.")

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def handle_errors(fn):
    """Turn trainctl errors into one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from trainctl.errors import SpecError, TrainctlError

        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            err(str(exc))
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except TrainctlError as exc:
            err(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def check_output(output: str) -> None:
    if output not in ("text", "json"):
        from trainctl.errors import SpecError

        raise SpecError("--output", f"unknown format {output!r}; allowed: text, json")
    if output == "json":  # machine-read output: no progress bars on stderr either
        from trainctl.progress import quiet

        quiet()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def parse_pairs(values: list[str] | None, flag: str, *, typed: bool = False) -> dict[str, Any]:
    """KEY=VALUE flags into a dict; with `typed`, JSON values (8 -> int) else strings."""
    from trainctl.errors import SpecError

    out: dict[str, Any] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(flag, f"{item!r} must be KEY=VALUE")
        key = key.strip()
        if typed:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
            except ValueError:  # Python refuses to parse a 5,000-digit integer
                raise SpecError(flag, f"{key}: an integer beyond 64 bits") from None
            except RecursionError:
                raise SpecError(flag, f"{key}: nested too deeply") from None
        else:
            out[key] = value
    return out
