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
        from trainctl.controller.submit import default_store

        self.name = name
        self.store = store or default_store()

    @classmethod
    def attach(cls, name: str, store_uri: str | None = None) -> TrainingJob:
        from trainctl.record import JobStore
        from trainctl.store import open_store

        job = cls(name, open_store(store_uri) if store_uri else None)
        JobStore(job.store, name).load()  # fail now if there is no such job
        return job

    def _record(self):
        from trainctl.record import JobStore

        return JobStore(self.store, self.name).load()

    def describe(self) -> dict[str, Any]:
        """The job's record; for a job that has not ended, `controller` says whether its
        controller is live or lost (and for how long it has been silent)."""
        from trainctl.controller.supervise import controller_view
        from trainctl.record import JobStore

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

    def events(self) -> list[dict[str, Any]]:
        from trainctl.record import JobStore

        return JobStore(self.store, self.name).events()

    def metric_history(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Every metric value in time order, as dicts: time (epoch seconds), name, value,
        step, attempt, rank, redone (a step a later attempt redid; see trainctl.metrics).
        `names`: only these metrics (an unknown name is an error naming the known ones)."""
        from trainctl.record import JobStore

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
    ) -> None:
        """Print the job's node logs (every attempt) to `stream`; with `follow`, until the
        job ends. `node`: only these nodes (rank 0 or "algo-1"); `rank`: only these worker
        processes; `attempt`: only these attempts; `tail`: the last N lines, then follow;
        `since`: lines from the last "10m" (a duration or seconds); `timestamps`: each
        line's time (UTC) before it; `merge`: every node's lines interleaved by time."""
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
        from trainctl.record import JobStore

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
        instance_type: str | None = None,
        instance_count: int = 1,
        min_instance_count: int | None = None,
        processes_per_host: int | None = None,
        hyperparameters: dict[str, Any] | None = None,
        distribution: dict[str, Any] | None = None,
        environment: dict[str, str] | None = None,
        output_path: str | None = None,
        checkpoint_s3_uri: str | None = None,
        checkpoint_local_path: str | None = None,
        max_run: int | None = None,
        job_name: str | None = None,
        base_job_name: str | None = None,
        metric_definitions: list[dict[str, str]] | None = None,
        image_uri: str | None = None,
        build_image: bool | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        dependencies: list[str] | None = None,
        base_image: str | None = None,
        max_restarts: int | None = None,
        max_wait: int | None = None,
        faults: list[str] | None = None,
        store_uri: str | None = None,
        pool: str | None = None,
        region: str | None = None,
        use_spot_instances: bool | None = None,
        on_demand_fallback: bool | None = None,
        fallback_instance_types: list[str] | None = None,
        subnets: list[str] | None = None,
        security_group_ids: list[str] | None = None,
        image_id: str | None = None,
        instance_profile: str | None = None,
        volume_size: int | None = None,
        hosts: list[dict[str, Any]] | None = None,
        keep_alive_period_in_seconds: int | None = None,
        controller: str | None = None,
        arguments: list[str] | None = None,
        workdir_max_mb: float | None = None,
        workdir_ignore: list[str] | None = None,
        secret_env: list[str] | None = None,
        secret_hyperparameters: list[str] | None = None,
    ) -> None:
        self._fields: dict[str, Any] = {
            "entry_point": entry_point,
            "source_dir": source_dir,
            "arguments": arguments,
            "instance_type": instance_type,
            "instance_count": instance_count,
            "min_instance_count": min_instance_count,
            "processes_per_host": processes_per_host,
            "hyperparameters": dict(hyperparameters or {}),
            "distribution": distribution,
            "environment": dict(environment or {}),
            "output_path": output_path,
            "checkpoint_s3_uri": checkpoint_s3_uri,
            "checkpoint_local_path": checkpoint_local_path,
            "max_run": max_run,
            "job_name": job_name,
            "metric_definitions": metric_definitions,
            "image_uri": image_uri,
            "build_image": build_image,
            "framework_version": framework_version,
            "py_version": py_version,
            "dependencies": dependencies,
            "base_image": base_image,
            "max_restarts": max_restarts,
            "max_wait": max_wait,
            "faults": faults,
            "pool": pool,
            "region": region,
            "use_spot_instances": use_spot_instances,
            "on_demand_fallback": on_demand_fallback,
            "fallback_instance_types": fallback_instance_types,
            "subnets": subnets,
            "security_group_ids": security_group_ids,
            "image_id": image_id,
            "instance_profile": instance_profile,
            "volume_size": volume_size,
            "hosts": hosts,
            "keep_alive_period_in_seconds": keep_alive_period_in_seconds,
            "controller": controller,
            "workdir_max_mb": workdir_max_mb,
            "workdir_ignore": workdir_ignore,
            "secret_env": secret_env,
            "secret_hyperparameters": secret_hyperparameters,
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
        from trainctl.controller.submit import create_job, default_store
        from trainctl.estimator.inputs import split_inputs
        from trainctl.notebook import log_printer
        from trainctl.store import open_store

        uris, channel_config = split_inputs(inputs)
        fields = {**self._fields, "inputs": uris, "channel_config": channel_config}
        if job_name or self._fields["job_name"]:
            fields["job_name"] = job_name or self._fields["job_name"]
        elif self.base_job_name:
            from trainctl.controller.submit import generate_job_name

            fields["job_name"] = generate_job_name(self.base_job_name)
        spec = build_spec(**fields)
        store = open_store(self.store_uri) if self.store_uri else default_store()
        if dry_run:
            from trainctl.controller.plan import plan_job

            return plan_job(spec, store)
        record = create_job(spec, store)
        job = TrainingJob(record.name, store)
        self.latest_training_job = job
        printer = log_printer() if logs else None
        try:
            return self._run(store, record, job, spec, printer, wait)
        finally:
            _flush(printer)

    def _run(self, store: Any, record: Any, job: TrainingJob, spec: Any, printer: Any, wait: bool):
        from trainctl.controller.controller import Controller
        from trainctl.controller.submit import start_detached

        if not wait or spec.controller != "local":
            start_detached(store, record)
            if not wait:
                return job
            if printer:
                printer.info(f"job {record.name} submitted (controller {spec.controller})")
            # The remote controller runs the job; this process follows it (and takes it
            # over, should that controller be lost).
            from trainctl.controller.supervise import supervise

            final = supervise(store, record.name, printer=printer)
            if printer:
                _print_summary(printer, final)
            if final.state is not JobState.COMPLETED:
                raise JobFailedError(job, final)
            return job
        controller = Controller(store, record.name, printer=printer)
        if printer:
            printer.info(f"job {record.name} submitted (store {store.uri})")
        final = controller.run()
        if controller.handed_off:
            # The terminal closed: a detached controller runs the job now; this process
            # follows it, silently, so that fit() still returns at the job's end.
            from trainctl.controller.supervise import supervise

            printer = None
            final = supervise(store, record.name, printer=None)
        if printer:
            _print_summary(printer, final)
        if controller.interrupted_by_user:
            raise KeyboardInterrupt
        if final.state is not JobState.COMPLETED:
            raise JobFailedError(job, final)
        return job

    @classmethod
    def attach(cls, job_name: str, store_uri: str | None = None) -> TrainingJob:
        """A handle to an existing job (running or ended)."""
        return TrainingJob.attach(job_name, store_uri)


def _flush(printer: Any) -> None:
    """A notebook printer draws its last lines (a terminal one has nothing held back)."""
    if printer is not None and hasattr(printer, "flush"):
        printer.flush()


def _print_summary(printer: Any, record: Any) -> None:
    duration = f"{record.duration_s:.1f} s" if record.duration_s is not None else "-"
    printer.info(f"job {record.name}: {record.state.value} in {duration}")
    if record.model_data:
        printer.info(f"model: {record.model_data}")
    if record.failure_reason:
        printer.info(f"failure: {record.failure_reason}")
        if record.failure_detail:
            for line in record.failure_detail.splitlines():
                printer.info(f"  {line}")
    if record.stop_reason:
        printer.info(f"stopped: {record.stop_reason}")
    printer.info(f"see it again: trainctl status {record.name} · trainctl logs {record.name}")
