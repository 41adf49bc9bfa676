"""`pip ARGS` in this interpreter, with progress through its install step (`make venv`).

pip prints a line a package while it collects and downloads, then one line naming every
package it is about to install, then nothing until it is done: with ~180 packages, two
minutes of silence on a busy machine. This passes pip's output through and, during that
step, says every few seconds how many of the packages are in place (their .dist-info
folders appearing in site-packages).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

EVERY_SECONDS = 5.0
INSTALLING = "Installing collected packages:"


def installed(site: Path) -> set[str]:
    return {p.name for p in site.glob("*.dist-info")}


def watch(site: Path, total: int, done: threading.Event) -> None:
    before = installed(site)
    began = time.monotonic()
    while not done.wait(EVERY_SECONDS):
        count = min(total, len(installed(site) - before))
        print(
            f"  ... {count} of {total} packages in place ({time.monotonic() - began:.0f} s)",
            flush=True,
        )


def main(args: list[str]) -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pip", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    done = threading.Event()
    watcher = None
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith(INSTALLING) and watcher is None:
            total = len(line[len(INSTALLING) :].split(","))
            watcher = threading.Thread(target=watch, args=(site, total, done), daemon=True)
            watcher.start()
    code = proc.wait()
    done.set()
    if watcher is not None:
        watcher.join()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
