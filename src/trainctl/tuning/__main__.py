"""A tuning job's supervisor as a process of its own (see trainctl.tuning.loop).

python -m trainctl.tuning --store URI NAME
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainctl-tuning")
    parser.add_argument("--store", required=True)
    parser.add_argument("name")
    args = parser.parse_args(argv)

    from trainctl.store import open_store
    from trainctl.tuning.loop import supervise

    return supervise(open_store(args.store), args.name)


if __name__ == "__main__":
    sys.exit(main())
