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
from trainctl.cli import submit, capacity, jobs, metrics  # noqa: F401

# isort: on
from trainctl.cli.app import EXIT_BAD_INPUT, EXIT_INTERRUPTED, app, err

__all__ = ["app", "main"]


def main() -> None:
    """The `trainctl` command. Usage mistakes (an unknown option, a missing argument, a value
    of the wrong type) get the same one-line `error:` as every other bad input, exit 2,
    where click would print a usage block and a boxed message."""
    # typer vendors click in newer releases and uses click itself in older ones: find the
    # classes through an exception typer exports, whichever it is.
    classes = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    usage_error, click_error = classes["UsageError"], classes["ClickException"]
    no_args = getattr(sys.modules[usage_error.__module__], "NoArgsIsHelpError", ())
    try:
        code = app(standalone_mode=False)
    except no_args as exc:  # a bare command: its help, as click would show it
        sys.stdout.write(exc.ctx.get_help() + "\n" if exc.ctx else "")
        code = EXIT_BAD_INPUT
    except usage_error as exc:
        from trainctl.errors import one_line

        where = exc.ctx.command_path if exc.ctx else "trainctl"
        err(f"{one_line(exc.format_message())} (see '{where} --help')")
        code = EXIT_BAD_INPUT
    except click_error as exc:
        err(exc.format_message())
        code = exc.exit_code
    except typer.Abort:
        code = EXIT_INTERRUPTED
    sys.exit(code if isinstance(code, int) else 0)
