"""Which network interface a node reaches an address through, from the kernel's routing
table (/proc/net/route), as `ip route get` would say, without needing iproute2 on the node.
NCCL and gloo are pinned to it (trainctl.launcher.nccl)."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

ROUTE_TABLE = Path("/proc/net/route")
RTF_UP = 0x1


def route_interface(address: str, table: Path = ROUTE_TABLE) -> str | None:
    """The interface of the most specific route to `address` (a name is resolved first);
    "lo" for a loopback address; None when the table or the name cannot tell."""
    try:
        ip = ipaddress.IPv4Address(socket.gethostbyname(address))
    except (OSError, ValueError):
        return None
    if ip.is_loopback:
        return "lo"
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return None
    best: tuple[int, int, str] | None = None  # (prefix length, -metric, interface)
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            destination, flags, metric, mask = (
                _le_ip(fields[1]),
                int(fields[3], 16),
                int(fields[6]),
                _le_ip(fields[7]),
            )
        except ValueError:
            continue
        if not flags & RTF_UP or int(ip) & mask != destination:
            continue
        candidate = (bin(mask).count("1"), -metric, fields[0])
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return best[2] if best else None


def _le_ip(text: str) -> int:
    """An address of /proc/net/route (hex, in the host's little-endian order) as an int."""
    return int.from_bytes(int(text, 16).to_bytes(4, "little"), "big")
