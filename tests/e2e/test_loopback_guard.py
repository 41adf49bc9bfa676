"""The suite's own guard (conftest.loopback_only): nothing a test runs in-process reaches
past loopback, so a code path that would call AWS for real fails instead of going out."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import OffLoopbackError


@pytest.mark.timeout(10)
def test_connections_off_loopback_are_refused_before_any_packet():
    with socket.socket() as sock, pytest.raises(OffLoopbackError, match="loopback only"):
        sock.connect(("192.0.2.1", 443))  # TEST-NET-1: documentation only
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", 9)) != 0  # allowed through; refused by nobody


@pytest.mark.timeout(20)
def test_boto3_cannot_reach_aws(monkeypatch):
    import boto3
    from botocore.exceptions import EndpointConnectionError

    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client(
        "sts",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    with pytest.raises(EndpointConnectionError, match=r"amazonaws\.com"):
        client.get_caller_identity()
    with pytest.raises(socket.gaierror, match="loopback only"):
        socket.getaddrinfo("sts.amazonaws.com", 443)
    assert socket.getaddrinfo("localhost", 80)
