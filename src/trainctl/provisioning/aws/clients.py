"""boto3 sessions and clients for the EC2 provider, and the helpers every module shares.

boto3 is imported inside functions only: `trainctl --help` must not pay for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from trainctl.errors import SpecError, TrainctlError

T = TypeVar("T")

SessionFactory = Callable[[str], Any]  # region -> boto3.session.Session


class AwsError(TrainctlError):
    """An EC2/IAM/SSM/STS call failed for a reason other than bad input."""


def default_session(region: str) -> Any:
    from trainctl.store.boto import new_session

    return new_session(region)


def client_config() -> Any:
    from botocore.config import Config

    return Config(retries={"mode": "adaptive", "max_attempts": 10})


class Clients:
    """One client per (service, region), made once: building clients is not thread-safe,
    using them is."""

    def __init__(self, session_factory: SessionFactory | None = None) -> None:
        self._session_factory = session_factory or default_session
        self._sessions: dict[str, Any] = {}
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def __call__(self, service: str, region: str) -> Any:
        key = (service, region)
        client = self._clients.get(key)
        if client is None:
            with self._lock:
                client = self._clients.get(key)
                if client is None:
                    session = self._sessions.get(region)
                    if session is None:
                        session = self._sessions[region] = self._session_factory(region)
                    client = session.client(service, region_name=region, config=client_config())
                    self._clients[key] = client
        return client


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", "")) or str(exc)
    return str(exc)


def env_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def configured_region() -> str | None:
    """The region of the environment or the AWS config profile, as boto3 would pick it."""
    region = env_region()
    if region:
        return region
    try:
        import botocore.session

        return botocore.session.get_session().get_config_variable("region") or None
    except Exception:  # a broken profile is reported by the calls that need it
        return None


def resolve_region(spec_region: str | None, default: str | None = None) -> str:
    region = spec_region or default or configured_region()
    if not region:
        raise SpecError(
            "region",
            "no AWS region: set region (e.g. region='us-east-1'), AWS_DEFAULT_REGION or a "
            "region in your AWS profile",
        )
    return region


def tags_of(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", []) or []}


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class Timing:
    """Time as the provider sees it; tests swap in a fake clock whose sleep advances it."""

    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll_seconds: float = 5.0

    def poll_until(
        self,
        check: Callable[[], T | None],
        *,
        timeout: float,
        what: str,
    ) -> T:
        """Call `check` until it returns something other than None; AwsError after `timeout`."""
        deadline = self.clock() + timeout
        while True:
            result = check()
            if result is not None:
                return result
            if self.clock() + self.poll_seconds > deadline:
                raise AwsError(f"timed out after {timeout:.0f} s waiting for {what}")
            self.sleep(self.poll_seconds)
