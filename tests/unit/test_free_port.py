"""Master ports (trainctl.provisioning.ports.free_port): a port another picker on this machine
handed out moments ago, or one held on any address, is never handed out again (EADDRINUSE in
a loaded suite run: two jobs got one port in the seconds before torchrun bound it)."""

from __future__ import annotations

import os
import socket
import time

import pytest

from trainctl.provisioning import ports
from trainctl.provisioning.ports import MASTER_PORT_RANGE, free_port


@pytest.fixture
def claims(tmp_path, monkeypatch):
    """A claim directory of this test's own (the machine's is shared with other runs)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path / f"trainctl-ports-{os.getuid()}"


def test_ports_handed_out_are_claimed_and_never_handed_out_twice(claims):
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(MASTER_PORT_RANGE[0] <= p <= MASTER_PORT_RANGE[1] for p in ports)
    assert {int(p.name) for p in claims.iterdir()} == set(ports)
    assert (claims.stat().st_mode & 0o777) == 0o700


def test_a_live_claim_is_skipped_and_a_stale_one_is_taken_back(claims, monkeypatch):
    monkeypatch.setattr(ports, "MASTER_PORT_RANGE", (24000, 24001))
    claims.mkdir(mode=0o700)
    (claims / "24000").touch()
    assert free_port() == 24001
    stale = time.time() - ports.PORT_CLAIM_SECONDS - 5
    os.utime(claims / "24000", (stale, stale))
    os.utime(claims / "24001", (stale, stale))
    assert free_port() in (24000, 24001)
    # stale claims are swept: the directory holds only what is claimed now
    assert len(list(claims.iterdir())) == 1


def test_a_port_held_on_another_address_is_not_free(claims, monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.2", 0))
    port = held.getsockname()[1]
    try:
        monkeypatch.setattr(ports, "MASTER_PORT_RANGE", (port, port))
        # the only port in range is held on 127.0.0.2: the pick falls back to the kernel's
        assert free_port("127.0.0.1") != port
    finally:
        held.close()


def test_a_claim_directory_of_another_owner_is_not_used(claims, monkeypatch):
    claims.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.geteuid() + 1)
    moved = claims.parent / f"trainctl-ports-{os.geteuid() + 1}"
    claims.rename(moved)
    # a directory another user owns (as the name now says) is not trusted with claims
    assert MASTER_PORT_RANGE[0] <= free_port() <= MASTER_PORT_RANGE[1]
    assert not any(moved.iterdir())
