"""EC2 instance metadata on the node: the IMDSv2 client, botocore's instance-profile
credentials, and spot interruption notices (a notice ending a job's attempt at an emergency
checkpoint, end to end on the EC2 stand-ins, is in test_e2e_aws).

All against `tests.rigs.imds_server.ImdsStandIn`, a real IMDSv2 HTTP server on loopback (fixture
`imds_server`), and for S3 a real moto server with IAM authentication switched on.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.rigs.imds_server import ImdsStandIn, utc
from trainctl.node.imds import (
    DEFAULT_ENDPOINT,
    IPV6_ENDPOINT,
    SPOT_INSTANCE_ACTION_PATH,
    ImdsClient,
    imds_endpoint,
)

TOKEN_PATH = "/latest/api/token"
AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
)


def statuses(server: ImdsStandIn) -> list[tuple[str, str, int]]:
    return [(r.method, r.path, r.status) for r in server.requests]


# --- the client --------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_token_is_fetched_once_and_sent_with_every_get(imds_server):
    client = ImdsClient(imds_server.endpoint)
    assert client.instance_id() == "i-0123456789abcdef0"
    assert client.availability_zone() == "us-east-1a"
    assert client.region() == "us-east-1"
    assert client.last_error is None
    assert statuses(imds_server) == [
        ("PUT", TOKEN_PATH, 200),
        ("GET", "/latest/meta-data/instance-id", 200),
        ("GET", "/latest/meta-data/placement/availability-zone", 200),
        ("GET", "/latest/dynamic/instance-identity/document", 200),
    ]
    assert {r.session for r in imds_server.requests} == {1}  # one token for all of them


@pytest.mark.timeout(20)
def test_stand_in_requires_imdsv2_tokens(imds_server):
    """What the client relies on: EC2 with HttpTokens=required refuses IMDSv1 and bad PUTs."""

    def status(method: str, path: str, headers: dict[str, str]) -> int:
        request = urllib.request.Request(
            imds_server.endpoint + path, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code

    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    assert status("GET", "/latest/meta-data/instance-id", {}) == 401
    assert status("GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": "x"}) == 401
    assert status("PUT", TOKEN_PATH, {}) == 400
    assert status("PUT", TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": "21601"}) == 400
    assert status("PUT", TOKEN_PATH, {**ttl, "X-Forwarded-For": "10.0.0.1"}) == 403
    assert status("PUT", TOKEN_PATH, ttl) == 200


@pytest.mark.timeout(20)
def test_401_gets_a_new_token_and_the_request_is_retried(imds_server):
    client = ImdsClient(imds_server.endpoint)
    assert client.instance_id() == "i-0123456789abcdef0"
    imds_server.expire_tokens()  # IMDS restarted, or the token ran out early
    assert client.instance_id() == "i-0123456789abcdef0"
    assert client.last_error is None
    assert [s for _, _, s in statuses(imds_server)] == [200, 200, 401, 200, 200]
    assert imds_server.tokens_issued == 2


@pytest.mark.timeout(20)
def test_token_is_renewed_before_it_expires(imds_server):
    client = ImdsClient(imds_server.endpoint, token_ttl_seconds=1)
    assert client.instance_id() is not None
    time.sleep(1.0)  # the stand-in now refuses the first token; the client must not send it
    assert client.instance_id() is not None
    assert [(m, s) for m, _, s in statuses(imds_server)] == [
        ("PUT", 200),
        ("GET", 200),
        ("PUT", 200),
        ("GET", 200),
    ]


@pytest.mark.timeout(20)
def test_spot_instance_action_is_none_until_a_notice_then_parsed(imds_server):
    client = ImdsClient(imds_server.endpoint)
    assert client.spot_instance_action() is None
    assert client.last_error is None  # a 404 is "no notice", not a failure
    assert imds_server.requests_to(SPOT_INSTANCE_ACTION_PATH)[-1].status == 404

    notice = imds_server.set_spot_instance_action("terminate")
    assert client.spot_instance_action() == {"action": "terminate", "time": notice["time"]}
    assert notice["time"].endswith("Z")

    imds_server.set_spot_instance_action("hibernate")
    assert client.spot_instance_action()["action"] == "hibernate"
    imds_server.clear_spot_instance_action()
    assert client.spot_instance_action() is None


@pytest.mark.timeout(20)
def test_spot_notice_only_for_sessions_running_when_it_was_given(imds_server):
    """The stand-in's model of new capacity: a client that starts later sees no notice."""
    running = ImdsClient(imds_server.endpoint)
    assert running.spot_instance_action() is None
    imds_server.set_spot_instance_action("terminate", only_current_sessions=True)
    relaunched = ImdsClient(imds_server.endpoint)
    assert relaunched.spot_instance_action() is None
    assert running.spot_instance_action()["action"] == "terminate"
    assert imds_server.sessions_served(SPOT_INSTANCE_ACTION_PATH) == {1}


@pytest.mark.timeout(20)
def test_rebalance_recommendation(imds_server):
    client = ImdsClient(imds_server.endpoint)
    assert client.rebalance_recommendation() is None
    advice = imds_server.set_rebalance_recommendation()
    assert client.rebalance_recommendation() == advice


@pytest.mark.timeout(20)
def test_endpoint_comes_from_the_environment(imds_server, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds_server.endpoint + "/")
    client = ImdsClient()
    assert client.endpoint == imds_server.endpoint
    assert client.instance_id() == "i-0123456789abcdef0"

    assert imds_endpoint({}) == DEFAULT_ENDPOINT == "http://169.254.169.254"
    assert imds_endpoint({"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}) == IPV6_ENDPOINT
    both = {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.9:1",
    }
    assert imds_endpoint(both) == "http://127.0.0.9:1"  # botocore: the explicit one wins
    with pytest.raises(ValueError, match="AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        ImdsClient(env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": "169.254.169.254"})

    off = ImdsClient(env={**both, "AWS_EC2_METADATA_DISABLED": "true"})
    assert off.spot_instance_action() is None
    assert "AWS_EC2_METADATA_DISABLED" in off.last_error


@pytest.mark.timeout(20)
def test_polls_never_raise_when_the_service_is_gone_or_silent():
    with socket.socket() as closed:  # a port with nothing listening: connection refused
        closed.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}"
    client = ImdsClient(refused)
    assert client.spot_instance_action() is None
    assert "no answer from" in client.last_error
    assert client.instance_id() is None and client.rebalance_recommendation() is None

    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = ImdsClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
        started = time.monotonic()
        assert client.spot_instance_action() is None
        assert time.monotonic() - started < 2.0
        assert "no answer from" in client.last_error

    with socket.socket() as garbage:  # answers, but not in HTTP
        garbage.bind(("127.0.0.1", 0))
        garbage.listen(8)

        def babble() -> None:
            try:
                conn, _ = garbage.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

        thread = threading.Thread(target=babble, daemon=True)
        thread.start()
        client = ImdsClient(f"http://127.0.0.1:{garbage.getsockname()[1]}")
        assert client.spot_instance_action() is None
        assert "no answer from" in client.last_error
        thread.join(timeout=5)


# --- botocore: instance-profile credentials -------------------------------------------------


@pytest.fixture
def node_aws_env(imds_server, monkeypatch):
    """An EC2 node's environment: no credentials of the user's, only the instance profile."""
    for key in AWS_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("BOTO_CONFIG", "/dev/null")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds_server.endpoint)
    return imds_server


@pytest.mark.timeout(30)
def test_botocore_gets_instance_profile_credentials_from_the_stand_in(node_aws_env):
    import boto3

    credentials = boto3.Session().get_credentials()
    assert credentials is not None
    assert credentials.method == "iam-role"
    frozen = credentials.get_frozen_credentials()
    served = node_aws_env.credentials
    assert frozen.access_key == served["AccessKeyId"]
    assert frozen.secret_key == served["SecretAccessKey"]
    assert frozen.token == served["Token"]
    role_path = "/latest/meta-data/iam/security-credentials/" + node_aws_env.role
    assert [r.status for r in node_aws_env.requests_to(role_path)] == [200]
    assert all(r.status != 401 for r in node_aws_env.requests)  # botocore used IMDSv2


@pytest.fixture
def moto_with_auth(monkeypatch):
    """A moto server on 127.0.0.1 that checks signatures and IAM policies (off by default)."""
    from moto import settings as moto_settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"

    def enable_auth() -> None:
        # moto keeps this switch per process (the threaded server shares it): restored after.
        monkeypatch.setattr(moto_settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)

    try:
        yield endpoint, enable_auth
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_s3_store_reached_with_instance_profile_credentials_only(
    node_aws_env, moto_with_auth, monkeypatch
):
    """How a node reaches the store: the role's temporary credentials, served by IMDS."""
    import boto3

    from trainctl.errors import StoreError
    from trainctl.store import open_store

    endpoint, enable_auth = moto_with_auth
    admin = {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
        "endpoint_url": endpoint,
    }
    suffix = uuid.uuid4().hex[:10]
    bucket, role_name = f"trainctl-imds-{suffix}", f"trainctl-node-{suffix}"
    boto3.client("s3", **admin).create_bucket(Bucket=bucket)
    iam = boto3.client("iam", **admin)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "ec2.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))
    iam.put_role_policy(
        RoleName=role_name,
        PolicyName="store",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": "s3:*",
                        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                    }
                ],
            }
        ),
    )
    # What EC2 does for an instance profile: assume the role, serve the result on IMDS.
    assumed = boto3.client("sts", **admin).assume_role(
        RoleArn=role["Role"]["Arn"], RoleSessionName="i-0123456789abcdef0"
    )["Credentials"]
    imds = node_aws_env
    imds.role = role_name
    imds.credentials = {
        **imds.credentials,
        "AccessKeyId": assumed["AccessKeyId"],
        "SecretAccessKey": assumed["SecretAccessKey"],
        "Token": assumed["SessionToken"],
        "Expiration": utc(assumed["Expiration"]),
    }
    enable_auth()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = open_store(f"s3://{bucket}/store")
    store.put_text("jobs/probe.txt", "from the node")
    assert store.get_text("jobs/probe.txt") == "from the node"
    role_path = "/latest/meta-data/iam/security-credentials/" + role_name
    assert imds.requests_to(role_path), "the store did not take its credentials from IMDS"

    # The same request signed with another secret is refused: the served keys are the ones used.
    imds.credentials = {**imds.credentials, "SecretAccessKey": "x" * 40}
    with pytest.raises(StoreError, match=r"SignatureDoesNotMatch|403"):
        open_store(f"s3://{bucket}/store").put_text("jobs/other.txt", "refused")
