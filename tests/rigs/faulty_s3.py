"""A store that fails some requests for real: an HTTP proxy on loopback in front of a moto S3
server, answering chosen requests itself (a 404, a 503 SlowDown) and passing the rest on.

boto3 pointed at the proxy (AWS_ENDPOINT_URL) meets the failures a real S3 gives: a copy
pruned between a listing and its download, a prefix throttled for a few seconds, one
machine's requests refused. Rules are (method, key regex[, node]) -> a failure, each with a
budget: pass the first N matching requests, fail the rest; or fail every match until a
moment. A node's requests are told apart by the process behind the connection (its
trainctl tag): the nodes under test run on this machine.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}

ERRORS = {
    404: ("NoSuchKey", "The specified key does not exist."),
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}


def client_node(peer: tuple[str, int], server: tuple[str, int] | None = None) -> int | None:
    """The trainctl node (its TRAINCTL_NODE tag) of the local process at the other end of a
    connection from `peer` (to `server`): its socket's inode from /proc/net/tcp, the process
    that holds it from /proc/*/fd. None if not found (not a node's process, or gone).

    Linux reuses a local port for connections to other servers, and a closed connection that
    used the port lingers in the table in TIME_WAIT, with no inode (0): on a busy machine a
    port comes round again within that minute. Rows to another server, or without an inode,
    are passed over (taking one for the connection made a rule miss its node's request)."""
    from trainctl.procs import NODE_TAG, _environ, _pids

    ip, port = peer
    wanted = f"{socket_hex(ip)}:{port:04X}"
    remote = f"{socket_hex(server[0])}:{server[1]:04X}" if server else None
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == wanted and remote in (None, fields[2]) and fields[9] != "0":
            inode = fields[9]
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    node = _environ(pid).get(NODE_TAG)
                    return int(node) if node and node.isdigit() else None
            except OSError:
                continue
    return None


def socket_hex(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex)."""
    return "".join(f"{int(part):02X}" for part in reversed(ip.split(".")))


@dataclass
class Rule:
    """Fail requests whose method is in `methods` and whose key matches `key` (and, with
    `node`, that come from that trainctl node's processes): after the first `passes` of them,
    or (with `until`) every one before that monotonic time."""

    methods: tuple[str, ...]
    key: str  # a regex searched in the object key (bucket left out)
    status: int
    passes: int = 0
    until: float | None = None
    node: int | None = None
    seen: int = 0
    failed: int = 0

    def fails(
        self, method: str, key: str, peer: tuple[str, int], server: tuple[str, int] | None = None
    ) -> bool:
        if method not in self.methods or not re.search(self.key, key):
            return False
        if self.node is not None and client_node(peer, server) != self.node:
            return False
        if self.until is not None:
            if time.monotonic() < self.until:
                self.failed += 1
                return True
            return False
        self.seen += 1
        if self.seen > self.passes:
            self.failed += 1
            return True
        return False


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that went (a node killed mid-request) is no error of the proxy's."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FaultyS3Proxy:
    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                path = urlsplit(self.path).path
                key = unquote(path.lstrip("/").split("/", 1)[1]) if "/" in path[1:] else ""
                status = proxy.decide(
                    self.command, key, self.client_address[:2], self.server.server_address[:2]
                )
                if status is not None:
                    self._fail(status)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if self.headers.get("Transfer-Encoding"):
                    headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(*proxy.target, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _fail(self, status: int) -> None:
                code, message = ERRORS.get(status, ("Error", "injected"))
                data = (
                    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>'
                    + code.encode()
                    + b"</Code><Message>"
                    + message.encode()
                    + b"</Message></Error>"
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def decide(
        self, method: str, key: str, peer: tuple[str, int], server: tuple[str, int]
    ) -> int | None:
        with self._lock:
            for rule in self.rules:
                if rule.fails(method, key, peer, server):
                    return rule.status
        return None

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def start(self) -> FaultyS3Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@contextlib.contextmanager
def moto_s3(
    monkeypatch, *, faulty: bool = False
) -> Iterator[tuple[Any, str, FaultyS3Proxy | None]]:
    """A moto S3 server on 127.0.0.1 (behind a FaultyS3Proxy with `faulty`), the environment
    that points boto3 (and local nodes) at it, and a bucket of the test's own: (client,
    bucket, proxy)."""
    import uuid

    import boto3
    from moto.server import ThreadedMotoServer

    from tests.helpers import free_port, point_aws_at

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    proxy = FaultyS3Proxy(f"http://127.0.0.1:{port}").start() if faulty else None
    try:
        point_aws_at(monkeypatch, proxy.url if proxy else f"http://127.0.0.1:{port}")
        client = boto3.client("s3")
        # moto keeps its state per process, not per server: a bucket of its own per test.
        bucket = f"trainctl-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=bucket)
        yield client, bucket, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
