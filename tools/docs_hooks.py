"""MkDocs hooks: the CLI reference page is written from the typer app at build time, so it
cannot drift from the commands (`docs/cli.md` holds its introduction and a marker)."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- the commands: written by tools/docs_hooks.py -->"
SETTINGS_MARKER = "<!-- the settings: written by tools/docs_hooks.py -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_reference())
    return markdown


def settings_reference() -> str:
    """Every setting (`TRAINCTL_NAME` in the environment, `name:` in config.yaml), its
    default and what it does, from the Settings model."""
    from pydantic_core import PydanticUndefined

    from trainctl.settings import Settings

    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if field.default_factory is not None:
            default = "(computed)" if name != "pools" else "{}"
        elif field.default is PydanticUndefined:
            default = "(required)"
        else:
            default = f"`{field.default!r}`" if field.default != "" else '`""`'
        text = " ".join((field.description or "").split())
        if text.startswith("TEST SEAM"):
            continue  # for the test suite's stand-ins, not for users
        for plain, escaped in (("|", "\\|"), ("[", "\\["), ("]", "\\]"), ("<", "&lt;")):
            text = text.replace(plain, escaped)
        rows.append(f"| `TRAINCTL_{name.upper()}` / `{name}` | {default} | {text or '-'} |")
    return "\n".join(rows)


def cli_reference() -> str:
    """Every `trainctl` command: its usage, its help and a table of its arguments and
    options, as `trainctl COMMAND --help` shows them."""
    import typer

    from trainctl.cli import app, tidy_help

    root = tidy_help(typer.main.get_command(app))
    context = root.make_context("trainctl", [], resilient_parsing=True)
    parts = [_command("trainctl", root, context, top=True)]
    for name, command in root.commands.items():
        if command.hidden:
            continue
        sub = command.make_context(name, [], parent=context, resilient_parsing=True)
        parts.append(_command(f"trainctl {name}", command, sub))
    return "\n\n".join(parts)


def _command(path: str, command: Any, context: Any, *, top: bool = False) -> str:
    pieces = " ".join(command.collect_usage_pieces(context))
    lines = [f"## `{path}`" if not top else "## Global options", ""]
    if not top:
        lines += [f"```\n{path} {pieces}\n```", "", _help(command.help or ""), ""]
    rows = []
    for param in command.get_params(context):
        record = param.get_help_record(context)
        if record is None:
            continue
        names, text = record
        names = names.replace("|", "\\|")
        text = " ".join(text.split()).replace("|", "\\|")
        rows.append(f"| `{names}` | {text} |")
    if rows:
        lines += ["| argument or option | what it does |", "|---|---|", *rows]
    return "\n".join(lines).rstrip()


def _help(text: str) -> str:
    """A docstring as markdown: its paragraphs, each line joined (as `--help` wraps it)."""
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return "\n\n".join(paragraphs)
