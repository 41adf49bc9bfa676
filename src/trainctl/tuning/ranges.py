"""Hyperparameter ranges, as SageMaker's `sagemaker.tuner` declares them: continuous, integer
and categorical, with a scaling type. Each is a pydantic model (what the tuning record
stores) and knows its Optuna distribution (what the search samples)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from trainctl.errors import SpecError

ScalingType = Literal["Auto", "Linear", "Logarithmic", "ReverseLogarithmic"]


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(where, what) of a validation's first error, for a one-line SpecError."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ()))
    return where, str(error.get("msg", exc)).removeprefix("Value error, ")


class ParameterRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    scaling_type: ScalingType = "Auto"

    def _init(self, **fields: Any) -> None:
        """Construct, a bad range being one line naming the range (not a traceback)."""
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            where, message = first_error(exc)
            raise SpecError(
                type(self).__name__, f"{where + ': ' if where else ''}{message}"
            ) from None

    def distribution(self) -> Any:
        """The Optuna distribution this range samples from."""
        raise NotImplementedError

    def from_search(self, value: Any) -> Any:
        """The hyperparameter the script gets for the value the search chose."""
        return value

    def to_search(self, value: Any) -> Any:
        """The search's value for a hyperparameter a trial ran with (a record rebuilt)."""
        return value


class _Numeric(ParameterRange):
    min_value: float
    max_value: float

    @model_validator(mode="after")
    def _bounds(self) -> _Numeric:
        if not self.min_value < self.max_value:
            raise ValueError(
                f"min_value {self.min_value:g} must be below max_value {self.max_value:g}"
            )
        if self.scaling_type == "Logarithmic" and self.min_value <= 0:
            raise ValueError(f"a Logarithmic range needs min_value > 0, got {self.min_value:g}")
        if self.scaling_type == "ReverseLogarithmic" and not (
            self.min_value >= 0 and self.max_value < 1
        ):
            raise ValueError(
                "a ReverseLogarithmic range needs 0 <= min_value and max_value < 1, got "
                f"{self.min_value:g}..{self.max_value:g}"
            )
        return self


class ContinuousParameter(_Numeric):
    """A float between min_value and max_value (SageMaker's ContinuousParameter)."""

    kind: Literal["continuous"] = "continuous"

    def __init__(self, min_value: float, max_value: float, scaling_type: str = "Auto", **kw: Any):
        self._init(min_value=min_value, max_value=max_value, scaling_type=scaling_type, **kw)

    def distribution(self) -> Any:
        from optuna.distributions import FloatDistribution

        if self.scaling_type == "ReverseLogarithmic":
            # Dense near 1 (momentum, beta): log-uniform over 1 - value.
            return FloatDistribution(1 - self.max_value, 1 - self.min_value, log=True)
        return FloatDistribution(
            self.min_value, self.max_value, log=self.scaling_type == "Logarithmic"
        )

    def from_search(self, value: Any) -> Any:
        return 1 - value if self.scaling_type == "ReverseLogarithmic" else value

    def to_search(self, value: Any) -> Any:
        return 1 - value if self.scaling_type == "ReverseLogarithmic" else value


class IntegerParameter(_Numeric):
    """An integer between min_value and max_value, both included."""

    kind: Literal["integer"] = "integer"

    def __init__(self, min_value: int, max_value: int, scaling_type: str = "Auto", **kw: Any):
        self._init(min_value=min_value, max_value=max_value, scaling_type=scaling_type, **kw)

    @model_validator(mode="after")
    def _whole(self) -> IntegerParameter:
        if self.min_value != int(self.min_value) or self.max_value != int(self.max_value):
            raise ValueError("an IntegerParameter's bounds are whole numbers")
        if self.scaling_type == "ReverseLogarithmic":
            raise ValueError("ReverseLogarithmic is for continuous ranges only")
        return self

    def distribution(self) -> Any:
        from optuna.distributions import IntDistribution

        return IntDistribution(
            int(self.min_value), int(self.max_value), log=self.scaling_type == "Logarithmic"
        )


class CategoricalParameter(ParameterRange):
    """One of `values` (strings, numbers or booleans)."""

    kind: Literal["categorical"] = "categorical"
    values: list[str | int | float | bool]

    def __init__(self, values: Any, **kw: Any):
        if not isinstance(values, list | tuple):
            values = [values]
        self._init(values=list(values), **kw)

    @model_validator(mode="after")
    def _some(self) -> CategoricalParameter:
        if not self.values:
            raise ValueError("a CategoricalParameter needs at least one value")
        if len(set(map(repr, self.values))) != len(self.values):
            raise ValueError("a CategoricalParameter's values are each given once")
        if self.scaling_type != "Auto":
            raise ValueError("a CategoricalParameter has no scaling_type")
        return self

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution

        return CategoricalDistribution(self.values)


RANGE_KINDS: dict[str, type[ParameterRange]] = {
    "continuous": ContinuousParameter,
    "integer": IntegerParameter,
    "categorical": CategoricalParameter,
}


def range_from_dict(data: dict[str, Any]) -> ParameterRange:
    """A range as the record stores it (its model_dump)."""
    cls = RANGE_KINDS[data["kind"]]
    return cls.model_validate(data)
