"""Each job field's doors, declared once beside the field: `JobSpec` fields carry a `Door`
(in their `Annotated` metadata) that says how the field is given at each entry point.

- the Estimator's keyword argument and the `-f job.yaml` key are the field's own name;
- `trainctl submit`'s flag is the name in kebab case (`checkpoint_s3_uri` ->
  `--checkpoint-s3-uri`), parsed by the door's `cli` kind; older flag spellings stay as
  hidden aliases that print one deprecation line;
- `sagemaker` says what SageMaker's PyTorch estimator calls it ("same": the same name and
  meaning; a sentence: mapped from another argument; None: not SageMaker's).

So a new field is one edit (the JobSpec line); the Estimator's signature, the CLI's options
and the SageMaker shim's pass-through list are made from these, and
tests/unit/test_fields.py fails if any door misses a field.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

from trainctl.spec.door import Door


@dataclass(frozen=True)
class JobField:
    """A JobSpec field with its door: what every entry point is made from."""

    name: str
    door: Door
    annotation: Any
    required: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def value_type(self) -> Any:
        """The field's type without `None` (`int | None` -> int), for a CLI option."""
        return _without_none(self.annotation)


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return _without_none(rest[0])
    return annotation


def job_fields() -> list[JobField]:
    """Every JobSpec field with its door, in declaration order."""
    from trainctl.spec.job import JobSpec

    out = []
    for name, info in JobSpec.model_fields.items():
        doors = [m for m in info.metadata if isinstance(m, Door)]
        if len(doors) != 1:
            raise TypeError(f"JobSpec.{name} declares {len(doors)} Door(s); it needs one")
        out.append(JobField(name, doors[0], info.annotation, info.is_required()))
    return out


def sagemaker_passed() -> tuple[str, ...]:
    """Fields SageMaker's estimator takes under the same name and meaning."""
    return tuple(f.name for f in job_fields() if f.door.sagemaker == "same")


def estimator_signature(head: list[inspect.Parameter]) -> inspect.Signature:
    """`Estimator.__init__`'s signature: `head` (self, entry_point, ...), then every job
    field as a keyword with default None (unset: the spec's default applies)."""
    named = {p.name for p in head}
    fields = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=f.annotation
        )
        for f in job_fields()
        if f.door.estimator and f.name not in named
    ]
    return inspect.Signature([*head, *fields])


def estimator_doc() -> str:
    """One line per job field, for the Estimator's docstring."""
    return "\n".join(f"    {f.name}: {f.door.help}" for f in job_fields() if f.door.estimator)
