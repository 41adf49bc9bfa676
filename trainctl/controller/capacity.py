"""Capacity for a job's attempts: how many nodes to ask the provider for, and when.

A job asks for its full size and waits while there is none. An elastic job
(`min_instance_count`) asks for its full size for `elastic_wait_seconds`, then for fewer,
down to its minimum; while it runs below its full size, `growth` says when to checkpoint and
relaunch at a larger one. The provider only ever sees a `CapacityRequest` of one size.
"""

from __future__ import annotations

from collections.abc import Callable

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.provisioning.base import CapacityProbe, NoCapacityError, Provider
from trainctl.record import JobRecord, JobStore
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import Settings

# How long to wait between asks while a provider has no capacity (EC2 waits in its own
# capacity rounds before it says so; this machine and SSH hosts answer at once).
RETRY_SECONDS = 2.0


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
    ) -> None:
        """`should_stop()`: why the job must stop now (a stop request, a time limit), else
        None; `info(message)`: a line for the submitter."""
        self.provider = provider
        self.jobs = jobs
        self.record = record
        self.settings = settings
        self.should_stop = should_stop
        self.info = info

    @property
    def request(self) -> CapacityRequest:
        """The job's full capacity."""
        return CapacityRequest.of(self.record.spec)

    def provision(self, attempt: int) -> tuple[ClusterInfo, str | None]:
        """The attempt's nodes, and how its size changed (None: it did not)."""
        spec = self.record.spec
        request = self.request
        if not spec.elastic:
            return self._until_capacity(lambda: self._provision(request, attempt)), None
        full = spec.instance_count
        before = len(self.record.attempts[-1].nodes) if self.record.attempts else full
        wait = self.settings.elastic_wait_seconds
        deadline = clock().monotonic() + wait
        last: Exception | None = None
        while True:  # the full size, for as long as elastic_wait_seconds allows
            try:
                cluster = self._provision(
                    request.with_max_wait(deadline - clock().monotonic()), attempt
                )
                return cluster, self._resized(full, before, "capacity is back")
            except NoCapacityError as exc:
                last = exc
            if clock().monotonic() >= deadline or self.jobs.stop_requested():
                break
            clock().sleep(min(RETRY_SECONDS, max(0.0, deadline - clock().monotonic())))
        why = f"no capacity for {full} node(s) within {wait:.0f} s ({last})"
        for size in range(full - 1, spec.min_nodes - 1, -1):
            try:
                cluster = self._provision(request.with_count(size).with_max_wait(1), attempt)
            except NoCapacityError as exc:
                last = exc
                continue
            return cluster, self._resized(size, before, why)
        # At its minimum an elastic job waits for capacity as any job does.
        smallest = request.with_count(spec.min_nodes).with_max_wait(wait)
        cluster = self._until_capacity(lambda: self._provision(smallest, attempt))
        return cluster, self._resized(spec.min_nodes, before, why)

    def _provision(self, request: CapacityRequest, attempt: int) -> ClusterInfo:
        return self.provider.provision(request, self.record.name, attempt)

    def _until_capacity(self, provision: Callable[[], ClusterInfo]) -> ClusterInfo:
        """provision() again while there is no capacity (a provider that waits itself, as
        EC2's capacity rounds, returns or raises after its own wait), until a stop request,
        max_wait or max_run ends the job."""
        waiting = False
        while True:
            try:
                return provision()
            except NoCapacityError as exc:
                if reason := self.should_stop():
                    raise StoppedWaiting(f"{reason} (while waiting for capacity: {exc})") from None
                if not waiting:
                    waiting = True
                    self.jobs.event("waiting_for_capacity", why=str(exc))
                    self.info(f"waiting for capacity: {exc}")
                clock().sleep(RETRY_SECONDS)

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
            # A provider that cannot tell without launching (EC2): every
            # elastic_probe_seconds of training, try the full size again (a checkpoint and
            # a relaunch; without the capacity the next attempt shrinks back).
            if trained_for < self.settings.elastic_probe_seconds:
                return None
            return f"growing: trying for {spec.instance_count} node(s) again"
        if available <= size:
            return None
        return f"growing: capacity for {min(available, spec.instance_count)} node(s) is back"
