"""`torchrun` whose non-master nodes wait until the master's rendezvous store listens.

    python -m trainctl.launcher.torchrun_main <torchrun arguments>

With a static rendezvous, a node other than the master that reaches the master's store
before it listens gets its connection refused, and c10d retries only after a backoff of
~0.3-0.6 s: the whole job's first step waits for it (bench/launch.py measured it as the
bimodal part of launch time). This imports torch first, as the master does meanwhile, then
polls the port every 10 ms, and only then hands the same arguments to torchrun. After
`WAIT_SECONDS` it gives up polling and lets torchrun report the failure its own way.
"""

from __future__ import annotations

import socket
import sys
import time

WAIT_SECONDS = 900.0


def _arg(argv: list[str], name: str, default: str) -> str:
    for index, value in enumerate(argv):
        if value == name and index + 1 < len(argv):
            return argv[index + 1]
        if value.startswith(name + "="):
            return value.split("=", 1)[1]
    return default


def wait_for_master(address: str, port: int, timeout: float = WAIT_SECONDS) -> bool:
    """True once `address:port` accepts a connection; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    import torch.distributed.run as torchrun  # the slow part, overlapped with the master's

    if _arg(args, "--node-rank", "0") != "0":
        address = _arg(args, "--master-addr", "127.0.0.1")
        wait_for_master(address, int(_arg(args, "--master-port", "29500")))
    torchrun.main(args)


if __name__ == "__main__":
    main()
