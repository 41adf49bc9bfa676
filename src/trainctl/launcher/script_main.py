"""The entry point with its arguments read from a file, not from the command line.

    python -m trainctl.launcher.script_main ARGV_FILE ENTRY_POINT

Every user of a machine can read every process's command line (`ps -eo args`,
/proc/PID/cmdline), so a job whose hyperparameters hold a secret (`--db_password ...`,
`secret_hyperparameters`) does not put them there: the node writes the script's arguments
to ARGV_FILE (owner-only, beside hyperparameters.json), and this runs ENTRY_POINT as
`python ENTRY_POINT ARGS...` would, with `sys.argv` set from the file. The script sees the
same `sys.argv`, `__file__`, `__name__ == "__main__"` and `sys.path[0]`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python -m trainctl.launcher.script_main ARGV_FILE ENTRY_POINT")
    argv_file, entry = sys.argv[1], sys.argv[2]
    with open(argv_file, encoding="utf-8") as handle:
        args = json.load(handle)
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        sys.exit(f"{argv_file}: not a list of arguments")
    sys.argv = [entry, *args]
    # `python -m` put the working directory first; `python ENTRY` puts the script's own.
    sys.path[0] = os.path.dirname(os.path.abspath(entry))
    runpy.run_path(entry, run_name="__main__")


if __name__ == "__main__":
    main()
