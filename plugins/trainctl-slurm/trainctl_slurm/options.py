"""The `slurm:` block of a job: what the allocation asks Slurm for. Declared once, here; the
job file's `slurm:` keys, submit's `--slurm-*` flags and `Estimator(slurm={...})` are made
from it by trainctl (trainctl.spec.catalog.plugin_blocks)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Every value lands on an `#SBATCH` line of the batch script: one word of these characters,
# so no value can end the line and add a command.
WORD_RE = re.compile(r"[A-Za-z0-9_.:,=+@/%-]{1,256}")


def _word(value: str) -> str:
    if not WORD_RE.fullmatch(value):
        raise ValueError(
            f"{value[:80]!r} must be one word of letters, digits and _ . : , = + @ / % - "
            "(at most 256)"
        )
    return value


def _sbatch_option(value: str) -> str:
    _word(value)
    if not value.startswith("--") or value.startswith("---"):
        raise ValueError(f"{value!r} is not a long sbatch option (--name or --name=value)")
    return value


# A folder on every node: absolute (or under ~), one word (it lands in the batch script's
# `#SBATCH --output=` line, which a space would split and a newline would end).
NODE_DIR_RE = re.compile(r"(/|~/)[^\x00-\x20\x7f]{0,1023}")


def _node_dir(value: str) -> str:
    if not NODE_DIR_RE.fullmatch(value) or "/../" in f"{value}/":
        raise ValueError(
            f"{value[:80]!r} must be an absolute folder (/... or ~/...), at most 1,024 "
            "characters, without '..', spaces or control characters"
        )
    return value


Word = Annotated[str, AfterValidator(_word)]
SbatchOption = Annotated[str, AfterValidator(_sbatch_option)]


class SlurmOptions(BaseModel):
    """What a job asks Slurm for (each an sbatch option of the same meaning)."""

    # strict: no value changes type (`'4'` is not a count, `'yes'` not a boolean), as for
    # the built-in fields; the command line's flags arrive typed.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    partition: Word | None = Field(default=None, description="The partition (--partition).")
    account: Word | None = Field(default=None, description="The account charged (--account).")
    qos: Word | None = Field(default=None, description="The quality of service (--qos).")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=64, description="GPUs on each node (--gpus-per-node)."
    )
    gres: Word | None = Field(
        default=None, description="Generic resources per node, e.g. gpu:a100:8 (--gres)."
    )
    cpus_per_node: int | None = Field(
        default=None, ge=1, le=4096, description="CPUs on each node (--cpus-per-task)."
    )
    mem: Word | None = Field(default=None, description="Memory per node, e.g. 64G (--mem).")
    constraint: Word | None = Field(
        default=None, description="Node features required (--constraint)."
    )
    reservation: Word | None = Field(default=None, description="A reservation (--reservation).")
    exclusive: bool | None = Field(
        default=None, description="Whole nodes, shared with no other job (--exclusive)."
    )
    notice_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description="How long before the time limit the nodes are warned (--signal=USR1@N): "
        "a notice, answered by an emergency checkpoint.",
    )
    node_dir: Annotated[str, AfterValidator(_node_dir)] | None = Field(
        default=None,
        description="Where each node's working directories go, on every node (default: "
        "trainctl's home, which a cluster's shared home puts on every node).",
    )
    sbatch_args: list[SbatchOption] = Field(
        default_factory=list,
        max_length=32,
        description="More sbatch options, as --name=value; repeatable.",
    )
