"""A local stand-in for the EC2 instance metadata service (IMDSv2 required), for tests.

A real HTTP server (ThreadingHTTPServer in a thread) on a loopback address and a free port,
speaking IMDSv2 the way EC2 does with `HttpTokens=required`:

- `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: 1..21600` returns a
  session token (400 without a valid TTL, 403 with `X-Forwarded-For`, as EC2 refuses
  proxied token requests); every GET needs a live token in `X-aws-ec2-metadata-token`, or
  gets 401.
- `meta-data/instance-id`, `meta-data/placement/availability-zone`, `meta-data/placement/region`,
  `meta-data/spot/instance-action` and `meta-data/events/recommendations/rebalance` (404 until
  a test sets them), `meta-data/iam/info`, `meta-data/iam/security-credentials/` (the role
  name) and `.../<role>` (instance-profile credentials, in the JSON EC2 serves and botocore
  reads), `dynamic/instance-identity/document`.

Point clients at it with `AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint` (botocore and
`trainctl.node.imds` both honour it). Every answered request is kept in `requests`
(method, path, status, and which session: tokens are numbered, never recorded).
"""

from __future__ import annotations

import json
import secrets
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL = 21600
CREDENTIALS_PREFIX = "/latest/meta-data/iam/security-credentials/"


def utc(moment: datetime) -> str:
    """EC2's timestamp format: 2026-03-01T12:00:00Z."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def instance_profile_credentials(hours: float = 6.0) -> dict[str, str]:
    """Fresh temporary credentials shaped like those EC2 serves for an instance profile."""
    now = datetime.now(timezone.utc)
    return {
        "Code": "Success",
        "LastUpdated": utc(now),
        "Type": "AWS-HMAC",
        "AccessKeyId": "ASIA" + _random(string.ascii_uppercase + string.digits, 16),
        "SecretAccessKey": _random(string.ascii_letters + string.digits + "+/", 40),
        "Token": _random(string.ascii_letters + string.digits + "+/", 300),
        "Expiration": utc(now + timedelta(hours=hours)),
    }


@dataclass(frozen=True)
class ImdsRequest:
    method: str
    path: str
    status: int
    session: int | None  # number of the token used (1 = the first issued), None if none valid


@dataclass
class _Session:
    number: int
    expires: float  # time.monotonic() deadline


class ImdsStandIn:
    """The metadata service of one (pretend) EC2 instance; use as a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        instance_id: str = "i-0123456789abcdef0",
        availability_zone: str = "us-east-1a",
        instance_type: str = "p3.16xlarge",
        role: str = "trainctl-node",
        account_id: str = "123456789012",
        credentials: dict[str, str] | None = None,
    ) -> None:
        if not host.startswith("127."):
            raise ValueError(f"the IMDS stand-in binds loopback (127.0.0.0/8) only, not {host}")
        self.host = host
        self.instance_id = instance_id
        self.availability_zone = availability_zone
        self.region = availability_zone[:-1]
        self.instance_type = instance_type
        self.role = role
        self.account_id = account_id
        self.credentials = credentials or instance_profile_credentials()
        self.requests: list[ImdsRequest] = []
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._tokens_issued = 0
        self._spot_action: dict[str, str] | None = None
        self._spot_action_sessions: set[int] | None = None  # None: every session sees it
        self._rebalance: dict[str, str] | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> ImdsStandIn:
        handler = type("Handler", (_Handler,), {"stand_in": self})
        self._server = ThreadingHTTPServer((self.host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="imds-stand-in",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ImdsStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.server_address[1]}"

    # -- what tests change ----------------------------------------------------------------
    def set_spot_instance_action(
        self,
        action: str = "terminate",
        when: datetime | None = None,
        *,
        only_current_sessions: bool = False,
    ) -> dict[str, str]:
        """Serve a spot interruption notice (EC2 gives two minutes: `when` defaults to that).

        With `only_current_sessions`, only tokens issued before this call see it: the
        instances running now are being reclaimed, while capacity launched afterwards (a
        relaunched node agent, with a token of its own) is a new instance without a notice.
        """
        if action not in ("terminate", "stop", "hibernate"):
            raise ValueError(f"spot instance-action is terminate, stop or hibernate: {action}")
        moment = when or datetime.now(timezone.utc) + timedelta(minutes=2)
        notice = {"action": action, "time": utc(moment)}
        with self._lock:
            self._spot_action = notice
            self._spot_action_sessions = (
                {s.number for s in self._sessions.values()} if only_current_sessions else None
            )
        return dict(notice)

    def clear_spot_instance_action(self) -> None:
        with self._lock:
            self._spot_action = None
            self._spot_action_sessions = None

    def set_rebalance_recommendation(self, when: datetime | None = None) -> dict[str, str]:
        advice = {"noticeTime": utc(when or datetime.now(timezone.utc))}
        with self._lock:
            self._rebalance = advice
        return dict(advice)

    def expire_tokens(self) -> None:
        """Invalidate every token issued so far (as a token expiring or IMDS restarting does)."""
        with self._lock:
            self._sessions.clear()

    # -- what tests read ------------------------------------------------------------------
    def requests_to(self, path: str) -> list[ImdsRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    @property
    def tokens_issued(self) -> int:
        with self._lock:
            return self._tokens_issued

    def sessions_served(self, path: str) -> set[int]:
        """Sessions that got a 200 for `path` (e.g. which agents saw the spot notice)."""
        return {
            r.session for r in self.requests_to(path) if r.status == 200 and r.session is not None
        }

    # -- serving (called from the handler threads) ----------------------------------------
    def _issue_token(self, ttl: int) -> tuple[str, int]:
        token = secrets.token_urlsafe(42)
        with self._lock:
            self._tokens_issued += 1
            self._sessions[token] = _Session(self._tokens_issued, time.monotonic() + ttl)
            return token, self._tokens_issued

    def _session(self, token: str | None) -> _Session | None:
        if not token:
            return None
        with self._lock:
            session = self._sessions.get(token)
            if session is None or time.monotonic() >= session.expires:
                self._sessions.pop(token, None)
                return None
            return session

    def _record(self, method: str, path: str, status: int, session: int | None) -> None:
        with self._lock:
            self.requests.append(ImdsRequest(method, path, status, session))

    def _metadata(self, path: str, session: int) -> tuple[int, str]:
        """(status, body) of a GET with a valid token."""
        with self._lock:
            spot = self._spot_action
            spot_sessions = self._spot_action_sessions
            rebalance = self._rebalance
        if spot is not None and spot_sessions is not None and session not in spot_sessions:
            spot = None
        document = {
            "accountId": self.account_id,
            "architecture": "x86_64",
            "availabilityZone": self.availability_zone,
            "imageId": "ami-0123456789abcdef0",
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "pendingTime": utc(datetime.now(timezone.utc)),
            "privateIp": "10.0.0.10",
            "region": self.region,
            "version": "2017-09-30",
        }
        profile_arn = f"arn:aws:iam::{self.account_id}:instance-profile/{self.role}"
        static: dict[str, Any] = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": self.instance_type,
            "/latest/meta-data/placement/availability-zone": self.availability_zone,
            "/latest/meta-data/placement/region": self.region,
            "/latest/meta-data/spot/instance-action": spot,
            "/latest/meta-data/events/recommendations/rebalance": rebalance,
            "/latest/meta-data/iam/info": {
                "Code": "Success",
                "LastUpdated": self.credentials.get("LastUpdated", ""),
                "InstanceProfileArn": profile_arn,
                "InstanceProfileId": "AIPA0123456789EXAMPLE",
            },
            CREDENTIALS_PREFIX: self.role,
            CREDENTIALS_PREFIX.rstrip("/"): self.role,
            CREDENTIALS_PREFIX + self.role: self.credentials,
            "/latest/dynamic/instance-identity/document": document,
        }
        value = static.get(path)
        if value is None:
            return 404, "Not Found"
        return 200, value if isinstance(value, str) else json.dumps(value, indent=2)


class _Handler(BaseHTTPRequestHandler):
    stand_in: ImdsStandIn
    server_version = "EC2ws"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _answer(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        stand_in = self.stand_in
        path = self.path.split("?", 1)[0]
        if path != "/latest/api/token":
            stand_in._record("PUT", path, 405, None)
            return self._answer(405, "Method Not Allowed")
        if self.headers.get("X-Forwarded-For"):
            stand_in._record("PUT", path, 403, None)
            return self._answer(403, "Forbidden")
        try:
            ttl = int(self.headers.get(TOKEN_TTL_HEADER, ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= MAX_TOKEN_TTL:
            stand_in._record("PUT", path, 400, None)
            return self._answer(400, "Bad Request")
        token, number = stand_in._issue_token(ttl)
        stand_in._record("PUT", path, 200, number)
        self._answer(200, token, {TOKEN_TTL_HEADER: str(ttl)})

    def do_GET(self) -> None:
        stand_in = self.stand_in
        path = self.path.split("?", 1)[0]
        if path == "/latest/api/token":
            stand_in._record("GET", path, 405, None)
            return self._answer(405, "Method Not Allowed")
        session = stand_in._session(self.headers.get(TOKEN_HEADER))
        if session is None:  # HttpTokens=required: no IMDSv1
            stand_in._record("GET", path, 401, None)
            return self._answer(401, "Unauthorized")
        status, body = stand_in._metadata(path, session.number)
        stand_in._record("GET", path, status, session.number)
        self._answer(status, body)


@pytest.fixture
def imds_server() -> Iterator[ImdsStandIn]:
    """A started IMDS stand-in on 127.0.0.1 (point clients at `imds_server.endpoint`)."""
    with ImdsStandIn() as server:
        yield server
