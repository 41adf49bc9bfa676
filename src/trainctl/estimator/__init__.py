"""The user API: `Estimator` builds a validated JobSpec; `TrainingJob` is a handle to a job.

No cloud calls here: the controller does the work, in this process (`fit(wait=True)`) or in
a detached one (`fit(wait=False)`).
"""

from __future__ import annotations

import sys
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.spec.build import build_spec
from trainctl.spec.job import JobSpec
from trainctl.state import JobState

__all__ = ["Estimator", "JobFailedError", "JobSpec", "TrainingJob"]


class JobFailedError(TrainctlError):
    """`fit()` / `wait()` ended with the job not Completed; `.job` is its handle."""

    def __init__(self, job: TrainingJob, record: Any) -> None:
        self.job = job
        why = record.failure_reason or record.stop_reason or ""
        code = f" (exit code {record.exit_code})" if record.exit_code not in (None, 0) else ""
        super().__init__(f"job {job.name} {record.state.value}{code}" + (f": {why}" if why else ""))


class TrainingJob:
    """A handle to a job in the store: describe, wait, follow logs, stop."""

    def __init__(self, name: str, store: Any = None) -> None:
        from trainctl.store import default_store

        self.name = name
        self.store = store or default_store()

    @classmethod
    def attach(cls, name: str, store_uri: str | None = None) -> TrainingJob:
        from trainctl.record.jobstore import JobStore
        from trainctl.store import open_store

        job = cls(name, open_store(store_uri) if store_uri else None)
        JobStore(job.store, name).load()  # fail now if there is no such job
        return job

    def _record(self):
        from trainctl.record.jobstore import JobStore

        return JobStore(self.store, self.name).load()

    def describe(self) -> dict[str, Any]:
        """The job's record; for a job that has not ended, `controller` says whether its
        controller is live or lost (and for how long it has been silent)."""
        from trainctl.controller.supervise import controller_view
        from trainctl.record.jobstore import JobStore

        jobs = JobStore(self.store, self.name)
        record = jobs.load()
        return {**record.describe(), "controller": controller_view(jobs, record)}

    def __repr__(self) -> str:
        try:
            record = self._record()
        except Exception:  # the store unreachable: still a usable repr
            return f"TrainingJob({self.name!r})"
        return f"TrainingJob({self.name!r}, state={record.state.value!r})"

    def _repr_html_(self) -> str:
        """The notebook view: state, attempts, cost, latest metrics and their curves."""
        from trainctl.notebook import job_html

        return job_html(self.describe(), self.metric_history())

    @property
    def state(self) -> JobState:
        return self._record().state

    @property
    def model_data(self) -> str | None:
        return self._record().model_data

    def events(self, types: list[str] | None = None) -> list[dict[str, Any]]:
        """The job's timeline (events.jsonl), oldest first: dicts with `time`, `type` and
        the event's fields; `types`: only events of these types."""
        from trainctl.record.jobstore import JobStore

        found = JobStore(self.store, self.name).events()
        return found if not types else [e for e in found if e.get("type") in types]

    def follow_events(
        self,
        on_event: Any,
        *,
        types: list[str] | None = None,
        follow: bool = False,
        poll: float = 0.5,
    ) -> None:
        """`on_event(event)` for each event of the timeline (`types`: only these); with
        `follow`, for each new one too, until the job ends (or nobody controls it)."""
        import time

        seen = 0
        while True:
            done = self._ended_or_unwatched()
            found = self.events()
            for event in found[seen:]:
                if not types or event.get("type") in types:
                    on_event(event)
            seen = len(found)
            if not follow or done:
                return
            time.sleep(poll)

    def metric_history(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Every metric value in time order, as dicts: time (epoch seconds), name, value,
        step, attempt, rank, redone (a step a later attempt redid; see trainctl.metrics).
        `names`: only these metrics (an unknown name is an error naming the known ones)."""
        from trainctl.record.jobstore import JobStore

        points = JobStore(self.store, self.name).metric_history()
        if names:
            known = sorted({p["name"] for p in points})
            unknown = [n for n in names if n not in known]
            if unknown:
                from trainctl.errors import SpecError

                raise SpecError(
                    "--metric",
                    f"job {self.name} has no metric {unknown[0]!r} "
                    f"(its metrics: {', '.join(known) or 'none yet'})",
                )
            points = [p for p in points if p["name"] in names]
        return points

    def metrics(self, names: list[str] | None = None, *, as_frame: bool | None = None) -> Any:
        """The metric history (see `metric_history`): a pandas DataFrame when pandas is
        installed (or `as_frame=True`), else a list of dicts."""
        points = self.metric_history(names)
        if as_frame is False:
            return points
        try:
            import pandas as pd
        except ImportError:
            if as_frame:
                raise
            return points
        columns = ["time", "name", "value", "step", "attempt", "rank", "redone"]
        frame = pd.DataFrame(points, columns=columns)
        frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
        return frame

    def plot_metrics(self, names: list[str] | None = None, width: int = 80) -> str:
        """Terminal charts (one per metric) of the current curves, attempts marked."""
        from trainctl.metrics import terminal_chart

        points = self.metric_history(names)
        shown = names or sorted({p["name"] for p in points})
        return "\n".join(terminal_chart(points, name, width=width) for name in shown)

    def wait(self, logs: bool = False, timeout: float | None = None, raise_on_failure: bool = True):
        """Block until the job ends; with `logs`, stream its node logs meanwhile. A job
        whose controller is lost (killed, a closed laptop) is taken over by this process,
        which then runs it to its end: waiting never hangs on a dead controller."""
        from trainctl.controller.supervise import supervise
        from trainctl.notebook import log_printer

        printer = log_printer() if logs else None
        try:
            record = supervise(self.store, self.name, printer=printer, timeout=timeout)
        finally:
            _flush(printer)
        if raise_on_failure and record.state is not JobState.COMPLETED:
            raise JobFailedError(self, record)
        return record.describe()

    def logs(
        self,
        follow: bool = False,
        stream: Any = None,
        *,
        node: list[int | str] | int | str | None = None,
        rank: list[int] | int | None = None,
        attempt: list[int] | int | None = None,
        tail: int | None = None,
        since: str | float | None = None,
        timestamps: bool = False,
        merge: bool = False,
        prefix: bool = True,
        output: str = "text",
    ) -> None:
        """Print the job's node logs (every attempt) to `stream`; with `follow`, until the
        job ends. `node`: only these nodes (rank 0 or "algo-1"); `rank`: only these worker
        processes (their global ranks; a node of one process is its node's rank);
        `attempt`: only these attempts; `tail`: each node's last N lines, then follow;
        `since`: lines from the last "10m" (a duration or seconds) or since a time
        ("2026-12-02T10:00:00Z"); `timestamps`: each line's time (UTC) before it; `merge`:
        every node's lines interleaved by time; `prefix=False`: without `[algo-N]`;
        `output="json"`: a JSON object a line (time, attempt, node, rank, line)."""
        from trainctl.controller.logs import LogPrinter, follow_logs, log_selection

        def listed(value: Any) -> list[Any] | None:
            return None if value is None else list(value) if isinstance(value, list) else [value]

        selection = log_selection(
            nodes=listed(node),
            ranks=listed(rank),
            attempts=listed(attempt),
            since=since,
            tail=tail,
            merge=merge,
            timestamps=timestamps,
            prefix=prefix,
            output=output,
        )
        follow_logs(
            self.store,
            self.name,
            LogPrinter(stream or sys.stdout),
            follow=follow,
            is_done=self._ended_or_unwatched,
            selection=selection,
        )

    def _ended_or_unwatched(self) -> bool:
        """Following logs ends with the job, or when nobody controls it any more."""
        from trainctl.controller.supervise import controller_view
        from trainctl.record.jobstore import JobStore

        jobs = JobStore(self.store, self.name)
        record = jobs.load()
        view = controller_view(jobs, record)
        return view is None or bool(view["lost"])

    def remove(self) -> None:
        """Delete the ended job: its store prefix (record, logs, metrics, and the outputs
        and checkpoints kept there) and its node directories; outputs written elsewhere
        stay. A job that has not ended is refused (SpecError), nothing deleted."""
        from trainctl.controller.remove import remove_jobs

        remove_jobs(self.store, [self.name])

    def stop(self, wait: bool = True) -> dict[str, Any]:
        from trainctl.controller.submit import stop_job

        return stop_job(self.store, self.name, wait=wait).describe()


class Estimator:
    """SageMaker-style estimator: describe the job once, `fit()` it on inputs.

    `instance_type="local"` (the default) runs each node as local processes with the store
    in a directory; the same code runs elsewhere by changing the instance type (an EC2 GPU
    type, or "ssh" with `hosts`) or by naming a resource `pool` from config.yaml.
    """

    def __init__(
        self,
        entry_point: str,
        source_dir: str | None = None,
        *,
        base_job_name: str | None = None,
        store_uri: str | None = None,
        **fields: Any,
    ) -> None:
        # Every other keyword is a job field (trainctl.spec.fields): the signature below is
        # made from JobSpec, so a new field needs no edit here.
        from trainctl.spec.catalog import plugin_blocks

        # (an installed provider plug-in's options are a keyword too: slurm={...})
        known = _estimator_fields() | set(plugin_blocks())
        for name in fields:
            if name not in known:
                import difflib

                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"Estimator() got an unexpected keyword argument {name!r}{hint}")
        self._fields: dict[str, Any] = {
            **fields,
            "entry_point": entry_point,
            "source_dir": source_dir,
        }
        self.base_job_name = base_job_name
        self.store_uri = store_uri
        self.spec = build_spec(**self._fields)  # bad input fails here, at construction
        self.latest_training_job: TrainingJob | None = None

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.spec.hyperparameters)

    @property
    def model_data(self) -> str | None:
        return self.latest_training_job.model_data if self.latest_training_job else None

    def _repr_html_(self) -> str:
        """The notebook view: what the estimator runs, and its latest job."""
        import html

        spec = self.spec
        head = html.escape(
            f"Estimator: {spec.entry_point} on {spec.instance_count} x {spec.instance_type} "
            f"({spec.launcher})"
        )
        job = self.latest_training_job
        return f"<div><b>{head}</b>{job._repr_html_() if job else '<div>no job yet</div>'}</div>"

    def fit(
        self,
        inputs: Any = None,
        wait: bool = True,
        logs: bool = True,
        job_name: str | None = None,
        dry_run: bool = False,
    ) -> Any:
        """Run the job. `inputs`: a URI or a TrainingInput (channel 'training'), or
        {channel: URI or TrainingInput}.

        With `wait`, returns the TrainingJob when the job ends and raises JobFailedError
        unless it Completed; without, returns it at once while a detached controller runs
        the job. With `dry_run`, runs nothing and returns the plan (a dict: the requests
        provisioning would send and each node's commands and environment; see
        trainctl.controller.plan).
        """
        from trainctl.controller.submit import create_job, run_job
        from trainctl.notebook import log_printer

        spec = self.job_spec(inputs, job_name)
        store = self.store()
        if dry_run:
            from trainctl.controller.plan import plan_job

            return plan_job(spec, store)
        record = create_job(spec, store)
        job = TrainingJob(record.name, store)
        self.latest_training_job = job
        printer = log_printer() if logs else None
        try:
            outcome = run_job(store, record, printer=printer, wait=wait)
        finally:
            _flush(printer)
        if outcome.detached:
            return job
        if outcome.interrupted:
            raise KeyboardInterrupt
        if not outcome.completed:
            raise JobFailedError(job, outcome.record)
        return job

    def job_spec(self, inputs: Any = None, job_name: str | None = None, **fields: Any) -> Any:
        """The JobSpec `fit(inputs, job_name=...)` would run, with `fields` on top (a tuning
        trial's hyperparameters, say); SpecError on bad input."""
        from trainctl.estimator.inputs import split_inputs

        uris, channel_config = split_inputs(inputs)
        merged = {**self._fields, "inputs": uris, "channel_config": channel_config, **fields}
        if job_name or self._fields.get("job_name"):
            merged["job_name"] = job_name or self._fields["job_name"]
        elif self.base_job_name:
            from trainctl.controller.submit import generate_job_name

            merged["job_name"] = generate_job_name(self.base_job_name)
        return build_spec(**merged)

    def store(self) -> Any:
        """The store this estimator's jobs go to."""
        from trainctl.store import default_store, open_store

        return open_store(self.store_uri) if self.store_uri else default_store()

    @classmethod
    def from_spec(cls, spec: Any, store_uri: str | None = None) -> Estimator:
        """The estimator whose jobs are `spec` (its job name left out: each fit names its
        own), e.g. a tuning job's trials or its best one."""
        fields = spec.model_dump(exclude={"job_name"}, exclude_defaults=True)
        entry = fields.pop("entry_point")
        source = fields.pop("source_dir", None)
        return cls(entry, source, store_uri=store_uri, **fields)

    @classmethod
    def attach(cls, job_name: str, store_uri: str | None = None) -> TrainingJob:
        """A handle to an existing job (running or ended)."""
        return TrainingJob.attach(job_name, store_uri)


def _flush(printer: Any) -> None:
    """A notebook printer draws its last lines (a terminal one has nothing held back)."""
    if printer is not None and hasattr(printer, "flush"):
        printer.flush()


def _estimator_fields() -> frozenset[str]:
    from trainctl.spec.fields import job_fields

    return frozenset(f.name for f in job_fields() if f.door.estimator)


def _describe_fields() -> None:
    """Estimator.__init__'s signature and docstring list every job field (for help(), IDEs
    that inspect at run time, and the API docs)."""
    import inspect

    from trainctl.spec.fields import estimator_doc, estimator_signature

    init = Estimator.__init__
    P = inspect.Parameter
    head = [
        P("self", P.POSITIONAL_OR_KEYWORD),
        P("entry_point", P.POSITIONAL_OR_KEYWORD, annotation=str),
        P("source_dir", P.POSITIONAL_OR_KEYWORD, default=None, annotation=str | None),
        P("base_job_name", P.KEYWORD_ONLY, default=None, annotation=str | None),
        P("store_uri", P.KEYWORD_ONLY, default=None, annotation=str | None),
    ]
    init.__signature__ = estimator_signature(head)  # type: ignore[attr-defined]
    init.__doc__ = (
        "Describe the job. `base_job_name`: the prefix of generated job names; `store_uri`: "
        "the store (default: settings' TRAINCTL_STORE). Job fields (YAML keys and "
        "`trainctl submit` flags of the same names):\n\n" + estimator_doc()
    )


_describe_fields()
