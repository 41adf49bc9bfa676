"""The `trainctl` command: a thin layer over the Python API (no logic of its own).

Only typer is imported at module load; everything else loads inside the command that needs
it, so `trainctl --help` is instant. `app` holds the shared options and error handling;
each module registers its commands on it.
"""

from __future__ import annotations

import sys

import typer

# The command modules register their commands on `app`, in the order --help lists them.
# isort: off
from trainctl.cli import submit, capacity, jobs, analysis, files, metrics, tuning  # noqa: F401

# isort: on
from trainctl.cli.app import EXIT_BAD_INPUT, EXIT_INTERRUPTED, app, err, tidy_help

__all__ = ["app", "main"]


def split_script_arguments(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`trainctl submit ENTRY [OPTIONS] -- ARG ...`: the words after the first `--` are the
    entry point's own arguments (None when there is no `--`), never trainctl's options."""
    if argv[:1] != ["submit"] or "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def main() -> None:
    """The `trainctl` command. Usage mistakes (an unknown option, a missing argument, a value
    of the wrong type) get the same one-line `error:` as every other bad input, exit 2,
    where click would print a usage block and a boxed message."""
    # typer vendors click in newer releases and uses click itself in older ones: find the
    # classes through an exception typer exports, whichever it is.
    classes = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    usage_error, click_error = classes["UsageError"], classes["ClickException"]
    no_args = getattr(sys.modules[usage_error.__module__], "NoArgsIsHelpError", ())
    args, script_arguments = split_script_arguments(sys.argv[1:])
    try:
        command = tidy_help(typer.main.get_command(app))
        code = command.main(
            args=args,
            prog_name="trainctl",
            standalone_mode=False,
            obj={"arguments": script_arguments},
        )
    except no_args as exc:  # a bare command: its help, as click would show it
        sys.stdout.write(exc.ctx.get_help() + "\n" if exc.ctx else "")
        code = EXIT_BAD_INPUT
    except usage_error as exc:
        from trainctl.errors import one_line

        where = exc.ctx.command_path if exc.ctx else "trainctl"
        message = one_line(exc.format_message())
        if where.endswith(" submit") and "unexpected extra argument" in message:
            message += "; the script's own arguments go after `--`: submit ENTRY_POINT -- ARG ..."
        err(f"{message} (see '{where} --help')")
        code = EXIT_BAD_INPUT
    except click_error as exc:
        err(exc.format_message())
        code = exc.exit_code
    except typer.Abort:
        code = EXIT_INTERRUPTED
    sys.exit(code if isinstance(code, int) else 0)
