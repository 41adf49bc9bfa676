"""Detached controller: python -m trainctl.controller --store URI JOB"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainctl-controller")
    parser.add_argument("--store", required=True)
    parser.add_argument("job")
    args = parser.parse_args(argv)

    from trainctl.controller.controller import Controller
    from trainctl.controller.logs import LogPrinter
    from trainctl.store import open_store

    controller = Controller(
        open_store(args.store), args.job, printer=LogPrinter(sys.stdout, colour=False)
    )
    record = controller.run()
    return 0 if record.state.value == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
