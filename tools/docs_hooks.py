"""MkDocs hooks: the CLI reference page is written from the typer app at build time, so it
cannot drift from the commands (`docs/cli.md` holds its introduction and a marker)."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- the commands: written by tools/docs_hooks.py -->"
SETTINGS_MARKER = "<!-- the settings: written by tools/docs_hooks.py -->"
ERRORS_MARKER = "<!-- the errors: written by tools/docs_hooks.py -->"
FIELDS_MARKER = "<!-- the job fields: written by tools/docs_hooks.py -->"
LAYERS_MARKER = "<!-- the layers: written by tools/docs_hooks.py -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_reference())
    if FIELDS_MARKER in markdown:
        markdown = markdown.replace(FIELDS_MARKER, fields_reference())
    if ERRORS_MARKER in markdown:
        markdown = markdown.replace(ERRORS_MARKER, error_index())
    if LAYERS_MARKER in markdown:
        markdown = markdown.replace(LAYERS_MARKER, layer_table())
    return markdown


def layer_table() -> str:
    """The layers from the bottom, as tests/unit/test_architecture.py enforces them (its
    DESCRIBED, SAME_LAYER and ONLY), so the page cannot drift from the test."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tests" / "unit" / "test_architecture.py"
    found = importlib.util.spec_from_file_location("_architecture_for_docs", path)
    assert found is not None and found.loader is not None
    arch = importlib.util.module_from_spec(found)
    found.loader.exec_module(arch)

    def short(name: str) -> str:
        return "trainctl" if name == "trainctl" else name.removeprefix("trainctl.")

    rows = ["| layer | modules | what | may also import |", "|---|---|---|---|"]
    for name, what, packages in arch.DESCRIBED:
        modules = ", ".join(f"`{short(p)}`" for p in packages)
        also = [
            f"`{short(p)}` -> {', '.join(f'`{short(d)}`' for d in arch.SAME_LAYER[p])}"
            for p in packages
            if p in arch.SAME_LAYER
        ]
        also += [
            f"`{short(p)}`: only {', '.join(f'`{short(d)}`' for d in arch.ONLY[p])} below"
            for p in packages
            if p in arch.ONLY and p not in arch.SAME_LAYER
        ]
        rows.append(f"| {name} | {modules} | {what} | {'; '.join(also)} |")
    return "\n".join(rows)


# Raised for a user to read (a one-line `error:`); internal errors are left out.
_BAD_INPUT = {"SpecError"}
_FAILURES = {
    "AwsError", "CleanupError", "ImageBuildError", "ImdsError", "NotFoundError",
    "PackagingError", "RefusedError", "RemoteCommandError", "SshAuthError", "SshHostKeyError",
    "SshKeyError", "SshProvisionError", "StoreError", "TrainctlError", "UnreadableRecordError",
}  # fmt: skip


def error_index() -> str:
    """Every message trainctl raises for a user, from the source: the bad input it refuses
    (exit 2: `SpecError`, and the `ValueError`s of the spec's validators, which reach the
    user as SpecError naming their field) and the failures it reports (exit 1). `…` stands
    for what the message fills in."""
    import ast
    from pathlib import Path

    import trainctl

    root = Path(trainctl.__file__).parent
    bad: list[tuple[str, str, str]] = []
    failed: list[tuple[str, str, str]] = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".")
        in_spec = module.startswith("trainctl.spec.")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            args = [_template(a) for a in node.exc.args]
            if name in _BAD_INPUT and len(args) >= 2 and args[0] and args[1]:
                bad.append((args[0], args[1], module))
            elif name == "ValueError" and in_spec and args and args[0]:
                bad.append(("(the field checked)", args[0], module))
            elif name in _FAILURES and args and args[0]:
                failed.append((name, args[0], module))

    def table(rows: list[tuple[str, str, str]], head: str) -> str:
        lines = [f"| {head} | message | raised in |", "|---|---|---|"]
        for first, message, module in sorted(set(rows)):
            lines.append(f"| `{_cell(first)}` | {_cell(message)} | `{module}` |")
        return "\n".join(lines)

    return "\n\n".join(
        [
            f"## Bad input (exit 2): {len(set(bad))} messages",
            table(bad, "field"),
            f"## Failures (exit 1): {len(set(failed))} messages",
            table(failed, "error"),
        ]
    )


def _template(node: Any) -> str | None:
    """A message's text from its source: constants kept, what is filled in as `…`."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None and right is None else (left or "…") + (right or "…")
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "scrub" and node.args:
        return _template(node.args[0])
    return None


def _cell(text: str) -> str:
    text = " ".join(text.split())
    for plain, escaped in (("|", "\\|"), ("[", "\\["), ("]", "\\]"), ("<", "&lt;")):
        text = text.replace(plain, escaped)
    return text.replace("`", "'")


def fields_reference() -> str:
    """Every job field: its Estimator keyword and YAML key (the field's name), its
    `trainctl submit` flag, its SageMaker counterpart and what it does, from JobSpec's
    declarations (trainctl.spec.fields)."""
    from trainctl.spec.fields import job_fields

    rows = ["| field | `submit` flag | SageMaker | what it is |", "|---|---|---|---|"]
    for field in job_fields():
        door = field.door
        if field.name == "entry_point":
            flag = "`ENTRY_POINT`"
        elif field.name == "arguments":
            flag = "`-- ARG ...`"
        else:
            flag = f"`{field.flag}`" + (f" `{door.short}`" if door.short else "")
        sagemaker = {"same": "the same", None: "-"}.get(door.sagemaker) or str(door.sagemaker)
        cells = [_cell(sagemaker.removeprefix("mapped: ")), _cell(door.help)]
        rows.append(f"| `{field.name}` | {flag} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def settings_reference() -> str:
    """Every setting (`TRAINCTL_NAME` in the environment, `name:` in config.yaml), its
    default and what it does, from the Settings model."""
    from pydantic_core import PydanticUndefined

    from trainctl.spec.settings import Settings

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
        # (`<redacted>` and `SM_CHANNEL_<CHANNEL>` are text, not HTML tags)
        text = _text_not_tags(" ".join(text.split()).replace("|", "\\|"))
        rows.append(f"| `{names}` | {text} |")
    if rows:
        lines += ["| argument or option | what it does |", "|---|---|", *rows]
    return "\n".join(lines).rstrip()


def _help(text: str) -> str:
    """A docstring as markdown: its paragraphs, each line joined (as `--help` wraps it)."""
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return _text_not_tags("\n\n".join(paragraphs))


def _text_not_tags(text: str) -> str:
    """`<` outside code spans as `&lt;`: help's `<redacted>` is a word, not an HTML tag
    (which a page would drop); inside backticks it is shown as written already."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))
