"""The `trainctl` command: a thin layer over the Python API (no logic of its own).

Only typer is imported at module load; everything else loads inside the command that needs
it, so `trainctl --help` is instant.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
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


def _err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def handle_errors(fn):
    """Turn trainctl errors into one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from trainctl.errors import SpecError, TrainctlError

        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except TrainctlError as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def _check_output(output: str) -> None:
    if output not in ("text", "json"):
        from trainctl.errors import SpecError

        raise SpecError("--output", f"unknown format {output!r}; allowed: text, json")


def _print_json(data: Any) -> None:
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
        else:
            out[key] = value
    return out


def _load_job_file(path: Path) -> dict[str, Any]:
    import yaml

    from trainctl.errors import SpecError

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError("-f", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError("-f", f"{path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise SpecError("-f", f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
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
    entry_point: str | None = typer.Argument(None, help="The training script."),
    source_dir: str | None = typer.Option(None, "--source-dir", help="Code directory."),
    instance_type: str | None = typer.Option(None, "--instance-type", help="'local' (default)."),
    instance_count: int | None = typer.Option(None, "--instance-count", help="Nodes."),
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
    file: Path | None = typer.Option(None, "-f", "--file", help="job.yaml with Estimator fields."),
    output: str = OutputOpt,
) -> None:
    """Submit a training job; streams its logs and exits 0 only if it Completed."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.logs import LogPrinter
    from trainctl.controller.submit import create_job, default_store, spawn_controller
    from trainctl.estimator import _print_summary
    from trainctl.spec.job import build_spec, parse_distribution
    from trainctl.state import JobState

    _check_output(output)
    fields: dict[str, Any] = _load_job_file(file) if file else {}
    flags: dict[str, Any] = {
        "entry_point": entry_point,
        "source_dir": str(Path(source_dir).resolve()) if source_dir else None,
        "instance_type": instance_type,
        "instance_count": instance_count,
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
        "hosts": [parse_host(h, ssh_key) for h in host] if host else None,
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
    spec = build_spec(**fields)
    store = default_store()
    if dry_run or estimate:
        _plan(spec, store, output, dry_run=dry_run, estimate=estimate)
        return
    record = create_job(spec, store)
    if detach:
        spawn_controller(store, record.name)
        if output == "json":
            _print_json(record.describe())
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
    _print_summary(printer, final)
    if output == "json":
        _print_json(final.describe())
    if controller.interrupted_by_user:
        raise typer.Exit(EXIT_INTERRUPTED)
    if final.state is not JobState.COMPLETED:
        raise typer.Exit(EXIT_FAILED)


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

    _check_output(output)
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
            _print_json(
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
        _print_json(
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
        _print_json(result)
        return
    if dry_run:
        sys.stdout.write(f"job {result['job']} on {result['provider']} (dry run)\n")
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


@app.command()
@handle_errors
def pools(output: str = OutputOpt) -> None:
    """List the resource pools configured in config.yaml."""
    from rich.console import Console
    from rich.table import Table

    from trainctl.settings import get_settings, trainctl_home

    _check_output(output)
    configured = get_settings().pools
    if output == "json":
        _print_json({name: pool.model_dump(mode="json") for name, pool in configured.items()})
        return
    if not configured:
        sys.stdout.write(f"no pools; add a 'pools:' section to {trainctl_home() / 'config.yaml'}\n")
        return
    table = Table(box=None, header_style="bold")
    for col in ("POOL", "PROVIDER", "REGION", "INSTANCE TYPES", "MARKET", "MAX"):
        table.add_column(col, no_wrap=True)
    for name, pool in sorted(configured.items()):
        types = ", ".join(pool.instance_types) or (
            f"{len(pool.hosts)} host(s)" if pool.hosts else "-"
        )
        market = "-"
        if pool.provider == "aws":
            market = "spot" if pool.use_spot_instances else "on-demand"
            if pool.use_spot_instances and pool.on_demand_fallback:
                market += " (on-demand fallback)"
        table.add_row(
            name,
            pool.provider,
            pool.region or "-",
            types,
            market,
            str(pool.max_instances or "-"),
        )
    Console().print(table)


@app.command()
@handle_errors
def gc(
    region: list[str] | None = typer.Option(
        None, "--region", help="Repeatable. Default: the pools' regions and AWS_DEFAULT_REGION."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete; without it, only list."),
    output: str = OutputOpt,
) -> None:
    """Find (and with --yes delete) cloud resources that ended jobs left behind."""
    from trainctl.controller.submit import default_store, job_is_live
    from trainctl.provisioning import get_provider
    from trainctl.provisioning.aws.clients import env_region
    from trainctl.settings import get_settings

    _check_output(output)
    regions = list(region or [])
    if not regions:
        pool_regions = {p.region for p in get_settings().pools.values() if p.region}
        regions = sorted(pool_regions | ({env_region()} - {None}))  # type: ignore[operator]
    if not regions:
        from trainctl.errors import SpecError

        raise SpecError("--region", "no region given, configured in a pool, or in AWS_REGION")
    store = default_store()
    provider: Any = get_provider("p3.2xlarge")  # the EC2 provider
    found: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for name in regions:
        leftovers = provider.find_leftovers(name, lambda job: job_is_live(store, job))
        found += leftovers
        if yes and leftovers:
            failed += provider.delete_leftovers(name, leftovers)
    if output == "json":
        _print_json({"found": found, "deleted": yes, "failed": failed})
    else:
        for item in found:
            sys.stdout.write(
                f"{item.get('region', '')} {item.get('kind', '')} {item.get('id', '')} "
                f"job={item.get('job', '')}\n"
            )
        verb = "deleted" if yes else "found (delete with --yes)"
        sys.stdout.write(f"{len(found) - len(failed)} leftover resource(s) {verb}\n")
        for item in failed:
            sys.stderr.write(f"could not delete {item.get('id')}: {item.get('error')}\n")
    if failed:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@handle_errors
def jobs(output: str = OutputOpt) -> None:
    """List jobs, newest first."""
    from rich.console import Console
    from rich.table import Table

    from trainctl.controller.submit import default_store
    from trainctl.record import list_jobs

    _check_output(output)
    records = list_jobs(default_store())
    if output == "json":
        _print_json([r.describe() for r in records])
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "STATE", "INSTANCES", "CREATED", "DURATION", "ATTEMPTS"):
        table.add_column(col, no_wrap=True)
    for r in records:
        table.add_row(
            r.name,
            _state_text(r.state.value),
            f"{r.spec.instance_count} x {r.spec.instance_type}",
            r.created_at.replace("T", " ")[:19],
            _duration(r.duration_s),
            str(len(r.attempts)),
        )
    Console().print(table)


def _state_text(state: str) -> Any:
    from rich.text import Text

    colour = {"Completed": "green", "Failed": "red", "Stopped": "yellow"}.get(state, "cyan")
    return Text(state, style=colour)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


@app.command()
@handle_errors
def status(job: str = typer.Argument(..., help="Job name."), output: str = OutputOpt) -> None:
    """Show a job's state, attempts, failure reason and model."""
    from rich.console import Console
    from rich.table import Table

    from trainctl.controller.submit import default_store
    from trainctl.record import JobStore

    _check_output(output)
    record = JobStore(default_store(), job).load()
    info = record.describe()
    if output == "json":
        _print_json(info)
        return
    console = Console(highlight=False)
    table = Table(box=None, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows = [
        ("name", record.name),
        ("state", _state_text(record.state.value)),
        ("instances", f"{record.spec.instance_count} x {record.spec.instance_type}"),
        ("launcher", record.spec.launcher),
        ("entry point", f"{record.spec.entry_point} (in {record.spec.source_dir})"),
        ("created", record.created_at),
        ("duration", _duration(record.duration_s)),
        ("exit code", "-" if record.exit_code is None else str(record.exit_code)),
        ("model", record.model_data or "-"),
        ("store", info["store"]),
    ]
    if record.metrics:
        rows.append(("metrics", ", ".join(f"{k}={v:g}" for k, v in record.metrics.items())))
    if record.stop_reason:
        rows.append(("stopped", record.stop_reason))
    if record.failure_reason:
        rows.append(("failure", record.failure_reason))
    if (cost := info["cost"]) is not None:
        rows.append(("cost", _cost_text(cost)))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if record.failure_detail:
        console.print(record.failure_detail, markup=False)
    if record.attempts:
        attempts = Table(title="attempts", title_justify="left", box=None, header_style="bold")
        for col in ("#", "STARTED", "ENDED", "OUTCOME", "RESUMED", "LAST STEP", "LOST"):
            attempts.add_column(col, no_wrap=True)
        attempts.add_column("CAUSE", overflow="fold")

        def num(value: int | None) -> str:
            return "-" if value is None else str(value)

        for a in record.attempts:
            attempts.add_row(
                str(a.number),
                a.started_at[11:19],
                (a.ended_at or "")[11:19] or "-",
                a.outcome or "running",
                num(a.resumed_from_step),
                num(a.last_step),
                num(a.steps_lost),
                a.cause or "-",
            )
        console.print(attempts)


def _cost_text(cost: dict[str, Any]) -> str:
    hours = cost["instance_seconds"] / 3600
    if cost["usd"] is None:
        return f"{hours:.2f} instance-hours (no price known)"
    text = f"${cost['usd']:.2f} for {hours:.2f} instance-hours"
    if cost["spot_savings_usd"]:
        text += f"; spot saved ${cost['spot_savings_usd']:.2f} of ${cost['on_demand_usd']:.2f}"
    if cost["unpriced_instances"]:
        text += f" ({cost['unpriced_instances']} instance(s) without a price not counted)"
    return text


@app.command()
@handle_errors
def logs(
    job: str = typer.Argument(..., help="Job name."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends."),
) -> None:
    """Print every node's log (all attempts) from the store."""
    from trainctl.estimator import TrainingJob

    TrainingJob.attach(job).logs(follow=follow)


@app.command()
@handle_errors
def stop(job: str = typer.Argument(..., help="Job name.")) -> None:
    """Stop a running job: every node's processes are ended."""
    from trainctl.estimator import TrainingJob

    info = TrainingJob.attach(job).stop(wait=True)
    sys.stdout.write(f"{job}: {info['state']}\n")


@app.command()
@handle_errors
def artifacts(
    job: str = typer.Argument(..., help="Job name."),
    action: str | None = typer.Argument(None, help="'get' to download one file."),
    path: str | None = typer.Argument(None, help="With get: the file, relative to the job."),
    dest: str | None = typer.Argument(None, help="With get: where to save it."),
    output: str = OutputOpt,
) -> None:
    """Browse a job's files in the store (model, outputs, logs, checkpoints); `get` one."""
    from trainctl.controller.artifacts import download_artifact, job_artifacts
    from trainctl.controller.submit import default_store
    from trainctl.errors import SpecError

    _check_output(output)
    store = default_store()
    if action is None:
        groups = job_artifacts(store, job)
        if output == "json":
            _print_json(
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
        raise SpecError("PATH", "give the file to download, e.g. output/model.tar.gz")
    saved = download_artifact(store, job, path, Path(dest) if dest else None)
    sys.stdout.write(f"{saved}\n")


def _print_tree(groups: list[tuple[str, list[Any]]]) -> None:
    from rich.console import Console
    from rich.tree import Tree

    console = Console(highlight=False)
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
        console.print(tree)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@app.command("ls")
@handle_errors
def ls_(
    uri: str = typer.Argument(..., help="file:// or s3:// URI."), output: str = OutputOpt
) -> None:
    """List the objects under a store URI with sizes."""
    from datetime import datetime

    from trainctl.store import open_store

    _check_output(output)
    store = open_store(uri, field="URI")
    infos = list(store.list(""))
    if output == "json":
        _print_json([{"key": i.key, "size": i.size, "mtime": i.mtime} for i in infos])
        return
    for info in infos:
        stamp = datetime.fromtimestamp(info.mtime).strftime("%Y-%m-%d %H:%M:%S")
        sys.stdout.write(f"{stamp}  {info.size:>12}  {store.url(info.key)}\n")


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
        _err(f"{one_line(exc.format_message())} (see '{where} --help')")
        code = EXIT_BAD_INPUT
    except click_error as exc:
        _err(exc.format_message())
        code = exc.exit_code
    except typer.Abort:
        code = EXIT_INTERRUPTED
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
