"""`trainctl pools` and `trainctl gc`: the capacity configured, and what dead jobs left."""

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
    from rich.console import Console
    from rich.table import Table

    from trainctl.settings import get_settings, trainctl_home

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

    check_output(output)
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
        print_json({"found": found, "deleted": yes, "failed": failed})
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


@app.command("controller-policy")
@handle_errors
def controller_policy() -> None:
    """Print the IAM policy the EC2 controller's role needs (`--controller ec2`): trainctl's
    EC2 resources and the store's S3 prefix. Attach it to the role of the instance profile
    named by the controller_instance_profile setting."""
    from trainctl.controller.submit import default_store
    from trainctl.errors import SpecError
    from trainctl.provisioning.aws.controller import controller_policy as policy

    store = default_store()
    if not store.uri.startswith("s3://"):
        raise SpecError("TRAINCTL_STORE", f"an EC2 controller needs an s3:// store: {store.uri}")
    print_json(policy(store.uri))
