"""Image registries: pulling (with an ECR login when a pull is refused), whether a registry
already holds a tag, and ECR repositories and logins. boto3 loads inside the ECR functions."""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING, Any

from trainctl.cluster import is_loopback
from trainctl.errors import one_line
from trainctl.image.engine import ImageBuildError, engine_output, last_line, run_engine

if TYPE_CHECKING:
    from trainctl.image.engine import Engine

PUSH_TIMEOUT = 1800.0


ECR_RE = re.compile(
    r"^(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?"
    r"/(?P<name>[^:@]+)$"
)


ECR_HOST_RE = re.compile(r"^[0-9]{12}\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


REPOSITORY_RE = re.compile(r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*$")


def pull_image(
    engine: Engine,
    image: str,
    *,
    tls_verify: bool | None = None,
    commands: list[list[str]] | None = None,
) -> None:
    """Pull `image`; for an ECR image a refused pull logs in to its registry and tries once
    more (ImageBuildError when it still fails). The commands run are added to `commands`."""
    verify = tls_verify if tls_verify is not None else not is_loopback(registry_host(image) or "")
    args = ["pull", *tls_args(engine, verify), image]
    ran = commands if commands is not None else []
    ran.append(engine.command(*args))
    done = run_engine(engine, args, PUSH_TIMEOUT, f"pulling {image}")
    ecr = ecr_registry(image)
    if done.returncode != 0 and ecr:
        # Not logged in to that registry, or the 12-hour token ran out. One token serves
        # every registry the caller may read, AWS's framework images (763104351884) too.
        ran.append(ecr_login(engine, ecr[1], registry=ecr[0], tls_verify=tls_verify))
        ran.append(engine.command(*args))
        done = run_engine(engine, args, PUSH_TIMEOUT, f"pulling {image}")
    if done.returncode != 0:
        reason = last_line(done.stderr or done.stdout)
        raise ImageBuildError(
            f"pulling {image} failed (exit {done.returncode}): {reason}",
            engine_output(done.stdout, done.stderr),
            reason=reason,
        )


def tls_args(engine: Engine, verify: bool) -> list[str]:
    return ["--tls-verify=false"] if engine.name == "podman" and not verify else []


def registry_host(reference: str) -> str | None:
    """The registry part of an image reference or repository, None for a bare name."""
    first, sep, _ = reference.partition("/")
    if not sep:
        return None
    if "." in first or ":" in first or first == "localhost":
        return first
    return None


def ecr_registry(reference: str) -> tuple[str, str] | None:
    """(registry host, region) when `reference` names an image or repository in ECR."""
    host = registry_host(reference) or ""
    found = ECR_HOST_RE.fullmatch(host)
    return (host, found["region"]) if found else None


def registry_has(engine: Engine, repository: str, tag: str, verify: bool) -> bool:
    """Whether the registry already holds repository:tag (False when it cannot tell: then
    the image is built and the push says what is wrong). Asked through the engine, with the
    credentials it holds for that registry (`docker login`, `podman login`): an anonymous
    request would read every registry that wants credentials as missing the tag, and the
    image would be rebuilt and pushed each time. ECR: DescribeImages."""
    ecr = ECR_RE.fullmatch(repository)
    if ecr:
        return _ecr_has_tag(ecr["name"], ecr["region"], tag)
    if engine.name == "docker":
        insecure = [] if verify else ["--insecure"]
        done = engine.run("manifest", "inspect", *insecure, f"{repository}:{tag}", timeout=60)
        return done.returncode == 0
    # podman (4.x) has no remote `manifest inspect` with --tls-verify; its tag list does.
    done = engine.run(
        "search", "--list-tags", "--limit", "100000", *tls_args(engine, verify), repository,
        timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        return False
    rows = done.stdout.decode(errors="replace").splitlines()[1:]  # NAME TAG, a row per tag
    return any(row.split()[-1:] == [tag] for row in rows)


def _ecr_client(region: str) -> Any:
    from botocore.config import Config

    from trainctl.store.boto import new_session

    return new_session(region).client("ecr", config=Config(retries={"mode": "adaptive"}))


def ensure_ecr_repository(name: str, region: str) -> str:
    """The repository's URI, creating the repository if it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = _ecr_client(region)
    try:
        try:
            found = client.describe_repositories(repositoryNames=[name])["repositories"][0]
            return str(found["repositoryUri"])
        except client.exceptions.RepositoryNotFoundException:
            pass
        created = client.create_repository(
            repositoryName=name,
            imageTagMutability="IMMUTABLE",  # a content-hash tag never names other content
            imageScanningConfiguration={"scanOnPush": True},
        )
    except (ClientError, BotoCoreError) as exc:
        raise ImageBuildError(f"ECR repository {name} in {region}: {exc}") from None
    return str(created["repository"]["repositoryUri"])


def _ecr_has_tag(name: str, region: str, tag: str) -> bool:
    client = _ecr_client(region)
    try:
        found = client.describe_images(repositoryName=name, imageIds=[{"imageTag": tag}])
    except client.exceptions.ImageNotFoundException:
        return False
    except client.exceptions.RepositoryNotFoundException:
        return False
    return bool(found.get("imageDetails"))


def ecr_login(
    engine: Engine,
    region: str,
    *,
    registry: str | None = None,
    tls_verify: bool | None = None,
) -> list[str]:
    """Log the engine in to ECR with a fresh token; the password goes through stdin only.

    `registry`: the registry host to log in to, when not the caller's own (the token is
    good for any registry the caller may read). Returns the login command that ran (it
    holds no secret)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        data = _ecr_client(region).get_authorization_token()["authorizationData"][0]
    except (ClientError, BotoCoreError) as exc:
        raise ImageBuildError(
            f"cannot get an ECR login token in {region}: {one_line(str(exc))}"
        ) from None
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    endpoint = registry or data["proxyEndpoint"].removeprefix("https://").removeprefix("http://")
    verify = tls_verify if tls_verify is not None else not is_loopback(endpoint)
    args = ["login", *tls_args(engine, verify), "--username", user, "--password-stdin", endpoint]
    done = engine.run(*args, input=password.encode(), timeout=120)
    if done.returncode != 0:
        # the engine's message, never the token
        raise ImageBuildError(
            f"{engine.name} login to {endpoint} failed (exit {done.returncode}): "
            f"{last_line(done.stderr or done.stdout).replace(password, '***')}"
        )
    return engine.command(*args)
