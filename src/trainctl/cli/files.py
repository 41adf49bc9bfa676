"""A job's files and a store's: `artifacts` (list, fetch) and `ls`."""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainctl.cli.app import (
    JobArg,
    OutputOpt,
    app,
    check_output,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def artifacts(
    job: str = JobArg,
    action: str | None = typer.Argument(None, help="'get' to download a file or a folder."),
    path: str | None = typer.Argument(
        None, help="With get: the file or folder, relative to the job (output/model.tar.gz)."
    ),
    dest: str | None = typer.Argument(
        None, help="With get: where to save it; a directory or DEST/: into it."
    ),
    output: str = OutputOpt,
) -> None:
    """Browse a job's files in the store (model, outputs, logs, checkpoints); `get` a file
    or a whole folder (a checkpoint step, `output/`)."""
    from trainctl.controller.artifacts import download_artifact, job_artifacts
    from trainctl.errors import SpecError
    from trainctl.store import default_store

    check_output(output)
    store = default_store()
    if action is None:
        groups = job_artifacts(store, job)
        if output == "json":
            print_json(
                [
                    {"root": root, "files": [{"path": i.key, "size": i.size} for i in infos]}
                    for root, infos in groups
                ]
            )
            return
        _print_tree(groups)
        return
    if action != "get":
        raise SpecError("action", f"unknown {action!r}; allowed: get")
    if not path:
        raise SpecError("PATH", "give the file or folder to download, e.g. output/model.tar.gz")
    for saved in download_artifact(store, job, path, dest or None):  # each file, a line
        sys.stdout.write(f"{saved}\n")


def _print_tree(groups: list[tuple[str, list[Any]]]) -> None:
    from rich.tree import Tree

    from trainctl.terminal import console

    out = console(highlight=False)
    for root, infos in groups:
        tree = Tree(f"[bold]{root}[/]")
        branches: dict[str, Tree] = {"": tree}
        for info in infos:
            parts = info.key.split("/")
            for depth in range(1, len(parts)):
                prefix = "/".join(parts[:depth])
                if prefix not in branches:
                    branches[prefix] = branches["/".join(parts[: depth - 1])].add(
                        f"[bold blue]{parts[depth - 1]}/[/]"
                    )
            branches["/".join(parts[:-1])].add(f"{parts[-1]}  [dim]{_size(info.size)}[/]")
        out.print(tree)


def _size(n: int) -> str:
    """Binary units, as `aws s3 ls --human-readable` shows them (1.5 KiB)."""
    from rich.filesize import pick_unit_and_suffix

    unit, suffix = pick_unit_and_suffix(n, ["B", "KiB", "MiB", "GiB", "TiB"], 1024)
    return f"{n} B" if unit == 1 else f"{n / unit:.1f} {suffix}"


@app.command("ls")
@handle_errors
def ls_(
    uri: str = typer.Argument(..., help="file:// or s3:// URI, or a local path."),
    recursive: bool = typer.Option(
        False, "-r", "--recursive", help="Every object below, not one level."
    ),
    human: bool = typer.Option(False, "-h", "--human-readable", help="Sizes in KiB, MiB, GiB."),
    output: str = OutputOpt,
) -> None:
    """List a store URI one level deep, like `aws s3 ls`: its folders (`PRE name/`) and its
    objects with times and sizes; --recursive lists every object below it. Nothing there:
    exit 1."""
    from datetime import datetime

    from trainctl.controller.artifacts import list_uri

    check_output(output)
    listing = list_uri(uri, recursive=recursive)
    root = listing.root
    if output == "json":
        print_json(
            [{"folder": root.url(f) + "/"} for f in listing.folders]
            + [{"key": root.url(i.key), "size": i.size, "mtime": i.mtime} for i in listing.files]
        )
        return
    for folder in listing.folders:
        sys.stdout.write(f"{'PRE':>32}  {folder}/\n")
    for info in listing.files:
        stamp = datetime.fromtimestamp(info.mtime).strftime("%Y-%m-%d %H:%M:%S")
        size = _size(info.size) if human else str(info.size)
        shown = info.key if not recursive else root.url(info.key)
        sys.stdout.write(f"{stamp}  {size:>10}  {shown}\n")
