"""The rules of a job spec that are more than a field's type: the patterns and limits its
fields are held to, the checks that span fields (trainctl.spec.job's validators call them),
and what other modules read off a spec (the locations it writes, its env names)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator

from trainctl.errors import SpecError
from trainctl.spec.limits import MAX_ARGUMENTS_BYTES, check_hyperparameters_size, check_value

if TYPE_CHECKING:
    from trainctl.spec.job import JobSpec

TAG_TEXT_RE = re.compile(r"[\w\s+\-=.:/@]*")
# EC2's 50 tags a resource, less trainctl's own (requests.base_tags) and some room.
MAX_USER_TAGS = 40
# SageMaker's limit for warm pools: an idle paid instance is kept at most an hour.
MAX_KEEP_ALIVE_SECONDS = 3600
# SageMaker's job-name rule, so names carry over both ways.
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
CHANNEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _unclosed_bracket(pattern: str) -> bool:
    """Whether a gitignore pattern has a `[` (not escaped) without its `]`."""
    at = 0
    while at < len(pattern):
        ch = pattern[at]
        if ch == "\\":
            at += 2
            continue
        if ch == "[":
            # a class: `]` right after `[` or `[!` is a member, not the end
            end = at + 1 + (pattern[at + 1 : at + 2] in ("!", "^"))
            end += pattern[end : end + 1] == "]"
            close = pattern.find("]", end)
            if close < 0:
                return True
            at = close + 1
            continue
        at += 1
    return False


HP_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# SageMaker's limits on CreateTrainingJob's HyperParameters: 100 of them, a key of at most
# 256 characters, a value of at most 2,500 (as text: a non-string value as its JSON).
MAX_HYPERPARAMETERS = 100
MAX_HP_KEY_CHARS = 256
MAX_HP_VALUE_CHARS = 2500
IMAGE_URI_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[\w][\w.-]{0,127})?"
    r"(?:@sha256:[0-9a-f]{64})?$"
)
SUPPORTED_URI_SCHEMES = ("file", "s3")
# Validation context key: the spec is read back from a job record (checked at submit).
RECORDED = "recorded"


def _check_uri(value: str, field: str) -> str:
    from trainctl.spec.uris import validate_uri

    try:
        validate_uri(value, field=field)
    except SpecError as exc:  # pydantic adds the field's location itself
        raise ValueError(exc.message) from None
    return value


def _channel_name(name: str) -> str:
    if not CHANNEL_RE.fullmatch(name):
        raise ValueError(f"channel name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
    return name


# Typed keys and values: pydantic then reports an error at inputs.<channel>.
ChannelName = Annotated[str, AfterValidator(_channel_name)]
InputUri = Annotated[str, AfterValidator(lambda uri: _check_uri(uri, "inputs"))]


def _check_channel_envs(channels: dict[str, Any]) -> None:
    """Two channels that map to one variable (`train-a`, `train.a`) would leave the script
    with one of the two directories in SM_CHANNEL_<NAME>, silently."""

    seen: dict[str, str] = {}
    for name in channels:
        other = seen.setdefault(env_suffix(name), name)
        if other != name:
            raise ValueError(
                f"channels {other!r} and {name!r} would both set "
                f"SM_CHANNEL_{env_suffix(name)}; rename one"
            )


def _check_json_value(value: Any, path: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON-serialisable ({exc})") from None


def check_hyperparameters(v: dict[str, Any]) -> dict[str, Any]:
    """SageMaker's limits on hyperparameters (keys, values, count, size), JSON values only."""
    if len(v) > MAX_HYPERPARAMETERS:
        raise ValueError(f"{len(v)} given; at most {MAX_HYPERPARAMETERS} (SageMaker's limit)")
    for key, value in v.items():
        if not isinstance(key, str) or not HP_KEY_RE.fullmatch(key):
            raise ValueError(
                f"key {str(key)[:80]!r} must start with a letter, digit or '_' and use only "
                "letters, digits, '_', '-' and '.'"
            )
        if len(key) > MAX_HP_KEY_CHARS:
            raise ValueError(
                f"key {key[:40]}... is {len(key)} characters; at most {MAX_HP_KEY_CHARS} "
                "(SageMaker's limit)"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key}={value!r} is not a finite number")
        check_value(value, key)
        _check_json_value(value, key)
        shown = value if isinstance(value, str) else json.dumps(value)
        if len(shown) > MAX_HP_VALUE_CHARS:
            raise ValueError(
                f"{key} is {len(shown):,} characters; at most {MAX_HP_VALUE_CHARS:,} a value "
                "(SageMaker's limit; put large values in a file in source_dir or an input "
                "channel)"
            )
    check_hyperparameters_size(v)
    # Keys that share an SM_HP_ name (`batch-size`, `batch_size`) stay allowed: the
    # arguments keep both verbatim and SM_HPS has both; SM_HP_<NAME> has the later one.
    return v


def check_arguments(v: Any) -> Any:
    """The script's arguments: strings a command line can carry, within its size."""
    if not isinstance(v, list | tuple):
        raise ValueError("must be a list of strings, e.g. ['50', '10']")
    for index, arg in enumerate(v):
        if not isinstance(arg, str):
            raise ValueError(
                f"[{index}] is {type(arg).__name__} {arg!r}: arguments are strings, as on a "
                f"command line (write '{arg}'; in YAML, quote it)"
            )
        if "\0" in arg:
            raise ValueError(f"[{index}] holds a NUL byte, which no command line can carry")
    size = sum(len(arg.encode("utf-8", "surrogateescape")) + 1 for arg in v)
    if size > MAX_ARGUMENTS_BYTES:
        raise ValueError(f"{size:,} bytes in all; at most {MAX_ARGUMENTS_BYTES:,}")
    return list(v)


def check_workdir_ignore(v: list[str]) -> list[str]:
    """Gitignore-style patterns that git would match as written."""
    import pathspec

    for pattern in v:
        try:
            pathspec.GitIgnoreSpec.from_lines([pattern])
        except Exception as exc:
            raise ValueError(f"{pattern!r} is not a gitignore-style pattern ({exc})") from None
        if _unclosed_bracket(pattern):  # git matches nothing with it, silently
            raise ValueError(
                f"{pattern!r} opens a [...] character class it does not close (for a "
                "literal '[' write '\\[')"
            )
    return v


def check_tags(v: dict[str, str]) -> dict[str, str]:
    """The user's tags: what EC2 and S3 both take, none of the names trainctl sets."""
    if len(v) > MAX_USER_TAGS:
        raise ValueError(f"at most {MAX_USER_TAGS} tags (EC2 takes 50; trainctl sets 4)")
    for key, value in v.items():
        if not 1 <= len(key) <= 128 or len(value) > 256:
            raise ValueError(f"{key!r}: a key is 1-128 characters, a value at most 256")
        if key.lower().startswith(("aws:", "trainctl:")) or key == "Name":
            raise ValueError(f"{key!r} is reserved (aws:*, trainctl:* and Name are set here)")
        # what EC2 and S3 (the output objects are tagged too) both take
        if not (TAG_TEXT_RE.fullmatch(key) and TAG_TEXT_RE.fullmatch(value)):
            raise ValueError(
                f"{key!r}: letters, digits, spaces and + - = . _ : / @ only (S3's tag rule)"
            )
    return v


def check_across_fields(spec: JobSpec) -> None:
    """The model-level rules of a job spec read at submit: its files, its secrets named,
    its sizes, faults and channels, its capacity and image fields, max_wait against max_run."""
    # Raised as ValueError with the field named in the text: pydantic wraps validator
    # errors, and a model-level error has no location of its own.
    source = Path(spec.source_dir)
    if not source.is_dir():
        raise ValueError(f"source_dir: {source} is not a directory")
    entry = Path(spec.entry_point)
    if entry.is_absolute():
        raise ValueError(f"entry_point: {entry} must be relative to source_dir {source}")
    resolved = (source / entry).resolve()
    if not resolved.is_relative_to(source.resolve()):
        raise ValueError(f"entry_point: {entry} is outside source_dir {source}")
    if not resolved.is_file():
        raise ValueError(f"entry_point: {entry} not found in source_dir {source}")
    # A secret named but not given (a typo) would leave the real one shown in clear.
    for field, names, given in (
        ("secret_env", spec.secret_env, spec.environment),
        ("secret_hyperparameters", spec.secret_hyperparameters, spec.hyperparameters),
    ):
        for name in names:
            if name not in given:
                what = "environment" if field == "secret_env" else "hyperparameters"
                known = ", ".join(sorted(given)[:10]) or "none"
                raise ValueError(f"{field}: {name[:80]!r} is not one of the job's {what} "
                                 f"(given: {known[:200]})")  # fmt: skip
    if spec.min_instance_count is not None and not (
        1 <= spec.min_instance_count <= spec.instance_count
    ):
        raise ValueError(
            f"min_instance_count: {spec.min_instance_count} must be between 1 and "
            f"instance_count ({spec.instance_count})"
        )
    for fault in spec.parsed_faults:
        for rank in fault.ranks:
            if rank >= spec.instance_count:
                raise ValueError(
                    f"faults: {fault} names node {rank} (algo-{rank + 1}), but the job has "
                    f"{spec.instance_count} node(s): ranks 0-{spec.instance_count - 1}"
                )
    check_capacity(spec)
    check_image(spec)
    unknown = sorted(set(spec.channel_config) - set(spec.inputs))
    if unknown:
        raise ValueError(
            f"channel_config: {', '.join(unknown)} is not an input channel "
            f"(inputs: {', '.join(sorted(spec.inputs)) or 'none'})"
        )
    if spec.max_wait is not None and spec.max_wait < spec.max_run:
        raise ValueError(
            f"max_wait: {spec.max_wait} s is shorter than max_run ({spec.max_run} s); "
            "max_wait bounds the whole job, waiting and retries included"
        )


def check_capacity(spec: JobSpec) -> None:
    provider = spec.provider
    if provider == "ssh":
        if not spec.hosts:
            raise ValueError("hosts: instance_type 'ssh' needs a list of hosts (or a pool)")
        if spec.instance_count > len(spec.hosts):
            raise ValueError(
                f"instance_count: {spec.instance_count} nodes but only "
                f"{len(spec.hosts)} host(s) listed"
            )
    elif spec.hosts:
        raise ValueError("hosts: only for instance_type 'ssh'")
    for name in spec.provider_options:
        if name != provider:
            raise ValueError(
                f"provider_options: {name} options, but instance_type "
                f"{spec.instance_type!r} runs on the {provider} provider"
            )
    if provider != "aws":
        aws_only = {
            "region": spec.region is not None,
            "use_spot_instances": spec.use_spot_instances,
            "on_demand_fallback": spec.on_demand_fallback,
            "fallback_instance_types": bool(spec.fallback_instance_types),
            "subnets": bool(spec.subnets),
            "security_group_ids": bool(spec.security_group_ids),
            "image_id": spec.image_id is not None,
            "instance_profile": spec.instance_profile is not None,
            # Local and SSH hosts are not released after a job: nothing to keep warm.
            "keep_alive_period_in_seconds": spec.keep_alive_period_in_seconds > 0,
            # (the disk of a machine trainctl does not start is what it is)
            "volume_size": spec.volume_size is not None,
        }
        given = [name for name, is_set in aws_only.items() if is_set]
        if given:
            raise ValueError(
                f"{given[0]}: applies to EC2 instance types only, not {spec.instance_type!r}"
            )
    elif spec.on_demand_fallback and not spec.use_spot_instances:
        raise ValueError("on_demand_fallback: only with use_spot_instances=True")


def check_image(spec: JobSpec) -> None:
    # (image_uri with build_image is the user's mistake, refused by build_spec; in a job's
    # spec it is the image that was built for it.)
    if not spec.build_image:
        for name in ("base_image", "dependencies"):
            if getattr(spec, name):
                raise ValueError(f"{name}: only with build_image=True")
    if spec.py_version is not None:
        from trainctl.spec.frameworks import FRAMEWORK_VERSIONS, resolve_framework_version

        if spec.framework_version is None:
            raise ValueError("py_version: only with framework_version")
        version = resolve_framework_version(spec.framework_version)
        if spec.py_version not in FRAMEWORK_VERSIONS[version]:
            raise ValueError(
                f"py_version: {spec.py_version!r} is not available for PyTorch {version}; "
                f"allowed: {', '.join(FRAMEWORK_VERSIONS[version])}"
            )


def profile_steps(value: str) -> tuple[int, int] | None:
    """`profile`'s START:COUNT as (start, count); None where it is not one."""
    start, colon, count = value.partition(":")
    if not colon or not start.isdigit() or not count.isdigit():
        return None
    first, steps = int(start), int(count)
    return (first, steps) if first <= 10**9 and 1 <= steps <= 1000 else None


# The fields that name a location a job writes to outside its own store prefix (the same
# names on a CapacityRequest, which mounts file:// ones into containers).
WRITTEN_URI_FIELDS = ("checkpoint_s3_uri", "output_path", "tensorboard_s3_uri", "code_location")


def written_uris(spec: Any) -> list[tuple[str, str]]:
    """(field, URI) of each written location `spec` (a JobSpec or CapacityRequest) names."""
    return [(f, uri) for f in WRITTEN_URI_FIELDS if (uri := getattr(spec, f, None))]


def uses_s3(spec: Any) -> bool:
    """Whether the job's agent needs boto3: an s3:// store, input, output or checkpoint URI."""
    from trainctl.spec.settings import get_settings

    uris = [get_settings().store_uri, *(uri for _, uri in written_uris(spec))]
    uris += list(spec.inputs.values())
    return any(u and u.startswith("s3://") for u in uris)


def env_suffix(name: str) -> str:
    """Upper-case name usable in a shell variable: 'batch-size' -> 'BATCH_SIZE'."""
    return re.sub(r"[^A-Z0-9_]", "_", name.upper())
