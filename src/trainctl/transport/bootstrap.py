"""Make a remote host's python run `python -m trainctl.node.agent` of THIS trainctl.

The agent's version is `trainctl.toolkit.agent_version()`: `__version__` plus a content
hash of the package's files, so a development edit counts as another version. If the host's
own trainctl reports another version (or none), a reproducible tar of the local package (pure
python) is uploaded over SFTP to `~/.trainctl/agent/<version>/` and the agent runs with
PYTHONPATH there; missing dependencies are installed with `pip install --target <that
dir>/deps`. A later job on the same host finds the directory and uploads nothing.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainctl.toolkit import AGENT_DEPENDENCIES, S3_DEPENDENCIES, agent_version, package_tarball

if TYPE_CHECKING:
    from trainctl.transport.ssh import SshConnection

MIN_PYTHON = (3, 10)
AGENT_ROOT = ".trainctl/agent"  # under the remote home
PIP_TIMEOUT = 900.0


@dataclass(frozen=True)
class AgentRuntime:
    """How the agent runs on a host: with PYTHONPATH (uploaded copy) or the host's own."""

    version: str
    pythonpath: str | None = None
    uploaded: bool = False  # this call uploaded the package
    installed: list[str] = field(default_factory=list)  # requirements pip installed now

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": self.pythonpath} if self.pythonpath else {}


# Reports which trainctl (and which dependencies) the host's python imports. Old pythons
# must be able to run it to say they are too old.
PROBE = r"""
import importlib.util, json, sys
sys.path = [p for p in sys.path if p not in ("", ".")]  # not what the login dir holds
out = {"python": "%d.%d.%d" % sys.version_info[:3], "version": None, "error": None}
try:
    from trainctl.toolkit import agent_version
    out["version"] = agent_version()
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
out["missing"] = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
print("trainctl-probe " + json.dumps(out))
"""

# Unpacks an uploaded tarball into its version dir, once per host: under a lock, into a
# temp dir renamed into place, so concurrent jobs and interrupted uploads are harmless.
INSTALL = r"""
import fcntl, os, shutil, sys, tarfile, tempfile
target, tarball = sys.argv[1], sys.argv[2]
parent = os.path.dirname(target)
os.makedirs(parent, exist_ok=True)
with open(os.path.join(parent, ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(os.path.join(target, ".complete")):
        if os.path.isdir(target):
            shutil.rmtree(target)
        tmp = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                name = os.path.normpath(member.name)
                if name.startswith(("/", "..")) or not (member.isfile() or member.isdir()):
                    raise SystemExit("unsafe tar member %r" % member.name)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        open(os.path.join(tmp, ".complete"), "w").close()
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
os.unlink(tarball)
print("trainctl-install ok")
"""

# Runs a command while holding the agent dir's lock (argv: LOCKFILE COMMAND...).
LOCKED = r"""
import fcntl, subprocess, sys
with open(sys.argv[1], "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    sys.exit(subprocess.call(sys.argv[2:]))
"""


@dataclass(frozen=True)
class _Probe:
    python: str
    version: str | None
    error: str | None
    missing: list[str]


def _probe(conn: SshConnection, modules: list[str], pythonpath: str | None) -> _Probe:
    env = {"PYTHONPATH": pythonpath} if pythonpath else None
    text = conn.check_python(
        PROBE,
        *modules,
        env=env,
        what="check its trainctl version",
        marker="trainctl-probe",
        timeout=120,
    )
    data = json.loads(text)
    return _Probe(data["python"], data["version"], data["error"], list(data["missing"]))


def ensure_agent(
    conn: SshConnection, *, s3: bool = False, extra: dict[str, str] | None = None
) -> AgentRuntime:
    """Make the host run this trainctl's agent; how to run it (PYTHONPATH) is returned.

    `s3`: the job uses an s3:// store or URI, so the agent needs boto3 too. `extra`: more
    (import name -> pip requirement) that the host must import (a controller's client
    packages).
    """
    from trainctl.transport.ssh import RemoteCommandError

    requirements = {**AGENT_DEPENDENCIES, **(S3_DEPENDENCIES if s3 else {}), **(extra or {})}
    modules = sorted(requirements)
    local = agent_version()
    probe = _probe(conn, modules, None)
    major_minor = tuple(int(x) for x in probe.python.split(".")[:2])
    if major_minor < MIN_PYTHON:
        raise RemoteCommandError(
            f"{conn.label}: {conn.host.python!r} is Python {probe.python}; the trainctl agent "
            f"needs Python >= {'.'.join(map(str, MIN_PYTHON))} (set the host's python)"
        )
    if probe.version == local and not probe.missing:
        return AgentRuntime(local)

    target = f"{conn.home}/{AGENT_ROOT}/{local}"
    deps = f"{target}/deps"
    pythonpath = f"{target}:{deps}"
    uploaded = False
    cached = _probe(conn, modules, pythonpath)
    if cached.version != local:
        _upload(conn, target)
        uploaded = True
        cached = _probe(conn, modules, pythonpath)
        if cached.version != local:
            raise RemoteCommandError(
                f"{conn.label}: the uploaded agent reports version {cached.version} "
                f"({cached.error or 'no error'}), expected {local}"
            )
    installed: list[str] = []
    if cached.missing:
        installed = [requirements[m] for m in cached.missing]
        _pip_install(conn, target, deps, installed)
        after = _probe(conn, modules, pythonpath)
        if after.missing:
            raise RemoteCommandError(
                f"{conn.label}: {', '.join(after.missing)} still cannot be imported after "
                f"pip install --target {deps}"
            )
    return AgentRuntime(local, pythonpath, uploaded, installed)


def _upload(conn: SshConnection, target: str) -> None:
    from trainctl.transport.ssh import RemoteCommandError

    parent = target.rsplit("/", 1)[0]
    conn.makedirs(parent)
    tarball = f"{parent}/.upload-{secrets.token_hex(6)}.tar.gz"
    conn.put_bytes(package_tarball(), tarball)
    result = conn.python(INSTALL, target, tarball, timeout=300)
    if "trainctl-install ok" not in result.stdout:
        raise RemoteCommandError(
            f"{conn.label}: unpacking the trainctl agent into {target} failed: {result.tail()}"
        )


def _pip_install(conn: SshConnection, target: str, deps: str, requirements: list[str]) -> None:
    from trainctl.transport.ssh import RemoteCommandError

    lock = f"{target.rsplit('/', 1)[0]}/.lock"
    command = [
        conn.host.python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--target",
        deps,
        *requirements,
    ]
    result = conn.python(LOCKED, lock, *command, timeout=PIP_TIMEOUT)
    if result.code != 0:
        raise RemoteCommandError(
            f"{conn.label}: installing the agent's dependencies ({', '.join(requirements)}) "
            f"with {conn.host.python} -m pip failed: {result.tail()}"
        )
