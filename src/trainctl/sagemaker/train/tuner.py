"""`sagemaker.train.tuner.HyperparameterTuner` (SDK v3), run by trainctl's tuning: a v3
tuning program runs with its imports changed.

    tuner = HyperparameterTuner(model_trainer=trainer, objective_metric_name="loss",
                                hyperparameter_ranges={"lr": ContinuousParameter(1e-3, 0.1)},
                                metric_definitions=[{"Name": "loss", "Regex": "loss=(\\S+)"}],
                                max_jobs=3, max_parallel_jobs=2, strategy="Random",
                                objective_type="Minimize", early_stopping_type="Auto")
    tuner.tune(inputs=[InputData(channel_name="training", data_source=uri)], wait=False)
    tuner.describe().hyper_parameter_tuning_job_status

The trials are the ModelTrainer's job with each trial's hyperparameters (a range wins over
the trainer's own hyperparameter of that name, as on SageMaker); the tuning job is named
from `base_tuning_job_name`, else the trainer's `base_job_name`, and its trials after it. A
tuning job goes on after the program that started it ends (`wait=False`), and
`HyperparameterTuner.attach(name)` finds it. `describe()` answers as v3's does, an object
with DescribeHyperParameterTuningJob's fields in snake_case. What trainctl cannot act on
(warm starts, autotune, completion criteria, a strategy config) is refused in one line.
"""

from __future__ import annotations

import re
from typing import Any

from trainctl.errors import SpecError
from trainctl.sagemaker._compat import tags_of
from trainctl.sagemaker.train.configs import InputData
from trainctl.sagemaker.tuner import NOT_TUNING, tuning_job_keys
from trainctl.tuning import HyperparameterTuner as _Tuner
from trainctl.tuning.ranges import ParameterRange

# v3's arguments trainctl has nothing to act on: set, each is refused in one line.
REFUSED = {
    "warm_start_config": "no warm start from a parent tuning job",
    "strategy_config": "no strategy configuration (Hyperband's own settings)",
    "completion_criteria_config": "no completion criteria: max_jobs ends the tuning job",
    "autotune": "no autotune: name the ranges and the objective",
    "hyperparameters_to_keep_static": "only with autotune",
    "model_trainer_name": "one ModelTrainer per tuner (no multi-algorithm tuning)",
}


class HyperparameterTuner:
    """v3's HyperparameterTuner over trainctl's tuning (see the module docstring)."""

    def __init__(
        self,
        model_trainer: Any,
        objective_metric_name: str,
        hyperparameter_ranges: dict[str, ParameterRange],
        metric_definitions: list[dict[str, str]] | None = None,
        strategy: str = "Bayesian",
        objective_type: str = "Maximize",
        max_jobs: int | None = None,
        max_parallel_jobs: int = 1,
        max_runtime_in_seconds: int | None = None,
        tags: list[dict[str, str]] | None = None,
        base_tuning_job_name: str | None = None,
        warm_start_config: Any = None,
        strategy_config: Any = None,
        completion_criteria_config: Any = None,
        early_stopping_type: str = "Off",
        model_trainer_name: str | None = None,
        random_seed: int | None = None,
        autotune: bool = False,
        hyperparameters_to_keep_static: list[str] | None = None,
    ) -> None:
        from trainctl.sagemaker.train.model_trainer import ModelTrainer

        refused = {
            "warm_start_config": warm_start_config, "strategy_config": strategy_config,
            "completion_criteria_config": completion_criteria_config, "autotune": autotune,
            "hyperparameters_to_keep_static": hyperparameters_to_keep_static,
            "model_trainer_name": model_trainer_name,
        }  # fmt: skip
        for name, value in refused.items():
            if value:
                raise SpecError(name, f"not supported by trainctl: {REFUSED[name]}")
        if not isinstance(model_trainer, ModelTrainer):
            raise SpecError("model_trainer", "must be a trainctl.sagemaker.train ModelTrainer")
        if max_runtime_in_seconds is not None:
            raise SpecError(
                "max_runtime_in_seconds",
                "not supported by trainctl: each trial's stopping_condition bounds it",
            )
        self.model_trainer = model_trainer
        self.objective_metric_name = objective_metric_name
        self.hyperparameter_ranges = dict(hyperparameter_ranges or {})
        self.tags = tags
        # trainctl's tuner's arguments, as given (its base_tuning_job_name: see below)
        self._options: dict[str, Any] = {
            "metric_definitions": metric_definitions, "strategy": strategy,
            "objective_type": objective_type, "max_jobs": max_jobs,
            "max_parallel_jobs": max_parallel_jobs, "early_stopping_type": early_stopping_type,
            "random_seed": random_seed,
        }  # fmt: skip
        self.base_tuning_job_name = base_tuning_job_name
        self.latest_tuning_job: TuningJob | None = None
        self._tuner = self._trainctl_tuner(to_run=False)  # bad input fails here

    def _trainctl_tuner(self, *, to_run: bool) -> _Tuner:
        """trainctl's tuner over the trainer's job, less the hyperparameters a range tunes
        (`to_run`: the job as it runs now; see ModelTrainer._compute_fields)."""
        trainer = self.model_trainer
        estimator = trainer._estimator(to_run=to_run)
        static = {
            k: v for k, v in trainer.hyperparameters.items() if k not in self.hyperparameter_ranges
        }
        update: dict[str, Any] = {"hyperparameters": static}
        if self.tags:
            update["tags"] = {**estimator.spec.tags, **tags_of(self.tags)}
        estimator = type(estimator).from_spec(
            estimator.spec.model_copy(update=update), estimator.store().uri
        )
        return _Tuner(
            estimator,
            objective_metric_name=self.objective_metric_name,
            hyperparameter_ranges=self.hyperparameter_ranges,
            base_tuning_job_name=self.base_tuning_job_name or trainer.base_job_name,
            **self._options,
        )

    # -- running ---------------------------------------------------------------------------
    def tune(
        self,
        inputs: Any = None,
        job_name: str | None = None,
        model_trainer_kwargs: dict[str, Any] | None = None,
        wait: bool = True,
        **kwargs: Any,
    ) -> None:
        """Start the tuning job: `inputs` as the trainer's train() takes them (a list of
        InputData), an s3:// or file:// URI (the `training` channel) or {channel: URI}."""
        if model_trainer_kwargs:
            raise SpecError("model_trainer_kwargs", "only for tuners made by create()")
        if kwargs:
            raise TypeError(f"tune() got an unexpected keyword argument {next(iter(kwargs))!r}")
        trainer = self.model_trainer
        if trainer is None:
            raise SpecError(
                "model_trainer",
                "an attached tuner has none: tune with a HyperparameterTuner(model_trainer=...)",
            )
        if inputs is not None:
            trainer.input_data_config = _input_data(inputs)
        tuner = self._trainctl_tuner(to_run=True)
        tuner.fit(trainer._inputs() or None, job_name=job_name, wait=False)
        self._tuner = tuner
        self.latest_tuning_job = TuningJob(tuner)
        if wait:
            self.wait()

    @property
    def _current_job_name(self) -> str | None:
        return None if self.latest_tuning_job is None else self.latest_tuning_job.name

    @classmethod
    def attach(cls, tuning_job_name: str, sagemaker_session: Any = None) -> HyperparameterTuner:
        """The tuner of a tuning job started before (by this program or another)."""
        store = getattr(sagemaker_session, "store", None)
        tuner = cls.__new__(cls)
        tuner._tuner = _Tuner.attach(tuning_job_name, store.uri if store else None)
        tuner.latest_tuning_job = TuningJob(tuner._tuner)
        tuner.model_trainer = None
        tuner.objective_metric_name = tuner._tuner.objective_metric_name
        tuner.hyperparameter_ranges = tuner._tuner.hyperparameter_ranges
        return tuner

    # -- the tuning job --------------------------------------------------------------------
    def _job(self) -> TuningJob:
        if self.latest_tuning_job is None:
            raise ValueError("No tuning job available")  # (v3's words)
        return self.latest_tuning_job

    def describe(self) -> Shape:
        return self._job().refresh()

    def wait(self) -> None:
        self._job().wait()

    def stop_tuning_job(self) -> None:
        self._job().stop()

    def best_training_job(self) -> str:
        return self._tuner.best_training_job()

    def analytics(self) -> Any:
        return self._tuner.analytics()

    def __getattr__(self, name: str) -> Any:
        if name in NOT_TUNING:
            raise SpecError(name, f"not supported by trainctl: {NOT_TUNING[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class TuningJob:
    """v3's HyperParameterTuningJob resource for a trainctl tuning job: refresh(), wait(),
    stop() and the job's name."""

    def __init__(self, tuner: _Tuner) -> None:
        self._tuner = tuner
        self.name = str(tuner.latest_tuning_job)
        self.hyper_parameter_tuning_job_name = self.name

    def refresh(self) -> Shape:
        return Shape(tuning_job_keys(self._tuner._record()))

    def wait(self, logs: bool = False) -> None:
        self._tuner.wait(logs=logs)

    def stop(self) -> None:
        self._tuner.stop_tuning_job()


class Shape:
    """A response as v3's resources give it: each PascalCase key a snake_case attribute
    (HyperParameterTuningJobStatus -> hyper_parameter_tuning_job_status), nested alike."""

    def __init__(self, data: dict[str, Any]) -> None:
        for key, value in data.items():
            setattr(self, _snake(key), Shape(value) if isinstance(value, dict) else value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return None  # (a field the response does not have, as v3's shapes: Unassigned)

    def __repr__(self) -> str:
        return f"Shape({vars(self)!r})"


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _input_data(inputs: Any) -> list[InputData]:
    """tune()'s `inputs` as the trainer's input_data_config."""
    if isinstance(inputs, str):
        return [InputData(channel_name="training", data_source=inputs)]
    if isinstance(inputs, dict):
        return [InputData(channel_name=k, data_source=v) for k, v in inputs.items()]
    if isinstance(inputs, list) and all(isinstance(i, InputData) for i in inputs):
        return list(inputs)
    raise SpecError("inputs", "a list of InputData, an s3:// or file:// URI, or {channel: URI}")
