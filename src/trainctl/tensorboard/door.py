"""TensorBoard's own app behind a door: `python -m trainctl.tensorboard.door FLAGS...`.

TensorBoard has no login, and on a machine many users share anyone there can reach a port on
loopback; a page elsewhere can reach it too through a name that resolves to 127.0.0.1 (DNS
rebinding). So trainctl serves TensorBoard's WSGI app (its `program.TensorBoard`, unchanged)
through a check in front of each request:

- the Host header must name the loopback address and port it listens on (else 421), and
- the request must carry the viewer's token: `?token=` in the address trainctl printed, which
  sets a cookie for this port (HttpOnly, SameSite=Strict) that every later request carries;
  without either, 403.

The token comes in the environment (TRAINCTL_TENSORBOARD_TOKEN), which only its user can read,
never on the command line, which every user of the machine can (`ps`).
"""

from __future__ import annotations

import hmac
import os
import sys
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

TOKEN_ENV = "TRAINCTL_TENSORBOARD_TOKEN"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def cookie_name(port: int) -> str:
    # Cookies are kept per host, not per port: one name a port, so two viewers open side by
    # side (the CLI's and the dashboard's) each keep their own.
    return f"trainctl-tensorboard-{port}"


class Door:
    """The WSGI middleware: TensorBoard's app for requests with the token, to this address."""

    def __init__(self, app: WsgiApp, token: str, host: str, port: int) -> None:
        self.app, self.token, self.port = app, token, port
        names = {*LOOPBACK_NAMES, f"[{host}]" if ":" in host else host}
        self.hosts = {f"{name}:{port}" for name in names}

    def _refuse(self, start: StartResponse, status: str, why: str) -> list[bytes]:
        body = (why + "\n").encode()
        start(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    def _cookie_token(self, environ: dict[str, Any]) -> str:
        try:
            cookies = SimpleCookie(environ.get("HTTP_COOKIE", ""))
        except CookieError:
            return ""
        morsel = cookies.get(cookie_name(self.port))
        return morsel.value if morsel is not None else ""

    def _matches(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def __call__(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        if environ.get("HTTP_HOST", "").lower() not in self.hosts:
            return self._refuse(start, "421 Misdirected Request", "not this TensorBoard's address")
        if self._matches(self._cookie_token(environ)):
            return self.app(environ, start)
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token", [""])[0]
        if not self._matches(given):
            return self._refuse(
                start, "403 Forbidden", "open the address with its token that trainctl printed"
            )

        def with_cookie(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            cookie = f"{cookie_name(self.port)}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            return start(status, [*headers, ("Set-Cookie", cookie)], *exc)

        return self.app(environ, with_cookie)


def main(argv: list[str]) -> int:
    """TensorBoard with `argv` as its flags (--logdir, --host, --port...), behind the Door."""
    from tensorboard import program

    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        sys.stderr.write(f"trainctl: {TOKEN_ENV} is not set: TensorBoard would have no door\n")
        return 2

    def server(app: WsgiApp, flags: Any) -> Any:
        return program.WerkzeugServer(Door(app, token, flags.host, flags.port), flags)

    board = program.TensorBoard(server_class=server)
    board.configure(["tensorboard", *argv])
    return int(board.main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
