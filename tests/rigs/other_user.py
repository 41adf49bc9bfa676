"""A second account on this machine, for what another user of a shared machine can see:
made for the test with `useradd` (only as root), removed after it (`userdel`), and a scan
run as that user over every process's command line and environment and every file it can
read where users share (/tmp, /var/tmp, /dev/shm, /run, the users' homes)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers import require_part

SCAN = r"""
import json, os, subprocess, sys
wanted = [s.encode() for s in json.loads(sys.stdin.read())]  # (not in its own argv)
found = []
ps = subprocess.run(["ps", "-eo", "args"], capture_output=True).stdout
if any(s in ps for s in wanted):
    found.append("ps -eo args")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if any(s in data for s in wanted):
                found.append(f"/proc/{pid}/{part}")
read = 0
for top in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/home", "/root"):
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                import stat
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 64 * 2**20:
                    continue
                data = f.read()
            read += 1
            if any(s in data for s in wanted):
                found.append(path)
print(json.dumps({"found": found, "files_read": read}))
"""


@contextmanager
def other_user() -> Iterator[str]:
    """The name of a fresh account (no login shell, no password), removed afterwards."""
    why = None
    if os.geteuid() != 0:
        why = "only root can add the second account"
    elif not shutil.which("useradd") or not shutil.which("runuser"):
        why = "useradd and runuser (Debian's passwd, util-linux)"
    require_part("a second user account", why)
    name = f"tc-other-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield name
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)


def scan_as(user: str, wanted: list[str], python: str = "/usr/bin/python3") -> dict:
    """What `user` finds of `wanted` (ps, /proc, shared files): {"found": [...], ...}."""
    proc = subprocess.run(
        ["runuser", "-u", user, "--", python, "-c", SCAN],
        input=json.dumps(wanted), capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
