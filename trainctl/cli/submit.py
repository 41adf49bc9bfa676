"""`trainctl submit` and `trainctl build`: a job or an image from flags and a job file."""

from __future__ import annotations

import json
import sys
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
)


def _load_job_file(path: Path) -> dict[str, Any]:
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


@app.command()
@handle_errors
def submit(
    ctx: typer.Context,
    entry_point: str | None = typer.Argument(None, help="The training script."),
    source_dir: str | None = typer.Option(None, "--source-dir", help="Code directory."),
    instance_type: str | None = typer.Option(None, "--instance-type", help="'local' (default)."),
    instance_count: int | None = typer.Option(None, "--instance-count", help="Nodes."),
    min_instance_count: int | None = typer.Option(
        None,
        "--min-instance-count",
        help="Elastic: go on with as few as this many nodes when --instance-count cannot be had.",
    ),
    processes_per_host: int | None = typer.Option(None, "--processes-per-host"),
    distribution: str | None = typer.Option(
        None, "--distribution", help="torch_distributed | mpi | none (default: none)."
    ),
    hyperparameter: list[str] | None = typer.Option(
        None, "-p", "--hyperparameter", help="KEY=VALUE (JSON values: 8, 0.1, true)."
    ),
    input_: list[str] | None = typer.Option(None, "--input", help="CHANNEL=URI."),
    env: list[str] | None = typer.Option(None, "--env", help="K=V for the training script."),
    job_name: str | None = typer.Option(None, "--job-name"),
    output_path: str | None = typer.Option(None, "--output-path"),
    checkpoint_s3_uri: str | None = typer.Option(None, "--checkpoint-uri"),
    checkpoint_local_path: str | None = typer.Option(None, "--checkpoint-local-path"),
    max_run: int | None = typer.Option(None, "--max-run", help="Seconds before stopping."),
    image_uri: str | None = typer.Option(None, "--image"),
    build_image: bool | None = typer.Option(
        None, "--build-image", help="Build the job's image (see `trainctl build`)."
    ),
    framework_version: str | None = typer.Option(None, "--framework-version", help="e.g. 2.5.1"),
    py_version: str | None = typer.Option(None, "--py-version", help="e.g. py311"),
    dependency: list[str] | None = typer.Option(
        None, "--dependency", help="pip requirement for the built image; repeatable."
    ),
    base_image: str | None = typer.Option(None, "--base-image", help="FROM of the built image."),
    max_restarts: int | None = typer.Option(
        None, "--max-restarts", help="Relaunches after the user's code fails (default 0)."
    ),
    max_wait: int | None = typer.Option(
        None, "--max-wait", help="Seconds the whole job may take, waits and retries included."
    ),
    inject_fault: list[str] | None = typer.Option(
        None,
        "--inject-fault",
        help="kill:NODE@SECONDS or notice:NODE@SECONDS (NODE: rank or algo-N); repeatable.",
    ),
    pool: str | None = typer.Option(None, "--pool", help="A resource pool from config.yaml."),
    spot: bool | None = typer.Option(
        None, "--spot/--on-demand", help="EC2 market (default: on-demand)."
    ),
    on_demand_fallback: bool | None = typer.Option(
        None, "--on-demand-fallback", help="Spot capacity short: fall back to on-demand."
    ),
    fallback_instance_type: list[str] | None = typer.Option(
        None, "--fallback-instance-type", help="Next EC2 type to try; repeatable, in order."
    ),
    region: str | None = typer.Option(None, "--region", help="AWS region."),
    subnet: list[str] | None = typer.Option(None, "--subnet", help="Repeatable, in order."),
    security_group: list[str] | None = typer.Option(None, "--security-group", help="sg-..."),
    image_id: str | None = typer.Option(None, "--image-id", help="ami-... or resolve:ssm:NAME"),
    instance_profile: str | None = typer.Option(None, "--instance-profile"),
    volume_size: int | None = typer.Option(None, "--volume-size", help="Root volume GB."),
    keep_alive: int | None = typer.Option(
        None,
        "--keep-alive-period-in-seconds",
        "--keep-alive",
        help="Keep the job's EC2 instances warm this long after it (0-3600 s) for the next "
        "job with the same capacity spec; `trainctl warm` lists them.",
    ),
    host: list[str] | None = typer.Option(
        None, "--host", help="[USER@]ADDRESS[:PORT] of an SSH host; repeatable (ssh type)."
    ),
    ssh_key: str | None = typer.Option(None, "--ssh-key", help="Private key file for --host."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the requests and node commands; change nothing."
    ),
    estimate: bool = typer.Option(
        False, "--estimate", help="Print the expected hourly cost; launch nothing."
    ),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once the job is started."),
    controller: str | None = typer.Option(
        None,
        "--controller",
        help="Where the job's controller runs: local (this machine), ssh://[user@]host[:port], "
        "an ssh pool's name, or ec2 (trainctl's own small instance). A remote one keeps the "
        "job going when this machine goes away.",
    ),
    input_mode: list[str] | None = typer.Option(
        None,
        "--input-mode",
        help="CHANNEL=File (a copy of a file:// channel, the default) or CHANNEL=FastFile "
        "(a link to it: no copy of large data, but a script's writes reach the original).",
    ),
    workdir_max_mb: float | None = typer.Option(
        None,
        "--workdir-max-mb",
        help="The working directory is kept across relaunches: at most this many MB per node "
        "(default 1024; 0: not kept).",
    ),
    workdir_ignore: list[str] | None = typer.Option(
        None,
        "--workdir-ignore",
        help="gitignore-style pattern of working-directory files not to keep; repeatable.",
    ),
    secret_env: list[str] | None = typer.Option(
        None,
        "--secret-env",
        help="An --env NAME whose value is shown as <redacted> (names with SECRET, TOKEN, "
        "PASSWORD, KEY... already are); repeatable.",
    ),
    secret_hyperparameter: list[str] | None = typer.Option(
        None,
        "--secret-hyperparameter",
        help="A -p KEY whose value is shown as <redacted>; repeatable.",
    ),
    file: Path | None = typer.Option(None, "-f", "--file", help="job.yaml with Estimator fields."),
    output: str = OutputOpt,
) -> None:
    """Submit a training job; streams its logs and exits 0 only if it Completed.

    Words after `--` are the script's own arguments, before its hyperparameters:
    `trainctl submit multinode.py --instance-count 2 -- 50 10`."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.logs import LogPrinter
    from trainctl.controller.submit import create_job, default_store, start_detached
    from trainctl.errors import SpecError
    from trainctl.estimator import _print_summary
    from trainctl.spec.build import build_spec
    from trainctl.spec.parts import parse_distribution
    from trainctl.state import JobState

    check_output(output)
    fields: dict[str, Any] = _load_job_file(file) if file else {}
    arguments = (ctx.obj or {}).get("arguments")
    flags: dict[str, Any] = {
        "entry_point": entry_point,
        "arguments": arguments,
        "source_dir": str(Path(source_dir).resolve()) if source_dir else None,
        "instance_type": instance_type,
        "instance_count": instance_count,
        "min_instance_count": min_instance_count,
        "processes_per_host": processes_per_host,
        "job_name": job_name,
        "output_path": output_path,
        "checkpoint_s3_uri": checkpoint_s3_uri,
        "checkpoint_local_path": checkpoint_local_path,
        "max_run": max_run,
        "image_uri": image_uri,
        "build_image": build_image,
        "framework_version": framework_version,
        "py_version": py_version,
        "dependencies": dependency or None,
        "base_image": base_image,
        "max_restarts": max_restarts,
        "max_wait": max_wait,
        "faults": inject_fault or None,
        "pool": pool,
        "use_spot_instances": spot,
        "on_demand_fallback": on_demand_fallback,
        "fallback_instance_types": fallback_instance_type or None,
        "region": region,
        "subnets": subnet or None,
        "security_group_ids": security_group or None,
        "image_id": image_id,
        "instance_profile": instance_profile,
        "volume_size": volume_size,
        "keep_alive_period_in_seconds": keep_alive,
        "hosts": [parse_host(h, ssh_key) for h in host] if host else None,
        "controller": controller,
        "workdir_max_mb": workdir_max_mb,
        "workdir_ignore": workdir_ignore or None,
        "secret_env": secret_env or None,
        "secret_hyperparameters": secret_hyperparameter or None,
    }
    if host and instance_type is None and "instance_type" not in fields:
        flags["instance_type"] = "ssh"
    fields.update({k: v for k, v in flags.items() if v is not None})
    if distribution is not None:
        fields["distribution"] = parse_distribution(distribution)
    if file and "source_dir" not in fields and isinstance(fields.get("entry_point"), str):
        # an entry point from the file (with no source_dir anywhere) is relative to the file
        entry = Path(fields["entry_point"])
        if not entry.is_absolute() and entry_point is None:
            fields["entry_point"] = str((file.parent / entry).resolve())
    for key, values, typed, flag in (
        ("hyperparameters", hyperparameter, True, "-p"),
        ("inputs", input_, False, "--input"),
        ("environment", env, False, "--env"),
    ):
        if values:
            fields[key] = {**(fields.get(key) or {}), **parse_pairs(values, flag, typed=typed)}
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
    if detach or spec.controller != "local":
        start_detached(store, record)
    if spec.controller != "local" and not detach:
        # A remote controller runs the job: follow it here, as `trainctl attach` does.
        from trainctl.controller.supervise import supervise

        printer = LogPrinter(sys.stderr if output == "json" else sys.stdout)
        printer.info(f"job {record.name} submitted (controller {spec.controller})")
        final = supervise(store, record.name, printer=printer)
        _print_summary(printer, final)
        if output == "json":
            print_json(final.describe())
        if final.state is not JobState.COMPLETED:
            raise typer.Exit(EXIT_FAILED)
        return
    if detach:
        if output == "json":
            print_json(record.describe())
        else:
            sys.stdout.write(f"{record.name}\n")
            sys.stderr.write(
                f"job {record.name} started; follow it with `trainctl logs {record.name} -f`\n"
            )
        return
    printer = LogPrinter(sys.stderr if output == "json" else sys.stdout)
    printer.info(f"job {record.name} submitted (store {store.uri})")
    controller = Controller(store, record.name, printer=printer)
    final = controller.run()
    if controller.handed_off:  # the terminal closed: a detached controller runs the job
        raise typer.Exit(EXIT_HANGUP)
    _print_summary(printer, final)
    if output == "json":
        print_json(final.describe())
    if controller.interrupted_by_user:
        raise typer.Exit(EXIT_INTERRUPTED)
    if final.state is not JobState.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


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
    dependency: list[str] | None = typer.Option(
        None, "--dependency", help="pip requirement; repeatable."
    ),
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
    plan = plan_build(
        source_dir,
        entry_point,
        base_image=base_image,
        dependencies=dependency or [],
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

    user, _, rest = text.rpartition("@")
    address, port = rest, None
    if rest.startswith("["):
        address, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else None
    elif rest.count(":") == 1:
        address, port = rest.split(":")
    if not address or (port is not None and not port.isdigit()):
        raise SpecError("hosts", f"{text!r} is not [USER@]ADDRESS[:PORT]")
    out: dict[str, Any] = {"address": address}
    if user:
        out["user"] = user
    if port:
        out["port"] = int(port)
    if key_file:
        out["key_file"] = str(Path(key_file).expanduser())
    return out


def _plan(spec: Any, store: Any, output: str, *, dry_run: bool, estimate: bool) -> None:
    """`submit --dry-run` / `--estimate`: what the job would do and cost, nothing done."""
    from trainctl.controller.plan import plan_job
    from trainctl.provisioning import get_provider

    result: dict[str, Any] = plan_job(spec, store) if dry_run else {}
    if estimate:
        hourly = get_provider(spec.instance_type, spec.region).hourly_cost(spec)
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
            params = json.dumps(req["params"], sort_keys=True)
            sys.stdout.write(f"  {req['service']}.{req['operation']} {params}\n")
        for node in result["nodes"]:
            sys.stdout.write(f"  [{node['host']}] {' '.join(node['command'])}\n")
    if estimate:
        est = result["estimate"]
        cost = est["usd_per_hour"]
        price = "no price known" if cost is None else f"${cost:.2f}/hour"
        sys.stdout.write(
            f"estimate: {est['instance_count']} x {est['instance_type']} "
            f"({est['market']}): {price}\n"
        )
