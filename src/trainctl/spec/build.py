"""From user fields (the Estimator, `trainctl submit` flags, `-f job.yaml`) to a validated
JobSpec: paths resolved, the pool merged in, and pydantic's errors turned into one line that
names the field and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainctl.errors import SpecError
from trainctl.spec.capacity import PoolConfig
from trainctl.spec.job import JobSpec
from trainctl.spec.limits import MAX_DEPTH, check_value
from trainctl.spec.parts import (
    Distribution,
    MetricDefinition,
    MPIDistribution,
    TorchDistributed,
    parse_distribution,
)


def _format_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(prefix)
        if err["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in err["loc"][:-1])
            allowed = _allowed_keys(parent)
            msg = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif err["type"] == "missing":
            msg = "is required"
        elif err["type"] == "bool_type":  # strict: "yes", 1 or "true" are not booleans
            msg = f"must be true or false (got {_shown_input(err.get('input'))})"
        elif err["type"] in (
            "greater_than_equal",
            "less_than_equal",
            "greater_than",
            "int_type",
            "float_type",
            "string_type",
            "list_type",
            "dict_type",
        ):
            msg = f"{msg[0].lower()}{msg[1:]} (got {_shown_input(err.get('input'))})"
        parts.append(f"{loc}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)


def _shown_input(value: object) -> str:
    """A wrong value as an error quotes it: its repr, cut (a huge or deep value is not
    printed whole on one line)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"a nested {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed_keys(parent: str) -> list[str]:
    models: dict[str, type[BaseModel]] = {
        "": JobSpec,
        "distribution": Distribution,
        "distribution.torch_distributed": TorchDistributed,
        "distribution.mpi": MPIDistribution,
    }
    model = models.get(parent)
    if model is None and parent.startswith("metric_definitions"):
        model = MetricDefinition
    return sorted(model.model_fields) if model else []


def build_spec(**fields: Any) -> JobSpec:
    """Validate user fields into a JobSpec, raising SpecError with one line on bad input.

    Resolves source_dir (default: the entry point's directory) before validation so the
    stored spec is independent of the submitter's working directory.
    """
    from trainctl.spec.request import flatten_blocks

    fields = flatten_blocks({k: v for k, v in fields.items() if v is not None})
    for name, value in fields.items():
        try:
            check_value(value, name)
        except ValueError as exc:
            raise SpecError(name, str(exc), prefixed=True) from None
    entry = fields.get("entry_point")
    if not entry:
        raise SpecError("entry_point", "is required (the script to run, e.g. train.py)")
    if not isinstance(entry, str):
        raise SpecError("entry_point", f"must be a path string, got {type(entry).__name__}")
    source_dir = fields.get("source_dir")
    if source_dir is None:
        entry_path = Path(entry).expanduser()
        if not entry_path.is_file():
            raise SpecError("entry_point", f"{entry} not found")
        fields["source_dir"] = str(entry_path.resolve().parent)
        fields["entry_point"] = entry_path.name
    else:
        src = Path(str(source_dir)).expanduser()
        if not src.is_dir():
            raise SpecError("source_dir", f"{source_dir} is not a directory")
        fields["source_dir"] = str(src.resolve())
        entry_path = Path(entry).expanduser()
        if entry_path.is_absolute() and entry_path.resolve().is_relative_to(src.resolve()):
            # an absolute path that lies inside source_dir means the same script
            fields["entry_point"] = str(entry_path.resolve().relative_to(src.resolve()))
    if fields.get("build_image") and fields.get("image_uri") is not None:
        raise SpecError("image_uri", "give either image_uri or build_image=True, not both")
    if fields.get("pool") is not None:
        fields = _merge_pool(fields)
    if fields.get("instance_profile") is None and _is_ec2(fields.get("instance_type")):
        from trainctl.spec.settings import get_settings

        # the configured default (a pool's, or the job's own, come first)
        fields["instance_profile"] = get_settings().instance_profile
    if fields.get("max_wait") is not None and fields.get("max_run") is None:
        # max_run's default (a day) would exceed a shorter max_wait: the wait bounds it.
        fields["max_run"] = fields["max_wait"]
    dist = fields.get("distribution")
    if isinstance(dist, str):
        fields["distribution"] = parse_distribution(dist)
    try:
        return JobSpec(**fields)
    except ValidationError as exc:
        raise spec_error(exc) from None
    except RecursionError:  # (check_value bounds nesting; this is the last line of defence)
        raise SpecError("", f"a field is nested more than {MAX_DEPTH} levels deep") from None


def _is_ec2(instance_type: Any) -> bool:
    from trainctl.spec.catalog import CATALOG, ec2_name

    known = CATALOG.get(ec2_name(instance_type)) if isinstance(instance_type, str) else None
    return known is not None and known.provider == "aws"


def spec_error(exc: ValidationError) -> SpecError:
    """A spec's validation errors as one SpecError naming the first field."""
    errors = exc.errors()
    field = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
    if not field and errors:  # model-level checks name their field in the text
        field = str(errors[0]["msg"]).removeprefix("Value error, ").split(":", 1)[0]
    return SpecError(field, _format_error(exc), prefixed=True)


def _merge_pool(fields: dict[str, Any]) -> dict[str, Any]:
    """The pool's fields under the job's own: the job wins where it sets a field."""
    from trainctl.spec.settings import get_settings

    name = fields["pool"]
    pools = get_settings().pools
    if name not in pools:
        configured = ", ".join(sorted(pools)) or "none; add a 'pools:' section to config.yaml"
        raise SpecError("pool", f"{name!r} not found; configured pools: {configured}")
    pool = pools[name]
    merged = {**pool_fields(pool), **fields}
    count = merged.get("instance_count", 1)
    if pool.max_instances is not None and isinstance(count, int) and count > pool.max_instances:
        raise SpecError(
            "instance_count",
            f"{count} exceeds pool {name!r}'s max_instances ({pool.max_instances})",
        )
    return merged


def pool_fields(pool: PoolConfig) -> dict[str, object]:
    """The job-spec fields a pool supplies (those it sets), for `build_spec` to merge."""
    out: dict[str, object] = {}
    if pool.instance_types:
        out["instance_type"] = pool.instance_types[0]
        out["fallback_instance_types"] = list(pool.instance_types[1:])
    elif pool.provider in ("local", "ssh"):
        out["instance_type"] = pool.provider
    # The pool's fields that are job fields too (the same name), besides those above.
    shared = [n for n in type(pool).model_fields if n in JobSpec.model_fields and n != "hosts"]
    for name in shared:
        value = getattr(pool, name)
        if value not in (None, [], False):
            out[name] = value
    if pool.hosts:
        out["hosts"] = [h.model_dump(exclude_defaults=True) for h in pool.hosts]
    return out
