"""Capacity for a job's attempts: how many nodes to ask the provider for, and when.

A job asks for its full size and waits while there is none. An elastic job
(`min_instance_count`) asks for its full size for `elastic_wait_seconds`, then for fewer,
down to its minimum; while it runs below its full size, `growth` says when to checkpoint and
relaunch at a larger one. The provider only ever sees a `CapacityRequest` of one size.

Which market each attempt asks for, and when a job on on-demand capacity tries spot again,
is the job's recovery strategy's (trainctl.controller.recovery).
"""

from __future__ import annotations

from collections.abc import Callable

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.controller.budget import resumes_where_stopped
from trainctl.controller.deadline import Pace
from trainctl.controller.recovery import ASKED_PROBE_SECONDS, RecoveryContext, for_job
from trainctl.provisioning.base import CapacityProbe, NoCapacityError, Provider
from trainctl.record.jobstore import JobStore
from trainctl.record.models import JobRecord
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import Settings

# How long to wait between asks while a provider has no capacity (EC2 waits in its own
# capacity rounds before it says so; this machine and SSH hosts answer at once).
RETRY_SECONDS = 2.0
# A wait's reason is saved to the record at most this often while it changes (a store PUT).
WAITING_SAVE_SECONDS = 30.0


class StoppedWaiting(Exception):
    """A stop request, max_wait or max_run ended the job while it waited for capacity."""


class CapacitySizer:
    """Sizes one job's attempts against its provider."""

    def __init__(
        self,
        provider: Provider,
        jobs: JobStore,
        record: JobRecord,
        settings: Settings,
        *,
        should_stop: Callable[[], str | None],
        info: Callable[[str], None],
        deadline_slack: Callable[[], float | None] = lambda: None,
        pace: Callable[[], Pace | None] = lambda: None,
    ) -> None:
        """`should_stop()`: why the job must stop now (a stop request, a time limit), else
        None; `info(message)`: a line for the submitter; `deadline_slack()`: seconds the job
        can still spend not training and finish by its max_wait (None: no deadline)."""
        self.provider = provider
        self.jobs = jobs
        self.record = record
        self.settings = settings
        self.should_stop = should_stop
        self.info = info
        self._waiting_saved = 0.0  # when the record last took a new `waiting`
        # When the last ask for capacity began: an attempt's capacity stage before the ask
        # that got its nodes was a wait for capacity (no node paid for: record.goodput).
        self.last_ask_at = 0.0
        self.recovery = RecoveryContext(
            provider, jobs, record, settings, info, deadline_slack=deadline_slack, pace=pace
        )

    def _market(self, request: CapacityRequest) -> CapacityRequest:
        """`request` as the job's recovery strategy asks for it now."""
        return for_job(self.record).market(self.recovery, request)

    @property
    def request(self) -> CapacityRequest:
        """The job's full capacity."""
        return CapacityRequest.of(self.record.spec)

    def provision(self, attempt: int) -> tuple[ClusterInfo, str | None]:
        """The attempt's nodes, and how its size changed (None: it did not)."""
        cluster, resized = self._provision_sized(attempt)
        self.recovery.after_provision(cluster, attempt)
        return cluster, resized

    def _provision_sized(self, attempt: int) -> tuple[ClusterInfo, str | None]:
        spec = self.record.spec
        request = self.request
        if not spec.elastic:
            cluster = self._until_capacity(lambda: self._provision(self._market(request), attempt))
            return cluster, None
        full = spec.instance_count
        before = len(self.record.attempts[-1].nodes) if self.record.attempts else full
        wait = self.settings.elastic_wait_seconds
        deadline = clock().monotonic() + wait
        last: Exception | None = None
        while True:  # the full size, for as long as elastic_wait_seconds allows
            try:
                cluster = self._provision(
                    self._market(request).retrying_for(deadline - clock().monotonic()), attempt
                )
                return cluster, self._resized(full, before, "capacity is back")
            except NoCapacityError as exc:
                last = exc
            if clock().monotonic() >= deadline or self.jobs.stop_requested():
                break
            clock().sleep(min(RETRY_SECONDS, max(0.0, deadline - clock().monotonic())))
        why = f"no capacity for {full} node(s) within {wait:.0f} s ({last})"
        for size in range(full - 1, spec.min_nodes - 1, -1):
            smaller = request.with_count(size).retrying_for(1)
            if smaller.use_spot_instances and smaller.on_demand_fallback:
                smaller = smaller.spot_only()  # on demand, the full size is as easy
            try:
                cluster = self._provision(smaller, attempt)
            except NoCapacityError as exc:
                last = exc
                continue
            return cluster, self._resized(size, before, why)
        # At its minimum an elastic job waits for capacity as any job does (and falls back
        # to on-demand, at its full size, once its deadline says so).
        smallest = request.with_count(spec.min_nodes).retrying_for(wait)
        cluster = self._until_capacity(lambda: self._provision(self._market(smallest), attempt))
        return cluster, self._resized(len(cluster.nodes), before, why)

    def _provision(self, request: CapacityRequest, attempt: int) -> ClusterInfo:
        self.last_ask_at = clock().monotonic()
        return self.provider.provision(request, self.record.name, attempt)

    def _until_capacity(self, provision: Callable[[], ClusterInfo]) -> ClusterInfo:
        """provision() again while there is no capacity (a provider that waits itself, as
        EC2's capacity rounds, returns or raises after its own wait), until a stop request,
        max_wait or max_run ends the job."""
        waiting = False
        while True:
            try:
                cluster = provision()
            except NoCapacityError as exc:
                if reason := self.should_stop():
                    self.record.waiting = None  # (saved with the job's end)
                    raise StoppedWaiting(f"{reason} (while waiting for capacity: {exc})") from None
                if not waiting:
                    waiting = True
                    self.jobs.event("waiting_for_capacity", why=str(exc))
                    self.info(f"waiting for capacity: {exc}")
                self._say_waiting(str(exc))
                clock().sleep(RETRY_SECONDS)
                continue
            self._say_waiting(None)
            return cluster

    def _say_waiting(self, why: str | None) -> None:
        """Why the job waits for capacity now (a scheduler's queue reason), in the record
        for `status` and describe(); None once it has its nodes. A reason that changes at
        every ask (one that counts seconds) is saved at most every WAITING_SAVE_SECONDS."""
        if self.record.waiting == why:
            return
        now = clock().monotonic()
        if why is not None and self.record.waiting is not None:
            if now - self._waiting_saved < WAITING_SAVE_SECONDS:
                return
        self._waiting_saved = now
        self.record.waiting = why
        try:
            self.jobs.save(self.record)
        except Exception as exc:  # shown later, or not: the wait goes on all the same
            self.info(f"could not record why the job waits: {exc}")

    def _resized(self, nodes: int, before: int, why: str) -> str | None:
        full = self.record.spec.instance_count
        if nodes < before:
            return f"shrunk to {nodes} of {full} node(s): {why}"
        if nodes > before:
            return f"grown to {nodes} of {full} node(s): {why}"
        return None

    def growth(self, size: int, trained_for: float) -> str | None:
        """Why an elastic job running on `size` nodes, `trained_for` seconds into training,
        should checkpoint now and relaunch larger; None while it should not."""
        spec = self.record.spec
        if not spec.elastic or size >= spec.instance_count:
            return None
        try:
            available = (
                self.provider.available_nodes(self.request, self.record.name)
                if isinstance(self.provider, CapacityProbe)
                else None
            )
        except Exception:  # asking is best effort: the next check asks again
            return None
        if available is None:
            # A provider that cannot count without launching (EC2): asked whether spot has
            # room for the full size (placement scores), it grows when the answer is good;
            # without an answer, every elastic_probe_seconds of training it tries the full
            # size again (a checkpoint and a relaunch; without the capacity the next attempt
            # shrinks back).
            asked = None
            if spec.use_spot_instances and trained_for >= ASKED_PROBE_SECONDS:
                asked = self.recovery.spot_answer(spec.instance_count)
            if asked:
                return f"growing: spot is said to have room for {spec.instance_count} node(s)"
            if asked is False or trained_for < self.settings.elastic_probe_seconds:
                return None
            return f"growing: trying for {spec.instance_count} node(s) again"
        if available <= size:
            return None
        return f"growing: capacity for {min(available, spec.instance_count)} node(s) is back"

    def better_relaunch(
        self, cluster: ClusterInfo, trained_for: float, *, state_stored: bool
    ) -> tuple[str, str] | None:
        """Whether the attempt on `cluster`, `trained_for` seconds into its training, should
        checkpoint and relaunch by choice: ("growing", why) for an elastic job below its
        full size once there is room, ("trying_spot", why) for a job on its on-demand
        fallback once it is time to try spot again; None while it should not.
        `state_stored`: the attempt's nodes put saved state in the store."""
        grow = self.growth(len(cluster.nodes), trained_for)
        if grow:
            return "growing", grow
        attempts = self.record.attempts
        saved = (
            state_stored
            or attempts[-1].last_checkpoint_step is not None
            or resumes_where_stopped(attempts[:-1])
        )
        spot = for_job(self.record).leave_for_spot(self.recovery, cluster, trained_for, saved)
        return ("trying_spot", spot) if spot else None
