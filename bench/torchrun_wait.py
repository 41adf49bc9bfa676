"""torchrun for a node other than the master that waits for the master's store first.

    python bench/torchrun_wait.py --nnodes 2 --node-rank 1 ... --master-addr A --master-port P ...

Diagnostic for the launch figure. A plain torchrun on node rank > 0 that reaches the static
rendezvous before the master's torchrun listens on --master-port gets its connection refused,
and c10d retries only after a backoff of ~0.3-0.6 s, which delays the whole job's first step.
This imports torch first (as the master does meanwhile), then polls the port every 10 ms and
only then runs torchrun: the same launch, without that race.
"""

import socket
import sys
import time

import torch.distributed.run as torchrun


def _arg(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


def main() -> None:
    address, port = _arg("--master-addr"), int(_arg("--master-port"))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
    torchrun.main(sys.argv[1:])


if __name__ == "__main__":
    main()
