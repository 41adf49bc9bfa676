"""`trainctl submit` and `trainctl build`: a job or an image from flags and a job file."""

from __future__ import annotations

import inspect
import json
import shlex
import sys
import typing
from pathlib import Path
from typing import Any

import typer

from trainctl.cli.app import (
    EXIT_FAILED,
    EXIT_HANGUP,
    EXIT_INTERRUPTED,
    OutputOpt,
    app,
    check_output,
    handle_errors,
    parse_pairs,
    print_json,
    whole_number,
)


def load_job_file(path: Path) -> dict[str, Any]:
    from trainctl.errors import SpecError
    from trainctl.spec.yamlfile import load_yaml

    try:
        data = load_yaml(path.read_text(encoding="utf-8"), "-f", str(path))
    except OSError as exc:
        raise SpecError("-f", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError("-f", f"{path} is not UTF-8 text") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError("-f", f"{path} must hold a mapping of Estimator fields")
    if bad := [k for k in data if not isinstance(k, str)]:
        raise SpecError("-f", f"{path}: keys must be field names, got {bad[0]!r}")
    for key in ("hyperparameters", "environment"):
        if key in data and not isinstance(data[key], dict):
            raise SpecError(key, f"in {path} must be a mapping")
    if isinstance(data.get("inputs"), str):
        data["inputs"] = {"training": data["inputs"]}
    elif "inputs" in data and not isinstance(data["inputs"], dict):
        raise SpecError("inputs", f"in {path} must be a URI or a mapping of channel: URI")
    # Paths in the file are relative to the file, not to wherever trainctl runs.
    if isinstance(data.get("source_dir"), str) and not Path(data["source_dir"]).is_absolute():
        data["source_dir"] = str((path.parent / data["source_dir"]).resolve())
    return data


# `trainctl submit`'s options that are not job fields; the job fields' options are made
# from JobSpec (trainctl.spec.fields), so a new field needs no edit here.
def _submit_options() -> list[inspect.Parameter]:
    P = inspect.Parameter

    def option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
        return P(name, P.KEYWORD_ONLY, default=default, annotation=annotation)

    return [
        option(
            "ssh_key",
            str | None,
            typer.Option(None, "--ssh-key", help="Private key file for --hosts."),
        ),
        option(
            "input_mode",
            list[str] | None,
            typer.Option(
                None,
                "--input-mode",
                metavar="CHANNEL=MODE",
                help="CHANNEL=File (a copy of a file:// channel, the default) or "
                "CHANNEL=FastFile (a link to it: no copy of large data, but a script's writes "
                "reach the original); SageMaker's input_mode, per channel.",
            ),
        ),
        option(
            "dry_run",
            bool,
            typer.Option(
                False, "--dry-run", help="Print the requests and node commands; change nothing."
            ),
        ),
        option(
            "estimate",
            bool,
            typer.Option(
                False, "--estimate", help="Print the expected hourly cost; launch nothing."
            ),
        ),
        option(
            "detach",
            bool,
            typer.Option(False, "--detach", "-d", help="Return once the job is started."),
        ),
        option(
            "file",
            Path | None,
            typer.Option(None, "-f", "--file", help="job.yaml with job fields (the same names)."),
        ),
        option("output", str, OutputOpt),
    ]


def _field_options() -> tuple[list[inspect.Parameter], dict[str, tuple[str, str]]]:
    """One option per job field (`--<field-name>`), and a hidden one per old spelling.
    Returns the parameters and {old parameter: (field, old flag)}."""
    from trainctl.spec.fields import job_fields

    P = inspect.Parameter
    params: list[inspect.Parameter] = []
    old: dict[str, tuple[str, str]] = {}
    for field in job_fields():
        door = field.door
        if door.cli == "argument":
            continue  # ENTRY_POINT, and the script's arguments after `--`
        if door.cli == "flag":
            decls = [f"{field.flag}/--no-{field.flag[2:]}"]
            annotation: Any = bool | None
        elif door.cli == "value":
            decls = [field.flag]
            annotation = field.value_type | None
        elif door.cli == "own" and typing.get_origin(field.value_type) is not list:
            decls = [field.flag]
            annotation = str | None
        else:  # repeated, pairs, typed, own lists: one item per flag
            decls = [field.flag]
            annotation = list[str] | None
        if door.short:
            decls.append(door.short)
        params.append(
            P(
                field.name,
                P.KEYWORD_ONLY,
                annotation=annotation,
                default=typer.Option(
                    None,
                    *decls,
                    help=door.help,
                    metavar=door.metavar,
                    autocompletion=_choices(door.metavar),
                    parser=whole_number if annotation == int | None else None,
                ),
            )
        )
        for index, flag in enumerate(door.old_flags):
            name = f"old_{field.name}_{index}"
            old[name] = (field.name, flag)
            params.append(
                P(
                    name,
                    P.KEYWORD_ONLY,
                    annotation=annotation,
                    default=typer.Option(None, flag, hidden=True, metavar=door.metavar),
                )
            )
    return params + _plugin_options(), old


PLUGIN_PARAM = "plugin__"  # plugin__<plug-in>__<option>: an installed plug-in's own flag


def _plugin_options() -> list[inspect.Parameter]:
    """`--<plug-in>-<option>` for each option of each installed provider plug-in (its
    `options` model: the fields are declared once, in the plug-in)."""
    from trainctl.spec.catalog import plugin_blocks
    from trainctl.spec.fields import _without_none

    P = inspect.Parameter
    params = []
    for plugin, model in sorted(plugin_blocks().items()):
        for name, info in model.model_fields.items():
            flag = f"--{plugin}-{name.replace('_', '-')}"
            kind = _without_none(info.annotation)
            if kind is bool:
                decls, annotation = [f"{flag}/--no-{flag[2:]}"], bool | None
            elif typing.get_origin(kind) is list:
                decls, annotation = [flag], list[str] | None
            elif kind is int:
                decls, annotation = [flag], int | None
            else:
                decls, annotation = [flag], str | None
            default = typer.Option(
                None,
                *decls,
                help=f"{info.description or name} ({plugin}).",
                parser=whole_number if kind is int else None,
            )
            params.append(
                P(f"{PLUGIN_PARAM}{plugin}__{name}", P.KEYWORD_ONLY, annotation=annotation,
                  default=default)
            )  # fmt: skip
    return params


def _given_plugin_options(given: dict[str, Any], fields: dict[str, Any]) -> None:
    """The plug-in flags given, into `fields`' provider_options (over a job file's)."""
    for param, value in given.items():
        if not param.startswith(PLUGIN_PARAM) or value is None or value == []:
            continue
        plugin, name = param[len(PLUGIN_PARAM) :].split("__", 1)
        if isinstance(fields.get(plugin), dict):  # the job file's `<plug-in>:` block
            fields[plugin] = {**fields[plugin], name: value}
            continue
        earlier = fields.get("provider_options")
        blocks = dict(earlier) if isinstance(earlier, dict) else {}
        block = blocks.get(plugin)
        blocks[plugin] = {**(block if isinstance(block, dict) else {}), name: value}
        fields["provider_options"] = blocks


def _choices(metavar: str | None) -> Any:
    """TAB completion for a field whose values are a few words (`torch_distributed|mpi|
    none`): those that start with what is typed; None for any other field."""
    import re

    if not metavar or not re.fullmatch(r"[a-z_]+(\|[a-z_]+)+", metavar):
        return None
    words = metavar.split("|")
    return lambda incomplete: [w for w in words if w.startswith(incomplete)]


FIELD_OPTIONS, OLD_FLAGS = _field_options()


def fields_from_options(options: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The job fields given as options, on top of `base` (the job file's): a mapping's
    KEY=VALUE pairs are added to the file's, every other option replaces its field. An old
    flag spelling counts as the new one, with one deprecation line."""
    from trainctl.cli.app import warn
    from trainctl.spec.fields import job_fields

    given = dict(options)
    for name, (field, flag) in OLD_FLAGS.items():
        value = given.pop(name, None)
        if value is None or value == []:
            continue
        new = "--" + field.replace("_", "-")
        if "/" in flag:  # a switch and its negation (--spot/--on-demand)
            on, off = flag.split("/")
            flag, new = (on, new) if value else (off, "--no-" + new[2:])
        warn(f"{flag} is deprecated; use {new}")
        if isinstance(value, list):
            given[field] = [*(given.get(field) or []), *value]
        elif given.get(field) is None:
            given[field] = value
    fields = dict(base)
    for field in job_fields():
        value = given.get(field.name)
        if value is None or value == [] or field.door.cli == "argument":
            continue
        flag = f"{field.door.short}/{field.flag}" if field.door.short else field.flag
        kind = field.door.cli
        if kind in ("pairs", "typed"):
            pairs = parse_pairs(value, flag, typed=kind == "typed")
            earlier = fields.get(field.name)
            fields[field.name] = {**(earlier if isinstance(earlier, dict) else {}), **pairs}
        elif kind == "own":
            fields[field.name] = OWN_PARSERS[field.name](value, given)
        else:
            fields[field.name] = value
    _given_plugin_options(given, fields)
    return fields


def _parse_metric_definitions(values: list[str], _: dict[str, Any]) -> list[dict[str, str]]:
    from trainctl.errors import SpecError

    out = []
    for item in values:
        name, sep, regex = item.partition("=")
        if not sep or not name.strip():
            raise SpecError("--metric-definitions", f"{item!r} must be NAME=REGEX")
        out.append({"Name": name.strip(), "Regex": regex})
    return out


def _parse_distribution(value: str, _: dict[str, Any]) -> Any:
    from trainctl.spec.parts import parse_distribution

    return parse_distribution(value)


def _parse_hosts(values: list[str], given: dict[str, Any]) -> list[dict[str, Any]]:
    return [parse_host(text, given.get("ssh_key")) for text in values]


# The `own` doors (trainctl.spec.fields): a field whose flag is not a plain value or list.
OWN_PARSERS = {
    "distribution": _parse_distribution,
    "metric_definitions": _parse_metric_definitions,
    "hosts": _parse_hosts,
}


@handle_errors
def submit(ctx: typer.Context, entry_point: str | None = None, **options: Any) -> None:
    """Submit a training job; streams its logs and exits 0 only if it Completed.

    Words after `--` are the script's own arguments, before its hyperparameters:
    `trainctl submit multinode.py --instance-count 2 -- 50 10`."""
    from trainctl.controller.submit import create_job, run_job
    from trainctl.errors import SpecError
    from trainctl.spec.build import build_spec
    from trainctl.store import default_store

    output = options.pop("output")
    file: Path | None = options.pop("file")
    dry_run, estimate, detach = (
        options.pop("dry_run"),
        options.pop("estimate"),
        options.pop("detach"),
    )
    input_mode = options.pop("input_mode")
    check_output(output)
    base: dict[str, Any] = load_job_file(file) if file else {}
    arguments = (ctx.obj or {}).get("arguments")
    fields = fields_from_options(options, base)
    if entry_point is not None:
        fields["entry_point"] = entry_point
    if arguments is not None:
        fields["arguments"] = arguments
    if options.get("source_dir"):
        fields["source_dir"] = str(Path(options["source_dir"]).resolve())
    if fields.get("hosts") and options.get("instance_type") is None and "instance_type" not in base:
        fields["instance_type"] = "ssh"
    if file and "source_dir" not in fields and isinstance(fields.get("entry_point"), str):
        # an entry point from the file (with no source_dir anywhere) is relative to the file
        entry = Path(fields["entry_point"])
        if not entry.is_absolute() and entry_point is None:
            fields["entry_point"] = str((file.parent / entry).resolve())
    if input_mode:
        fields["channel_config"] = _channel_modes(
            fields.get("channel_config"), parse_pairs(input_mode, "--input-mode")
        )
    if arguments is not None and not fields.get("entry_point"):
        raise SpecError(
            "entry_point",
            "is required before `--`: trainctl submit ENTRY_POINT [OPTIONS] -- ARG ...",
        )
    spec = build_spec(**fields)
    store = default_store()
    if dry_run or estimate:
        _plan(spec, store, output, dry_run=dry_run, estimate=estimate)
        return
    record = create_job(spec, store)
    if detach:
        run_job(store, record, wait=False)
        if output == "json":
            print_json(record.describe())
        else:
            sys.stdout.write(f"{record.name}\n")
            sys.stderr.write(
                f"job {record.name} started; follow it with `trainctl logs {record.name} -f`\n"
            )
        return
    from trainctl.controller.logs import LogPrinter

    printer = LogPrinter(sys.stderr if output == "json" else sys.stdout)
    outcome = run_job(store, record, printer=printer, follow_after_hand_off=False)
    if outcome.handed_off:  # the terminal closed: a detached controller runs the job
        raise typer.Exit(EXIT_HANGUP)
    if output == "json":
        print_json(outcome.record.describe())
    if outcome.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if not outcome.completed:
        raise typer.Exit(EXIT_FAILED)


def _register_submit() -> None:
    P = inspect.Parameter
    head = [
        P("ctx", P.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        P(
            "entry_point",
            P.POSITIONAL_OR_KEYWORD,
            annotation=str | None,
            default=typer.Argument(None, help="The training script."),
        ),
    ]
    submit.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*head, *FIELD_OPTIONS, *_submit_options()]
    )
    app.command()(submit)


_register_submit()


def _channel_modes(config: Any, modes: dict[str, str]) -> dict[str, Any]:
    """The job file's channel_config with `--input-mode CHANNEL=MODE` on top."""
    merged = dict(config) if isinstance(config, dict) else {}
    for channel, mode in modes.items():
        entry = merged.get(channel)
        merged[channel] = {**(entry if isinstance(entry, dict) else {}), "input_mode": mode}
    return merged


@app.command()
@handle_errors
def build(
    source_dir: str = typer.Option(..., "--source-dir", help="Code directory."),
    entry_point: str = typer.Option(..., "--entry-point", help="The training script."),
    base_image: str | None = typer.Option(
        None, "--base-image", help="FROM image (default: the framework image)."
    ),
    framework_version: str | None = typer.Option(None, "--framework-version", help="e.g. 2.5.1"),
    py_version: str | None = typer.Option(None, "--py-version", help="e.g. py311"),
    gpu: bool = typer.Option(False, "--gpu", help="The framework image's GPU flavour."),
    dependencies: list[str] | None = typer.Option(
        None, "--dependencies", help="pip requirement; repeatable.", metavar="REQUIREMENT"
    ),
    old_dependency: list[str] | None = typer.Option(None, "--dependency", hidden=True),
    push: str | None = typer.Option(
        None, "--push", help="Repository to push to: HOST[:PORT]/NAME or an ECR URI."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the Dockerfile and the build context; build nothing."
    ),
    output: str = OutputOpt,
) -> None:
    """Build the job's container image (and push it); prints the image reference."""
    from trainctl.image.build import build_image, plan_build

    check_output(output)
    if old_dependency:
        from trainctl.cli.app import warn

        warn("--dependency is deprecated; use --dependencies")
        dependencies = [*(dependencies or []), *old_dependency]
    plan = plan_build(
        source_dir,
        entry_point,
        base_image=base_image,
        dependencies=dependencies or [],
        framework_version=framework_version,
        py_version=py_version,
        gpu=gpu,
        repository=push,
    )
    if dry_run:
        if output == "json":
            print_json(
                {
                    "image": plan.image,
                    "base_image": plan.base_image,
                    "dockerfile": plan.dockerfile,
                    "context": plan.context_files(),
                }
            )
        else:
            sys.stdout.write(plan.dockerfile + "\n" + "\n".join(plan.context_files()) + "\n")
        return
    ref = build_image(plan, push=push is not None)
    if output == "json":
        print_json(
            {
                "image": ref.image,
                "repository": ref.repository,
                "tag": ref.tag,
                "built": ref.built,
                "pushed": ref.pushed,
            }
        )
    else:
        if not ref.built and not ref.pushed:
            sys.stderr.write(f"{ref.image} {ref.skipped_reason}; nothing to build\n")
        sys.stdout.write(f"{ref.image}\n")


def parse_host(text: str, key_file: str | None) -> dict[str, Any]:
    """`[USER@]ADDRESS[:PORT]` (IPv6 in brackets) into SshHost fields."""
    from trainctl.errors import SpecError
    from trainctl.spec.capacity import parse_ssh_target

    try:
        target = parse_ssh_target(text)
    except ValueError as exc:
        raise SpecError("hosts", str(exc)) from None
    out: dict[str, Any] = {"address": target.address}
    if target.user:
        out["user"] = target.user
    if target.port is not None:
        out["port"] = target.port
    if key_file:
        out["key_file"] = str(Path(key_file).expanduser())
    return out


def _plan(spec: Any, store: Any, output: str, *, dry_run: bool, estimate: bool) -> None:
    """`submit --dry-run` / `--estimate`: what the job would do and cost, nothing done."""
    from trainctl.controller.plan import plan_job
    from trainctl.provisioning import get_provider

    result: dict[str, Any] = plan_job(spec, store) if dry_run else {}
    if estimate:
        from trainctl.provisioning.base import Billing
        from trainctl.spec.request import CapacityRequest

        provider = get_provider(spec.instance_type, spec.region)
        request = CapacityRequest.of(spec)
        hourly = provider.hourly_cost(request) if isinstance(provider, Billing) else None
        result["estimate"] = {
            "instance_type": spec.instance_type,
            "instance_count": spec.instance_count,
            "market": "spot" if spec.use_spot_instances else "on-demand",
            "usd_per_hour": None if hourly is None else round(hourly, 4),
        }
    if output == "json":
        print_json(result)
        return
    if dry_run:
        sys.stdout.write(f"job {result['job']} on {result['provider']} (dry run)\n")
        if result.get("capacity"):
            sys.stdout.write(f"  capacity: {result['capacity']}\n")
        for req in result["requests"]:
            params = dict(req["params"])
            script = params.pop("script", None)  # a batch script: shown as it would be sent
            line = json.dumps(params, sort_keys=True)
            sys.stdout.write(f"  {req['service']}.{req['operation']} {line}\n")
            if isinstance(script, str):
                sys.stdout.write("".join(f"    | {row}\n" for row in script.splitlines()))
        for node in result["nodes"]:
            agent = node.get("agent") or []
            if agent and "trainctl.node.agent" not in agent[:3]:  # started through srun, ...
                sys.stdout.write(f"  [{node['host']}] agent: {shlex.join(agent)}\n")
            sys.stdout.write(f"  [{node['host']}] {' '.join(node['command'])}\n")
    if estimate:
        est = result["estimate"]
        cost = est["usd_per_hour"]
        price = "no price known" if cost is None else f"${cost:.2f}/hour"
        sys.stdout.write(
            f"estimate: {est['instance_count']} x {est['instance_type']} "
            f"({est['market']}): {price}\n"
        )
