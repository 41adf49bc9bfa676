"""Bounds on what a job may carry, and what it may not touch: checked at submit so that odd
input (deep, huge, binary) is one line naming the field, never a traceback or a late failure.

Pure functions, no I/O beyond reading the user's home directory from the environment.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath
from typing import Any

# Hyperparameters reach the script as command-line arguments and in SM_HPS / SM_TRAINING_ENV
# (one environment string each): Linux caps one such string at 128 KiB (MAX_ARG_STRLEN), and
# SM_TRAINING_ENV holds the hyperparameters once more, so they get half.
MAX_HYPERPARAMETERS_BYTES = 64 * 1024
# Nodes of one job: above any cloud account's quota (EC2's own, in vCPUs, is checked before
# launch: trainctl.provisioning.aws.preflight.check_vcpu_quota), so only a typo stops here.
MAX_INSTANCE_COUNT = 65_536
# An EC2 node's root volume when the job names no volume_size, GB.
DEFAULT_VOLUME_GB = 200
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_TOTAL_BYTES = 256 * 1024
MAX_ARGUMENTS_BYTES = 64 * 1024
# Nesting of a hyperparameter value (or any field given through the Estimator or YAML).
MAX_DEPTH = 32
# Integers must fit 64 bits (signed or unsigned): the script parses them with argparse's int,
# but every other tool on the way (JSON readers in other languages, YAML) does not go further.
MIN_INT = -(2**63)
MAX_INT = 2**64 - 1

# Set by the launch for every process of the job: a user value would silently win over the
# real one (a job tag that hides the job's processes from teardown, a rank that lies).
RESERVED_ENV_PREFIXES = ("TRAINCTL_", "SM_", "TORCHELASTIC_", "OMPI_", "PMIX_")
RESERVED_ENV_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TMPDIR",
        "PYTHONUNBUFFERED",
    }
)

# Directories a job must never use as its local checkpoint path: the agent would upload what
# is there (an /etc with its shadow file) and write into it.
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib",
    "/var/log",
    "/var/run",
)

# Shared directories: a job may use a directory inside one, never the whole of it.
SHARED_DIRS = ("/tmp", "/var", "/var/tmp", "/home", "/opt", "/opt/ml", "/mnt", "/media", "/srv")
# Not set by the launch but read by trainctl.train (trainctl.train.diagnosis): `trainctl
# diagnose` runs its derived jobs with them, and a user may too.
TRAIN_LIBRARY_ENV = frozenset(
    {"TRAINCTL_DIAGNOSE_STEPS", "TRAINCTL_DIAGNOSE_WARMUP", "TRAINCTL_SYNTHETIC_DATA"}
)


def reserved_env(name: str) -> bool:
    """Whether `name` is set by trainctl's launch (and so may not come from the user)."""
    if name in TRAIN_LIBRARY_ENV:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def check_environment(env: dict[str, str]) -> None:
    """Raise ValueError naming the first variable that may not be set as given."""
    total = 0
    for name, value in env.items():
        if reserved_env(name):
            raise ValueError(
                f"{name} is set by trainctl for every process of the job and cannot be "
                "overridden (reserved: TRAINCTL_*, SM_*, TORCHELASTIC_*, OMPI_*, PMIX_*, "
                f"{', '.join(sorted(RESERVED_ENV_NAMES))})"
            )
        if not isinstance(value, str):
            raise ValueError(f"{name}: values are strings (got {type(value).__name__})")
        if "\0" in value:
            raise ValueError(f"{name} holds a NUL byte, which no environment can carry")
        if not _is_unicode(value):
            raise ValueError(f"{name} is not valid Unicode (a lone surrogate)")
        size = len(name.encode()) + len(value.encode("utf-8", "surrogateescape")) + 2
        if size > MAX_ENV_VALUE_BYTES:
            raise ValueError(
                f"{name} is {size:,} bytes; at most {MAX_ENV_VALUE_BYTES:,} per variable "
                "(put large values in a file in source_dir or an input channel)"
            )
        total += size
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValueError(f"{total:,} bytes in all; at most {MAX_ENV_TOTAL_BYTES:,}")


def _is_unicode(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (a JSON `"\\ud800"` parses to a lone
    surrogate, which no file, command line or terminal can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_value(value: Any, where: str, *, max_depth: int = MAX_DEPTH) -> None:
    """A user value's shape, walked without recursion (a 100,000-deep list is one line, not
    a RecursionError): nesting depth, integer range, NUL-free strings."""
    todo: list[tuple[Any, str, int]] = [(value, where, 0)]
    while todo:
        item, path, depth = todo.pop()
        if depth > max_depth:
            shown = path if len(path) < 80 else f"{path[:60]}..."
            raise ValueError(f"{shown} is nested more than {max_depth} levels deep")
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not MIN_INT <= item <= MAX_INT:
            raise ValueError(f"{path} is an integer beyond 64 bits")
        if isinstance(item, str) and "\0" in item:
            raise ValueError(f"{path} holds a NUL byte")
        if isinstance(item, str) and not _is_unicode(item):
            raise ValueError(f"{path} is not valid Unicode (a lone surrogate, e.g. \\ud800)")
        if isinstance(item, dict):
            todo.extend((v, f"{path}.{k}", depth + 1) for k, v in item.items())
        elif isinstance(item, list | tuple):
            todo.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))


def check_hyperparameters_size(hyperparameters: dict[str, Any]) -> None:
    size = len(json.dumps(hyperparameters, default=str).encode())
    if size > MAX_HYPERPARAMETERS_BYTES:
        largest = max(hyperparameters, key=lambda k: len(json.dumps(hyperparameters[k])))
        raise ValueError(
            f"{size:,} bytes as JSON (the largest: {largest}); at most "
            f"{MAX_HYPERPARAMETERS_BYTES:,}, as they travel on the command line and in "
            "SM_HPS (put large values in a file in source_dir or an input channel)"
        )


def system_path(path: str, home: str | None = None) -> str | None:
    """Why `path` (absolute, normalised) may not be a job's local checkpoint directory, or
    None: the root, a system directory or inside one, or the user's home (or above it)."""
    home = home if home is not None else os.path.expanduser("~")
    p = PurePosixPath(os.path.normpath(path))
    if p == PurePosixPath("/"):
        return "is the root directory"
    if str(p) in SHARED_DIRS:
        return f"is the shared directory {p}"
    for system in SYSTEM_DIRS:
        if p == PurePosixPath(system):
            return f"is the system directory {system}"
        if p.is_relative_to(system):
            return f"is inside the system directory {system}"
    if home and home != "/":
        h = PurePosixPath(os.path.normpath(home))
        if p == h or h.is_relative_to(p):
            return f"is your home directory {h} or holds it"
    return None
