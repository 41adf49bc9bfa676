"""Rendezvous (master) ports for nodes that share a machine's addresses: this machine's
local nodes, and SSH hosts, where the provider runs this file's source itself (see
provisioning.ssh.PREPARE): it is standard library only, with nothing of trainctl's."""

from __future__ import annotations

import os
import random
import socket
import stat
import tempfile
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Master ports are picked below Linux's default ephemeral range (32768-60999): the kernel
# hands ports from that range to every outgoing connection and bind(0) on the machine, so a
# port picked there can be taken by someone's connection in the seconds before torchrun
# binds it (EADDRINUSE, seen with many jobs and servers on one machine).
MASTER_PORT_RANGE = (20000, 32767)
# A picked port is bound seconds later by another process (torchrun, sshd, a test server):
# until then it is claimed in a directory every picker on the machine (of this user) reads,
# so two pickers cannot hand out one port in that window. A claim older than this is stale.
PORT_CLAIM_SECONDS = 120.0


def _port_claims() -> Path | None:
    """This user's port-claim directory, or None where it cannot be used safely (another
    user made it, or the temp dir is not writable): then only the bind check guards."""
    path = Path(tempfile.gettempdir()) / f"trainctl-ports-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None
    return path


def _claim(claims: Path, port: int) -> bool:
    """Claim `port` for PORT_CLAIM_SECONDS; False if another picker holds a live claim."""
    marker = claims / str(port)
    for _ in range(2):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - marker.stat().st_mtime < PORT_CLAIM_SECONDS:
                    return False
                marker.unlink()  # stale: the next round makes it ours (or another's)
            except FileNotFoundError:
                continue
        except OSError:
            return True  # claims unusable (full disk): the bind check alone guards
    return False


def _prune_claims(claims: Path) -> None:
    cutoff = time.time() - PORT_CLAIM_SECONDS
    try:
        with os.scandir(claims) as entries:
            for entry in entries:
                try:
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                except OSError:
                    continue
    except OSError:
        return


def _bindable(port: int, address: str) -> bool:
    # torchrun's store listens on every address: a port held on any one (another job's
    # node at 127.0.0.2, a server on 127.0.0.1) fails it, so the check binds them all too.
    for host in {address, "0.0.0.0"}:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port(address: str = LOOPBACK) -> int:
    """A TCP port free on `address` (and on every address) now, claimed for the next
    PORT_CLAIM_SECONDS against other pickers on this machine, outside the ephemeral range
    when one there is free (MASTER_PORT_RANGE)."""
    claims = _port_claims()
    if claims is not None:
        _prune_claims(claims)
    for _ in range(64):
        port = random.randint(*MASTER_PORT_RANGE)
        if not _bindable(port, address):
            continue
        if claims is None or _claim(claims, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
