"""A node's own view of the machine: the job's processes in a mount namespace where the
store, trainctl's home and every other node's folder are empty, and SageMaker's layout is at
`/opt/ml`, as in a SageMaker container, and a FastFile channel's original is read-only (as
SageMaker's FastFile mount is).

    python -m trainctl.node.sandbox VIEW_JSON -- COMMAND...

On a machine many users share (a Slurm login or compute node, a lab's server) a job's script
could otherwise open the store (every job's record, secrets and all), rewrite another job's
record, model or cached source, or read another node's files. The agent starts its launcher
through this module, which enters a new mount namespace (and, for a user other than root, a
new user namespace that maps the user to itself: the script keeps its uid), mounts an empty
tmpfs over each hidden folder, binds back what the node needs from inside them (its own
folder, its Python environment), binds the node's `opt/ml` at `/opt/ml`, and then *execs*
the command: no process stays between the agent and the launcher, so its pid, its signals
(SIGTERM for an emergency checkpoint) and its process tree are what they were without it.
Only the mounts differ; the network, `/dev` (GPUs, `/dev/shm`) and everything else are the
machine's.

Why this and not bubblewrap: bwrap keeps a monitor process as the launcher's parent, which
takes the agent's SIGTERM (and with --die-with-parent kills the script before it saves);
and unprivileged user namespaces are in every current Linux, where bwrap is one more package
a Slurm user cannot install. Where the kernel refuses (macOS, a kernel or container that
forbids user namespaces), the command runs as before and the node's log says so once.

This module is imported in a fresh interpreter before the job's command: it imports nothing
but the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the exec path imports no more than it needs: it runs at every launch)
    from collections.abc import Sequence
    from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 0x400, 0x800, 0x1000, 0x4000, 0x40000
MS_RELATIME = 0x200000
# statvfs's ST_* flags that a read-only remount must keep (a user namespace may not clear
# a flag its mount was given outside): ST_NOSUID..ST_NOEXEC, ST_NOATIME, ST_NODIRATIME are the
# MS_ values; ST_RELATIME (0x1000) is not.
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME
ST_RELATIME = 0x1000
OPT_ML = "/opt/ml"
MODULE = "trainctl.node.sandbox"
REFUSED_MARK = "[trainctl] no mount namespace"


def view(
    *, hidden: list[Path], shown: list[Path], opt_ml: Path, read_only: Sequence[Path] = ()
) -> dict[str, object]:
    """What the job's processes see differently: each of `hidden` empty (those that exist;
    one inside another counts once), each of `shown` as it is though inside a hidden one,
    `opt_ml` at /opt/ml, and each of `read_only` (FastFile channels' originals) unwritable."""
    from pathlib import Path

    real = sorted({p.resolve() for p in hidden if p.exists()}, key=lambda p: len(p.parts))
    tops: list[Path] = []
    for path in real:
        if path != Path("/") and not any(path.is_relative_to(top) for top in tops):
            tops.append(path)
    resolved = {p.resolve() for p in shown if p.exists()}
    keep = sorted(p for p in resolved if any(p.is_relative_to(top) for top in tops))
    return {
        "hidden": [str(p) for p in tops],
        "shown": [str(p) for p in keep],
        "opt_ml": str(opt_ml),
        "read_only": sorted({str(p.resolve()) for p in read_only if p.exists()}),
    }


def command(python: str, spec: dict[str, object], argv: list[str]) -> list[str]:
    """`argv` run through this module with the view `spec`."""
    return [python, "-m", MODULE, json.dumps(spec), "--", *argv]


# -- inside the fresh interpreter -------------------------------------------------------------

_libc = None


def _call(name: str, *args: object) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # (the interpreter's own libc)
    if getattr(_libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _call(
        "mount",
        None if source is None else source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enter(uid: int, gid: int) -> None:
    """A mount namespace of our own (with a user namespace that maps us to ourselves where
    we are not root), whose mounts reach no other namespace."""
    if uid == 0:
        _call("unshare", CLONE_NEWNS)
    else:
        _call("unshare", CLONE_NEWNS | CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _hide(folder: str, keep: list[str]) -> None:
    """An empty tmpfs over `folder`, then each of `keep` (inside it) bound back: opened
    before the tmpfs covers them, and bound from their descriptors."""
    held = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in keep]
    _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=1m")
    for path, fd in held:
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)


def _read_only(path: str) -> None:
    """`path` (a folder or a file) bound onto itself, then that bind made read-only: in this
    namespace only, so its owner elsewhere still writes it."""
    _mount(path, path, None, MS_BIND | MS_REC)
    flags = os.statvfs(path).f_flag
    kept = (flags & KEPT_FLAGS) | (MS_RELATIME if flags & ST_RELATIME else 0)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _show_opt_ml(source: str) -> str | None:
    """The node's layout at /opt/ml: bound over /opt/ml where the machine has one, else
    made in a tmpfs over /opt with the machine's /opt entries bound back. None, or why not."""
    if os.path.isdir(OPT_ML):
        _mount(source, OPT_ML, None, MS_BIND | MS_REC)
        return None
    if not os.path.isdir("/opt"):
        return "the machine has no /opt to put it in"
    entries = sorted(os.listdir("/opt"))
    held = [(name, os.open(f"/opt/{name}", os.O_PATH | os.O_CLOEXEC)) for name in entries]
    _mount("tmpfs", "/opt", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for name, fd in held:
        target = f"/opt/{name}"
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
    os.mkdir(OPT_ML)
    _mount(source, OPT_ML, None, MS_BIND | MS_REC)
    return None


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit(f"usage: python -m {MODULE} VIEW_JSON -- COMMAND...")
    spec, argv = json.loads(args[0]), args[2:]
    try:
        _enter(os.geteuid(), os.getegid())
    except OSError as exc:  # nothing changed: the command runs as it would without this
        also = ", and write to its FastFile channels' originals" if spec.get("read_only") else ""
        print(
            f"{REFUSED_MARK} for the job on this machine ({exc.strerror or exc}): its "
            f"processes see every file your user can see{also}",
            file=sys.stderr,
            flush=True,
        )
        os.execvp(argv[0], argv)
    try:
        shown = [str(p) for p in spec["shown"]]
        for folder in spec["hidden"]:
            _hide(folder, [p for p in shown if p == folder or p.startswith(folder + "/")])
        for path in spec.get("read_only", []):
            _read_only(str(path))
        why = _show_opt_ml(str(spec["opt_ml"]))
    except OSError as exc:  # half a view: neither the machine's nor the job's own
        sys.exit(
            f"[trainctl] the node's own view of the machine could not be made "
            f"({exc.strerror or exc}); TRAINCTL_NODE_SANDBOX=0 runs jobs without it"
        )
    if why:
        print(f"[trainctl] /opt/ml is not the node's layout: {why}", file=sys.stderr)
        os.chdir(os.getcwd())  # the working directory by its path again: through the mounts
    else:
        argv = _as_opt_ml(str(spec["opt_ml"]), argv)
    os.execvp(argv[0], argv)


def _as_opt_ml(source: str, argv: list[str]) -> list[str]:
    """The node's layout by SageMaker's paths: the working directory, the command's
    arguments and every variable that name a place in `source` (SM_MODEL_DIR, SM_CHANNEL_*,
    the code dir on PYTHONPATH...) named under /opt/ml instead. One path in every attempt,
    on every node, as in a SageMaker container: a script (Lightning's ModelCheckpoint) that
    keeps an absolute path from one attempt finds the same one in the next."""
    import re

    spellings = sorted({source, os.path.realpath(source)}, key=len, reverse=True)
    inside = re.compile("|".join(re.escape(s) for s in spellings) + r"(?=/|:|$)")

    def named(value: str) -> str:
        return inside.sub(OPT_ML, value) if any(s in value for s in spellings) else value

    for name, value in list(os.environ.items()):
        os.environ[name] = named(value)
    os.chdir(named(os.getcwd()))
    return [named(arg) for arg in argv]


if __name__ == "__main__":
    main(sys.argv[1:])
