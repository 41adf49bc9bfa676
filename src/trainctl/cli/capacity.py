"""`trainctl pools`, `trainctl types`, `trainctl warm` and `trainctl gc`: the capacity
configured, the instance types known, the warm capacity kept after jobs, and what dead jobs
left."""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainctl.cli.app import (
    EXIT_FAILED,
    OutputOpt,
    app,
    check_output,
    handle_errors,
    print_json,
)


@app.command()
@handle_errors
def pools(output: str = OutputOpt) -> None:
    """List the resource pools configured in config.yaml."""
    from rich.table import Table

    from trainctl.spec.home import trainctl_home
    from trainctl.spec.settings import get_settings
    from trainctl.terminal import console

    check_output(output)
    configured = get_settings().pools
    if output == "json":
        print_json({name: pool.model_dump(mode="json") for name, pool in configured.items()})
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
    console().print(table)


@app.command("types")
@handle_errors
def instance_types(
    pattern: str | None = typer.Argument(
        None, help="A shell glob on the name: 'p4*', '*.2xlarge', 'ml.c5.*'."
    ),
    gpus: bool = typer.Option(False, "--gpus", help="Only types with GPUs."),
    refresh: bool = typer.Option(
        False,
        "--refresh",
        help="Ask EC2's DescribeInstanceTypes for every type first (AWS credentials).",
    ),
    region: str | None = typer.Option(None, "--region", help="For --refresh (default: AWS's)."),
    output: str = OutputOpt,
) -> None:
    """The EC2 instance types trainctl knows (from DescribeInstanceTypes), with their GPUs,
    EFA interfaces and on-demand price."""
    from rich.table import Table

    from trainctl.spec.catalog import find_types
    from trainctl.terminal import console

    check_output(output)
    if refresh:
        from trainctl.provisioning.aws.preflight import refresh_instance_types

        count, where = refresh_instance_types(region)
        sys.stderr.write(f"trainctl types: {count} types from DescribeInstanceTypes in {where}\n")
    found = find_types(pattern, gpus=gpus)
    if output == "json":
        print_json([t.describe() for t in found])
        return
    table = Table(box=None, header_style="bold")
    for col in ("TYPE", "VCPUS", "MEMORY", "GPUS", "EFA", "NETWORK", "ON-DEMAND"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("VCPUS", "EFA") else "left")
    for t in found:
        shown = t.describe()
        table.add_row(
            t.name,
            str(t.vcpus),
            f"{t.memory_gib} GiB",
            shown["gpus_text"],
            str(t.efa_interfaces or "-"),
            t.network or "-",
            shown["price_text"],
        )
    console().print(table)
    sys.stdout.write(f"{len(found)} type(s)\n")


RegionOpt = typer.Option(
    None, "--region", help="Repeatable. Default: the pools' regions and AWS_DEFAULT_REGION."
)


def _regions(given: list[str] | None, *, required: bool = True) -> list[str]:
    from trainctl.provisioning.aws.clients import env_region
    from trainctl.spec.capacity import check_region
    from trainctl.spec.settings import get_settings

    regions = list(given or [])
    for name in regions:
        try:
            check_region(name)
        except ValueError as exc:
            from trainctl.errors import SpecError

            raise SpecError("--region", str(exc)) from None
    if not regions:
        pool_regions = {p.region for p in get_settings().pools.values() if p.region}
        regions = sorted(pool_regions | ({env_region()} - {None}))  # type: ignore[operator]
    if not regions and required:
        from trainctl.errors import SpecError

        raise SpecError("--region", "no region given, configured in a pool, or in AWS_REGION")
    return regions


def _release_warm(
    provider: Any, store: Any, region: str, names: list[str] | None, *, unusable_only: bool
) -> list[dict[str, Any]]:
    """End warm pools; their idle time goes into the cost of the jobs that left them."""
    import time

    from trainctl.controller.usage import record_idle

    released = []
    for pool, idle in provider.release_warm(region, names, unusable_only=unusable_only):
        record_idle(store, pool.from_job, idle)
        released.append(pool.summary(time.time()))
    return released


@app.command()
@handle_errors
def warm(
    region: list[str] | None = RegionOpt,
    release: list[str] | None = typer.Option(
        None, "--release", help="End this warm pool now (repeatable)."
    ),
    release_all: bool = typer.Option(False, "--release-all", help="End every warm pool now."),
    output: str = OutputOpt,
) -> None:
    """List warm capacity: EC2 instances kept up after a job (keep_alive_period_in_seconds)
    for the next job with the same capacity spec; --release ends them now."""
    import time

    from trainctl.errors import SpecError
    from trainctl.provisioning import get_provider
    from trainctl.store import default_store

    check_output(output)
    if release and release_all:
        raise SpecError("--release", "give pool names or --release-all, not both")
    provider: Any = get_provider("p3.2xlarge")  # the EC2 provider
    now = time.time()
    listed: list[dict[str, Any]] = []
    released: list[dict[str, Any]] = []
    for name in _regions(region):
        listed += [pool.summary(now) for pool in provider.warm_pools(name, mine=True)]
        if release or release_all:
            released += _release_warm(
                provider, default_store(), name, release or None, unusable_only=False
            )
    unknown = sorted(set(release or []) - {p["pool"] for p in listed})
    if unknown:
        raise SpecError("--release", f"no warm pool {unknown[0]!r}; `trainctl warm` lists them")
    if output == "json":
        print_json({"pools": listed, "released": released})
        return
    if not listed:
        sys.stdout.write("no warm capacity\n")
        return
    from rich.table import Table

    from trainctl.terminal import console

    table = Table(box=None, header_style="bold")
    for col in ("POOL", "REGION", "INSTANCES", "MARKET", "LEFT BY", "IDLE", "EXPIRES IN", "STATE"):
        table.add_column(col, no_wrap=True)
    gone = {p["pool"] for p in released}
    for p in listed:
        table.add_row(
            p["pool"],
            p["region"],
            f"{p['count']} x {p['instance_type']}",
            p["market"],
            p["from_job"],
            f"{p['idle_seconds']:.0f} s",
            f"{max(0.0, p['expires_in_seconds']):.0f} s",
            "released" if p["pool"] in gone else p["state"],
        )
    # Piped, the table keeps whole pool and job names rather than a terminal's 80 columns.
    console(highlight=False, width=None if sys.stdout.isatty() else 200).print(table)


@app.command()
@handle_errors
def gc(
    region: list[str] | None = RegionOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete; without it, only list."),
    output: str = OutputOpt,
) -> None:
    """Find (and with --yes delete) what ended jobs left behind: on this machine (node
    directories, claims on locations, and controller logs, which go into the job's store
    prefix), and in each EC2 region given or configured (cloud
    resources, warm capacity past its keep-alive or missing a member). SSH hosts need
    none: each job's teardown removes its directories there."""
    import time

    from trainctl.controller.remove import delete_local_leftovers, local_leftovers
    from trainctl.controller.submit import job_is_live
    from trainctl.store import default_store
    from trainctl.tuning.loop import stray_supervisor_logs

    check_output(output)
    regions = _regions(region, required=False)
    store = default_store()
    found: list[dict[str, Any]] = local_leftovers(store) + stray_supervisor_logs(store)
    failed: list[dict[str, Any]] = delete_local_leftovers(store, found) if yes else []
    if not regions:
        sys.stderr.write(
            "EC2 not searched: no region given (--region), configured in a pool, or in AWS_REGION\n"
        )
    provider: Any = None
    for name in regions:
        if provider is None:
            from trainctl.provisioning import get_provider

            provider = get_provider("p3.2xlarge")  # the EC2 provider
        now = time.time()
        unusable = [p for p in provider.warm_pools(name) if p.problem(now)]
        found += [
            {
                "kind": "warm-pool",
                "id": p.name,
                "job": p.from_job,
                "region": name,
                "state": p.problem(now),
                "instances": p.ids,
            }
            for p in unusable
        ]
        if yes and unusable:
            _release_warm(provider, store, name, [p.name for p in unusable], unusable_only=True)
        leftovers = provider.find_leftovers(name, lambda job: job_is_live(store, job))
        found += leftovers
        if yes and leftovers:
            failed += provider.delete_leftovers(name, leftovers)
    if output == "json":
        print_json({"found": found, "deleted": yes, "failed": failed})
    else:
        for item in found:
            sys.stdout.write(
                f"{item.get('region', 'local')} {item.get('kind', '')} {item.get('id', '')} "
                f"job={item.get('job', '')}\n"
            )
        verb = "deleted" if yes else "found (delete with --yes)"
        sys.stdout.write(f"{len(found) - len(failed)} leftover resource(s) {verb}\n")
        for item in failed:
            sys.stderr.write(f"could not delete {item.get('id')}: {item.get('error')}\n")
    if failed:
        raise typer.Exit(EXIT_FAILED)


@app.command("controller-policy")
@handle_errors
def controller_policy() -> None:
    """Print the IAM policy the EC2 controller's role needs (`--controller ec2`): trainctl's
    EC2 resources and the store's S3 prefix. Attach it to the role of the instance profile
    named by the controller_instance_profile setting."""
    from trainctl.errors import SpecError
    from trainctl.provisioning.aws.controller import controller_policy as policy
    from trainctl.store import default_store

    store = default_store()
    if not store.uri.startswith("s3://"):
        raise SpecError("TRAINCTL_STORE", f"an EC2 controller needs an s3:// store: {store.uri}")
    print_json(policy(store.uri))
