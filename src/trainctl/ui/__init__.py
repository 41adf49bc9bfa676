"""`trainctl ui`: the read-only web dashboard over a store (see trainctl.ui.app)."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError, StoreError, TrainctlError

DEFAULT_PORT = 8377
# The dashboard's token from the environment: only its own user reads a process's
# environment, where every user reads its command line.
TOKEN_VARIABLE = "TRAINCTL_UI_TOKEN"


MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_bind(host: str, port: int, token: str | None) -> str | None:
    """The token the server needs: None on loopback without one; a given or new one for
    any other address (the dashboard shows everything the store holds)."""
    if not 1 <= port <= 65535:
        raise SpecError("--port", f"{port} is not a port (1-65535)")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise SpecError(
            "--token",
            f"must be at least {MIN_TOKEN_CHARS} characters (got {len(token)}); leave it out "
            "to have one made",
        )
    if token is not None and not token.isprintable():
        raise SpecError("--token", "must be printable characters")
    if not is_loopback(host) and token is None:
        return secrets.token_urlsafe(24)
    return token


def read_token_file(path: Path) -> str:
    """The token in `path`, a file of the user's alone (another user who can read it can
    read the whole store through the dashboard)."""
    import stat

    from trainctl.store.safefs import RefusedPathError, open_own

    try:
        fd = open_own(path)
    except RefusedPathError:
        raise SpecError("--token-file", f"{path} is not a regular file") from None
    except OSError as exc:
        raise SpecError("--token-file", f"{path}: cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if st.st_mode & 0o077:
            raise SpecError(
                "--token-file",
                f"{path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"`chmod 600 {path}`",
            )
        raw = handle.read(4096)
    try:
        return raw.decode().strip()
    except UnicodeDecodeError:
        raise SpecError("--token-file", f"{path} is not text") from None


def allowed_hosts(host: str) -> list[str]:
    """Host headers a token-less loopback dashboard answers: its own names only. A web page
    elsewhere that rebinds its DNS name to 127.0.0.1 sends its own name, and is refused."""
    names = {"localhost", "127.0.0.1", "::1", "[::1]", host}
    return sorted(names | {f"[{host}]"} if ":" in host else names)


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise SpecError(
                "--port",
                f"{host}:{port} is in use or not available ({exc.strerror}); "
                "pick another with --port",
            ) from None


def serve(store: Any, *, host: str, port: int, token: str | None, ready: Any = None) -> None:
    """Serve the dashboard until interrupted. `ready(url)` is called once it listens."""
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise TrainctlError(
            "the dashboard needs starlette and uvicorn: pip install 'trainctl[ui]'"
        ) from None

    from trainctl.ui.app import make_app

    try:
        store.probe()  # an unreachable store is one line now, not a 500 later
    except (OSError, StoreError) as exc:
        raise TrainctlError(f"cannot read the store {store.uri}: {exc}") from None
    check_port_free(host, port)
    hosts = None if token is not None else allowed_hosts(host)
    config = uvicorn.Config(
        make_app(store, token=token, hosts=hosts),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    if ready is not None:
        import threading

        def announce() -> None:
            import time

            while not server.started and not server.should_exit:
                time.sleep(0.05)
            if server.started:
                shown = f"[{host}]" if ":" in host else host
                ready(f"http://{shown}:{port}/" + (f"?token={token}" if token else ""))

        threading.Thread(target=announce, daemon=True).start()
    server.run()
