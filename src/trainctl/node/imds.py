"""A small EC2 instance metadata (IMDSv2) client for the node agent.

IMDSv2 is session based: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
returns a token, and every `GET` carries it in `X-aws-ec2-metadata-token`. Instances launched
by trainctl require IMDSv2 (no token, no answer: 401), so there is no IMDSv1 fallback.

The agent polls `meta-data/spot/instance-action` (404 until EC2 decides to reclaim the spot
instance, then `{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}`, about two minutes
ahead). A poll must never take the agent down, so the typed accessors (`spot_instance_action`,
`instance_id`, ...) return None on any failure and leave the reason in `last_error`; `get`
is the raising primitive underneath.

Only the standard library (urllib): the agent runs on bare nodes and must start fast. The
endpoint follows botocore's settings: `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else
`AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`, else http://169.254.169.254, and
`AWS_EC2_METADATA_DISABLED=true` turns it off. Proxies are never used: the service is
link-local, and a proxy would answer for a different machine (or leak the token).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, TypeVar
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_ENDPOINT",
    "ENDPOINT_ENV",
    "ImdsClient",
    "ImdsError",
    "RebalanceRecommendation",
    "SpotInstanceAction",
    "imds_endpoint",
]

DEFAULT_ENDPOINT = "http://169.254.169.254"
IPV6_ENDPOINT = "http://[fd00:ec2::254]"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
ENDPOINT_MODE_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"
DISABLED_ENV = "AWS_EC2_METADATA_DISABLED"

TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL_SECONDS = 21600  # what EC2 allows (6 h), and what botocore asks for

SPOT_INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
AVAILABILITY_ZONE_PATH = "/latest/meta-data/placement/availability-zone"
IDENTITY_DOCUMENT_PATH = "/latest/dynamic/instance-identity/document"


T = TypeVar("T")


class SpotInstanceAction(TypedDict):
    """EC2's spot interruption notice, as served at meta-data/spot/instance-action."""

    action: str  # "terminate", "stop" or "hibernate"
    time: str  # when it happens, UTC, e.g. "2026-03-01T12:00:00Z"


class RebalanceRecommendation(TypedDict):
    """An early sign that the spot instance is at elevated risk of interruption."""

    noticeTime: str


class ImdsError(Exception):
    """The metadata service could not answer (unreachable, refused, or a bad response)."""


def imds_endpoint(env: Mapping[str, str] | None = None) -> str:
    """The metadata service's base URL, chosen the way botocore chooses it."""
    env = os.environ if env is None else env
    custom = env.get(ENDPOINT_ENV, "").strip()
    if custom:
        return custom.rstrip("/")
    if env.get(ENDPOINT_MODE_ENV, "").strip().lower() == "ipv6":
        return IPV6_ENDPOINT
    return DEFAULT_ENDPOINT


class ImdsClient:
    """IMDSv2 with one cached session token, renewed before it expires and on a 401.

    Thread-safe: the token is shared under a lock, requests run in the caller's thread.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = 1.0,
        token_ttl_seconds: int = MAX_TOKEN_TTL_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.endpoint = (endpoint or imds_endpoint(env)).rstrip("/")
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{ENDPOINT_ENV}: {self.endpoint!r} is not an http:// or https:// URL "
                "(e.g. http://169.254.169.254)"
            )
        if not 1 <= token_ttl_seconds <= MAX_TOKEN_TTL_SECONDS:
            raise ValueError(f"token_ttl_seconds must be 1..{MAX_TOKEN_TTL_SECONDS}")
        self.timeout = timeout
        self.token_ttl_seconds = token_ttl_seconds
        self.disabled = env.get(DISABLED_ENV, "false").strip().lower() == "true"
        # Renew with a tenth of the lifetime left (at most a minute): a token never expires
        # between being checked and being used, even with a slow clock or a slow request.
        self._renew_margin = min(60.0, token_ttl_seconds / 10)
        self._token: str | None = None
        self._token_expires = 0.0  # time.monotonic() deadline
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.last_error: str | None = None  # why the last accessor call returned None

    # -- the primitives -------------------------------------------------------------------
    def _open(self, request: urllib.request.Request) -> tuple[int, bytes]:
        """(status, body) for any HTTP answer; ImdsError when there is none."""
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, b""
        except (OSError, ValueError, http.client.HTTPException) as exc:  # also timeouts, resets
            reason = getattr(exc, "reason", exc)
            raise ImdsError(f"no answer from {self.endpoint}: {reason!s}"[:300]) from None

    def _fetch_token(self) -> str:
        request = urllib.request.Request(
            self.endpoint + TOKEN_PATH,
            method="PUT",
            headers={TOKEN_TTL_HEADER: str(self.token_ttl_seconds)},
        )
        started = time.monotonic()
        status, body = self._open(request)
        if status != 200 or not body:
            # 403: IMDS turned off for the instance; 400: a bad TTL. Never the token itself.
            raise ImdsError(f"token request refused (HTTP {status})")
        self._token = body.decode("ascii", "replace").strip()
        self._token_expires = started + self.token_ttl_seconds
        return self._token

    def _current_token(self, *, renew: bool = False) -> str:
        with self._lock:
            fresh = time.monotonic() < self._token_expires - self._renew_margin
            if self._token is not None and fresh and not renew:
                return self._token
            self._token = None
            return self._fetch_token()

    def get(self, path: str) -> str | None:
        """GET a metadata path ("/latest/meta-data/..."): its text, or None on 404.

        Raises ImdsError for anything else. A 401 (the token expired or the service was
        restarted) gets one retry with a new token.
        """
        if self.disabled:
            raise ImdsError(f"disabled by {DISABLED_ENV}=true")
        if not path.startswith("/"):
            path = "/" + path
        for attempt in range(2):
            token = self._current_token(renew=attempt > 0)
            request = urllib.request.Request(
                self.endpoint + path, method="GET", headers={TOKEN_HEADER: token}
            )
            status, body = self._open(request)
            if status == 200:
                return body.decode("utf-8", "replace")
            if status == 404:
                return None
            if status != 401:
                raise ImdsError(f"GET {path}: HTTP {status}")
        raise ImdsError(f"GET {path}: HTTP 401 with a new token")

    def _get_json(self, path: str) -> dict[str, Any] | None:
        text = self.get(path)
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            raise ImdsError(f"GET {path}: not JSON: {text[:80]!r}") from None
        if not isinstance(data, dict):
            raise ImdsError(f"GET {path}: expected a JSON object, got {text[:80]!r}")
        return data

    # -- the accessors: never raise -------------------------------------------------------
    def _quietly(self, fetch: Callable[[], T]) -> T | None:
        try:
            value = fetch()
        except ImdsError as exc:
            self.last_error = str(exc)
            return None
        except Exception as exc:  # a poll must never take the agent down
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        self.last_error = None
        return value

    def spot_instance_action(self) -> SpotInstanceAction | None:
        """The spot interruption notice, or None: none yet (404), or no answer (last_error)."""

        def fetch() -> SpotInstanceAction | None:
            data = self._get_json(SPOT_INSTANCE_ACTION_PATH)
            if data is None:
                return None
            action, when = data.get("action"), data.get("time")
            if not isinstance(action, str) or not isinstance(when, str):
                raise ImdsError(f"spot/instance-action without action and time: {data!r}")
            return SpotInstanceAction(action=action, time=when)

        return self._quietly(fetch)

    def rebalance_recommendation(self) -> RebalanceRecommendation | None:
        """EC2's rebalance recommendation (an earlier, softer warning than the notice)."""

        def fetch() -> RebalanceRecommendation | None:
            data = self._get_json(REBALANCE_PATH)
            if data is None:
                return None
            return RebalanceRecommendation(noticeTime=str(data.get("noticeTime", "")))

        return self._quietly(fetch)

    def instance_id(self) -> str | None:
        return self._quietly(lambda: _stripped(self.get(INSTANCE_ID_PATH)))

    def availability_zone(self) -> str | None:
        return self._quietly(lambda: _stripped(self.get(AVAILABILITY_ZONE_PATH)))

    def region(self) -> str | None:
        """The instance's region, from its identity document."""

        def fetch() -> str | None:
            document = self._get_json(IDENTITY_DOCUMENT_PATH)
            region = document.get("region") if document else None
            return region if isinstance(region, str) and region else None

        return self._quietly(fetch)


def _stripped(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None
