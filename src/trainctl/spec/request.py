"""What a provider is asked for: a job's capacity, not the whole job.

A provider plans, provisions and prices a `CapacityRequest` (type, count, market, where its
nodes' containers and data come from) and sees none of the job's script, hyperparameters or
secrets. An elastic resize is `request.with_count(n)`; the job's own `instance_count` keeps
meaning its full size. Options only one provider reads sit in that provider's block
(`request.aws`, `request.ssh`); the job spec keeps them flat, as SageMaker's arguments are.

Every field here is a JobSpec field of the same name and type (tests/unit/test_fields.py
checks it), so a job field is still declared once: this is a view, made by `of(spec)`. A
job file (or `build_spec`) may also group a provider's options under its block's name
(`aws: {subnets: [...], instance_profile: ...}`, `ssh: {hosts: [...]}`), as SkyPilot's
YAML does; `flatten_blocks` turns that into the flat fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trainctl.errors import SpecError
from trainctl.spec.options import AwsOptions, SshOptions, View

if TYPE_CHECKING:
    from trainctl.spec.job import JobSpec


__all__ = ["BLOCKS", "AwsOptions", "CapacityRequest", "SshOptions", "flatten_blocks"]


class CapacityRequest(View):
    """One attempt's capacity: what a provider's plan, provision and price work on."""

    # The fields of one provision call, not of the job: the controller sets them per call.
    PER_CALL: ClassVar[frozenset[str]] = frozenset({"retry_for"})

    instance_type: str
    fallback_instance_types: list[str] = []
    instance_count: int
    processes_per_host: int | None = None
    region: str | None = None
    use_spot_instances: bool = False
    on_demand_fallback: bool = False
    # Seconds of training asked for: what a scheduler's time limit follows (Slurm's --time).
    max_run: int = 86400
    # How long one provision call's own capacity retries may take (EC2's rounds), in seconds;
    # None: the provider's default. (Not the job's max_wait, its whole budget: the controller
    # bounds each call by what is left of that.)
    retry_for: int | None = None
    # The image every node's agent runs in (None: plain processes on the node).
    image_uri: str | None = None
    # Data locations a node mounts when it runs in a container on a host path (file://).
    checkpoint_s3_uri: str | None = None
    output_path: str | None = None
    tensorboard_s3_uri: str | None = None
    inputs: dict[str, str] = {}
    # A provider plug-in's own block, by plug-in name (the plug-in validates it again).
    provider_options: dict[str, dict[str, Any]] = {}
    aws: AwsOptions = AwsOptions()
    ssh: SshOptions = SshOptions()

    @classmethod
    def of(cls, spec: JobSpec) -> CapacityRequest:
        """The capacity `spec` asks for (its full size)."""
        top = {
            name: getattr(spec, name)
            for name in cls.model_fields
            if name not in BLOCKS and name not in cls.PER_CALL
        }
        return cls(**top, retry_for=spec.max_wait, aws=spec.aws, ssh=spec.ssh)

    @property
    def instance_types(self) -> list[str]:
        """The instance type, then the fallbacks, in the order capacity is tried."""
        return [self.instance_type, *self.fallback_instance_types]

    def with_count(self, count: int) -> CapacityRequest:
        """The same capacity at another size (an elastic resize)."""
        return self.model_copy(update={"instance_count": count})

    def spot_only(self) -> CapacityRequest:
        """The same capacity without the on-demand fallback."""
        return self.model_copy(update={"on_demand_fallback": False})

    def on_demand_only(self) -> CapacityRequest:
        """The same capacity on demand, no spot asked for."""
        return self.model_copy(update={"use_spot_instances": False, "on_demand_fallback": False})

    def retrying_for(self, seconds: float) -> CapacityRequest:
        """The same capacity, the provider's own capacity retries bounded by `seconds`."""
        return self.model_copy(update={"retry_for": max(1, int(seconds))})


# The per-provider option blocks of a request, by the name a provider reads them under.
BLOCKS: dict[str, type[View]] = {"aws": AwsOptions, "ssh": SshOptions}


def flatten_blocks(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with each provider block (`aws: {...}`, `ssh: {...}`) spread into the flat
    job fields it groups; SpecError for a block that is no mapping, a key that is not one
    of its fields, or a field given both in a block and flat."""
    out = dict(fields)
    from trainctl.spec.catalog import plugin_blocks

    for name in plugin_blocks():  # a plug-in's block: provider_options
        if (values := _pop_block(out, name)) is None:
            continue
        given = out.get("provider_options")
        merged = dict(given) if isinstance(given, dict) else {}
        if name in merged:
            raise SpecError(name, f"is also given as provider_options.{name}: give it once")
        out["provider_options"] = {**merged, name: values}
    for block, options_class in BLOCKS.items():
        if (values := _pop_block(out, block)) is None:
            continue
        allowed = list(options_class.model_fields)
        for key, value in values.items():
            if key not in allowed:
                raise SpecError(
                    f"{block}.{key}", f"is not an {block} option; allowed: {', '.join(allowed)}"
                )
            if out.get(key) is not None:
                raise SpecError(f"{block}.{key}", f"is also given as {key}: give it once")
            out[key] = value
    return out


def _pop_block(fields: dict[str, Any], block: str) -> dict[str, Any] | None:
    """The mapping given as `block`, taken out of `fields` (None: not given)."""
    values = fields.pop(block, None)
    if values is not None and not isinstance(values, dict):
        raise SpecError(block, f"must be a mapping of {block} options, got {type(values).__name__}")
    return values
