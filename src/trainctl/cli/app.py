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
    # click's plain help, as kubectl's and the aws CLI's: an option's whole name on its
    # line at any width (typer's rich tables cut long names with "…" on narrow terminals
    # and took `<redacted>` for markup), no colour escapes, and a docstring's lines one
    # paragraph that wraps to the terminal.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

OutputOpt = typer.Option("text", "-o", "--output", help="Output format: text or json.")


def whole_number(value: Any) -> int:
    """A count given on the command line (typer's `parser`): digits, with an optional
    sign. Python's int() also takes `1_0` (10), ` 7 ` and other scripts' digits, none of
    which a person typing a count means."""
    import re

    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not re.fullmatch(r"[+-]?[0-9]{1,19}", str(value)):
        raise typer.BadParameter(f"{str(value)[:40]!r} is not an integer (digits only)")
    return int(value)


def complete_job_names(incomplete: str) -> list[str]:
    """TAB after a command that takes a job: the job names in the default store (the shell
    sorts them). Completion must never fail or print: any error completes nothing."""
    try:
        from trainctl.store import default_store

        names = default_store().list_dirs("jobs")
    except Exception:
        return []
    return sorted(n for n in names if n.startswith(incomplete))


JobArg = typer.Argument(
    ..., help="Job name (TAB completes it).", metavar="JOB", autocompletion=complete_job_names
)


def _print_version(value: bool) -> None:
    if value:
        from trainctl.version import __version__

        sys.stdout.write(f"trainctl {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print trainctl's version and exit.",
    ),
) -> None:
    """Managed training for PyTorch: submit jobs, follow their logs, fetch their models."""


# How the help shows a value's type, where typer would print `<str>`, `<bool>`: click's words.
_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "Path": "PATH"}


def tidy_help(command: Any) -> Any:
    """The conventions of `--help` on every command of the click tree typer built: a flag
    shows no value (`--follow`, not `--follow <bool>`), a value its kind (`--tail INTEGER`),
    and an argument its name (`JOB`, not `{JOB}`) in the usage line."""
    for param in getattr(command, "params", []):
        if param.metavar is not None:
            pass
        elif getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.param_type_name == "option":
            kind = param.bare_type() if hasattr(param, "bare_type") else ""
            inner = kind[5:-1] if kind.startswith("list[") else kind
            param.metavar = _METAVARS.get(inner, inner.upper() or "TEXT")
        if param.param_type_name == "argument":
            name = param.metavar or param.name.upper()
            param.metavar = name
            shown = name if param.required else f"[{name}]"
            # typer 0.2x braces a required argument's name in the usage line and adds its
            # type (`JOB <str>`) to the help; click shows the name alone
            param._usage_display_name = lambda shown=shown: shown
            param.display_type_rich = lambda ctx: ""
    help_option = command.get_help_option

    def quiet_help_option(ctx: Any, made: Any = help_option) -> Any:
        option = made(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = quiet_help_option
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
    return command


EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_HANGUP = 129  # 128 + SIGHUP: the terminal closed; the job goes on, detached


def err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


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


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def parse_pairs(values: list[str] | None, flag: str, *, typed: bool = False) -> dict[str, Any]:
    """KEY=VALUE flags into a dict; with `typed`, JSON values (8 -> int) else strings."""
    from trainctl.errors import SpecError
    from trainctl.redact import is_secret_name

    out: dict[str, Any] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # (what looks like a secret is not quoted back: the error reaches logs and CI)
            shown = "the value given" if is_secret_name(item) else repr(item)
            raise SpecError(flag, f"{shown} must be KEY=VALUE")
        key = key.strip()
        if typed:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError as exc:
                if value.lstrip()[:1] in ("{", "[", '"'):  # meant as JSON, and broken
                    shown = "its value" if is_secret_name(key) else _cut(value)
                    raise SpecError(
                        flag,
                        f"{key}: {shown} is not valid JSON ({exc.msg} at character "
                        f"{exc.pos}); to pass it as text, give it as a JSON string: "
                        f"-p '{key}=\"...\"'",
                    ) from None
                out[key] = value
            except ValueError:  # Python refuses to parse a 5,000-digit integer
                raise SpecError(flag, f"{key}: an integer beyond 64 bits") from None
            except RecursionError:
                raise SpecError(flag, f"{key}: nested too deeply") from None
        else:
            out[key] = value
    return out
