"""SSH connections through fabric: one `Connection` per host, with trainctl's host-key pinning.

- `SshConnector(host).connect(timeout)` retries until the host accepts (a booting instance
  refuses connections for a while) and checks its host key: the one given in the host's
  config, else the one pinned in `$TRAINCTL_HOME/known_hosts` on first use (`hostkeys`). A
  changed key is refused, never silently accepted.
- fabric does the rest: `~/.ssh/config` is honoured (HostName, User, IdentityFile,
  ProxyJump), a host is reached through a jump host (`proxy_jump` on the host, the
  `ssh_proxy_jump` setting, or the config's ProxyJump; every hop pinned like the host), and
  files go through fabric's `put` and SFTP. Commands run on a session of fabric's
  connection (see `SshConnection.run` for why not through fabric's `run`).

Remote commands are built with shlex. fabric and paramiko are imported lazily: `trainctl
--help` never loads them.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import getpass
import io
import logging
import math
import os
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.spec.capacity import parse_ssh_target
from trainctl.transport.ssh.errors import (
    RemoteCommandError,
    SshAuthError,
    SshHostKeyError,
    SshUnreachable,
)
from trainctl.transport.ssh.hostkeys import (
    PinOnFirstUse,
    key_changed_message,
    known_hosts_name,
    known_hosts_path,
    pinned_from_config,
    read_known_keys,
)

if TYPE_CHECKING:
    import fabric
    import paramiko

    from trainctl.spec.capacity import SshHost

log = logging.getLogger("trainctl.ssh")

DEFAULT_ATTEMPT_TIMEOUT = 10.0  # one TCP connect + SSH handshake + authentication
IO_TIMEOUT = 20.0  # a remote read or command that hangs this long means the link is down
READ_CHUNK = 256 * 1024


def default_user() -> str:
    return getpass.getuser()


def host_label(host: SshHost) -> str:
    """user@address:port, as errors and logs name a host."""
    return f"{host.user or default_user()}@{host.address}:{host.port}"


def _quiet_paramiko() -> None:
    # paramiko logs every refused or dropped connection at ERROR; without a handler Python
    # prints those to stderr. Retries and reconnects are expected here: our errors say it.
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def describe(exc: BaseException) -> str:
    """A short reason: 'Connection refused', 'timed out', 'Name or service not known'..."""
    per_address = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError
    if isinstance(per_address, dict) and per_address:
        exc = next(iter(per_address.values()))
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, TimeoutError) or text == "timed out":
        return "timed out"
    return text.splitlines()[0][:300]


@dataclass(frozen=True)
class RemoteResult:
    code: int
    stdout: str
    stderr: str

    def tail(self, lines: int = 5) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:])[:600]


class SshConnection:
    """One authenticated SSH connection to a host (a fabric Connection): run commands, read
    and write files."""

    def __init__(self, host: SshHost, connection: fabric.Connection, label: str) -> None:
        self.host = host
        self.label = label
        self.fabric = connection
        self._home: str | None = None
        self._sftp_timeout_set = False

    @property
    def client(self) -> paramiko.SSHClient:
        return self.fabric.client

    @property
    def active(self) -> bool:
        transport = self.fabric.transport
        return transport is not None and transport.is_active()

    def run(
        self,
        argv: list[str] | str,
        *,
        input: bytes | None = None,
        timeout: float = 120.0,
    ) -> RemoteResult:
        """Run a command (argv is quoted with shlex) and collect its output and exit code.

        `input` goes to the command's stdin, which is closed after it (at once without it).
        Not fabric's `run`: invoke pumps a non-terminal stdin one byte per 10 ms (a 2 KB
        request took 14 s), and waits for the end of output that a daemon the command
        started may hold open; this session comes from fabric's connection all the same.
        Raises OSError/EOFError/paramiko.SSHException when the connection fails.
        """
        command = argv if isinstance(argv, str) else shlex.join(argv)
        if not self.active:
            raise EOFError("connection closed")
        channel = self.fabric.create_session()
        try:
            channel.settimeout(IO_TIMEOUT)
            channel.exec_command(command)
            if input:
                channel.sendall(input)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            exited_at: float | None = None
            while True:
                busy = False
                if channel.recv_ready():
                    out += channel.recv(READ_CHUNK)
                    busy = True
                if channel.recv_stderr_ready():
                    err += channel.recv_stderr(READ_CHUNK)
                    busy = True
                if busy:
                    continue
                if channel.closed or (channel.exit_status_ready() and channel.eof_received):
                    break
                now = time.monotonic()
                if channel.exit_status_ready():
                    # Exited, but something it started still holds the output open: what
                    # the command itself wrote has arrived by now.
                    exited_at = exited_at or now
                    if now - exited_at > 1.0:
                        break
                    time.sleep(0.01)
                    continue
                if now > deadline:
                    raise TimeoutError(f"command on {self.label} still running after {timeout} s")
                channel.status_event.wait(0.02)
            code = channel.recv_exit_status() if channel.exit_status_ready() else -1
        finally:
            channel.close()
        return RemoteResult(
            code, out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
        )

    def python(
        self,
        script: str,
        *args: str,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> RemoteResult:
        """Run a Python snippet with the host's interpreter (`env` must hold no secret)."""
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        return self.run(
            [*prefix, self.host.python, "-c", script, *args], input=input, timeout=timeout
        )

    def check_python(self, script: str, *args: str, what: str, marker: str, **kwargs: Any) -> str:
        """Run a snippet that prints `marker` + payload; the payload, or RemoteCommandError."""
        result = self.python(script, *args, **kwargs)
        for line in result.stdout.splitlines():
            if line.startswith(marker + " "):
                if result.code == 0:
                    return line[len(marker) + 1 :]
        if result.code == 127 or ("not found" in result.stderr and result.code != 0):
            raise RemoteCommandError(
                f"{self.label}: cannot run python {self.host.python!r} to {what}: "
                f"{result.tail()}; set the host's python to an interpreter that exists there"
            )
        raise RemoteCommandError(
            f"{self.label}: {what} failed (exit code {result.code}): {result.tail()}"
        )

    def sftp(self) -> paramiko.SFTPClient:
        """fabric's SFTP session of this connection (opened once), with our I/O timeout."""
        sftp = self.fabric.sftp()
        if not self._sftp_timeout_set:
            sftp.get_channel().settimeout(IO_TIMEOUT)  # type: ignore[union-attr]
            self._sftp_timeout_set = True
        return sftp

    @property
    def home(self) -> str:
        """The remote user's home directory ($HOME, as the host's python expands `~`)."""
        if self._home is None:
            self._home = self.check_python(
                "import os; print('trainctl-home ' + os.path.expanduser('~'))",
                what="find the home directory",
                marker="trainctl-home",
                timeout=60,
            )
        return self._home

    def makedirs(self, path: str) -> None:
        sftp = self.sftp()
        parts = [p for p in path.split("/") if p]
        current = "" if path.startswith("/") else "."
        for part in parts:
            current = f"{current}/{part}"
            try:
                sftp.stat(current)
            except FileNotFoundError:
                with contextlib.suppress(OSError):  # made meanwhile by another process
                    sftp.mkdir(current)

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        self.sftp()  # with its timeout set
        self.fabric.put(io.BytesIO(data), remote=path, preserve_mode=False)
        self.sftp().chmod(path, mode)

    def close(self) -> None:
        _close_chain(self.fabric)


def connection_errors() -> tuple[type[BaseException], ...]:
    import paramiko

    return (OSError, EOFError, paramiko.SSHException)


def is_remote_file_error(exc: BaseException) -> bool:
    """An SFTP status (no such file, permission denied), not a broken connection."""
    return isinstance(exc, (FileNotFoundError, PermissionError)) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM)
    )


class SshConnector:
    """How to reach one host: makes (and re-makes) authenticated, host-key-checked fabric
    connections, through the host's jump hosts when it has any."""

    def __init__(
        self,
        host: SshHost,
        *,
        known_hosts: Path | None = None,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
    ) -> None:
        self.host = host
        self.known_hosts = known_hosts or known_hosts_path()
        self.attempt_timeout = attempt_timeout
        self._ssh_config: dict[str, Any] | None = None
        self._hop_names: dict[str, str] = {}  # a jump host's address -> its known_hosts name
        self._target_name = known_hosts_name(host.address, host.port)
        self.user = host.user or self.ssh_config.get("user") or default_user()
        # 22 is also the field's default: a Port that ~/.ssh/config gives the name applies.
        self.port = host.port if host.port != 22 else int(self.ssh_config.get("port", 22))
        self.label = f"{self.user}@{host.address}:{self.port}"
        self.proxy_jump = self._proxy_jump()

    @property
    def ssh_config(self) -> dict[str, Any]:
        """What `~/.ssh/config` (and /etc/ssh/ssh_config) say about this host."""
        if self._ssh_config is None:
            self._ssh_config = dict(_ssh_files().lookup(self.host.address))
        return self._ssh_config

    def _proxy_jump(self) -> str | None:
        """The host's own proxy_jump, else the `ssh_proxy_jump` setting, else the config's
        ProxyJump; None (or OpenSSH's 'none') for a direct connection."""
        from trainctl.spec.settings import get_settings

        jump = self.host.proxy_jump or get_settings().ssh_proxy_jump
        jump = jump or self.ssh_config.get("proxyjump")
        return None if jump is None or jump.strip().lower() == "none" else jump.strip()

    def key_file(self) -> str | None:
        if self.host.key_file is None:
            return None
        path = Path(self.host.key_file).expanduser()
        if not path.is_file():
            raise SshAuthError(f"{self.label}: key_file {self.host.key_file} not found")
        if not os.access(path, os.R_OK):
            raise SshAuthError(f"{self.label}: key_file {self.host.key_file} is not readable")
        return str(path)

    def connect(self, timeout: float = 0.0, *, retry_auth: bool = False) -> SshConnection:
        """Connect, retrying refused or failed attempts for up to `timeout` seconds.

        A host key mismatch is never retried. An authentication failure is retried only with
        `retry_auth` (a booting cloud instance installs its key after sshd starts).
        """
        import paramiko
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_before_delay,
            wait_exponential,
        )

        _quiet_paramiko()
        key_file = self.key_file()
        deadline = time.monotonic() + timeout

        def once() -> SshConnection:
            try:
                return self._connect_once(key_file, deadline)
            except paramiko.AuthenticationException as exc:
                raise SshAuthError(self._auth_message(exc)) from None

        def worth_retrying(exc: BaseException) -> bool:
            if isinstance(exc, SshAuthError):
                return retry_auth
            if isinstance(exc, SshHostKeyError):
                return False
            return isinstance(exc, (OSError, EOFError, paramiko.SSHException))

        retrying = Retrying(
            stop=stop_before_delay(timeout),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception(worth_retrying),
            reraise=True,
        )
        try:
            return retrying(once)
        except SshHostKeyError:
            raise
        except (SshAuthError, OSError, EOFError, paramiko.SSHException) as last:
            attempts = retrying.statistics.get("attempt_number", 1)
            waited = f" (tried {attempts} times in {timeout:g} s)" if timeout > 0 else ""
            if isinstance(last, SshAuthError):
                raise SshAuthError(f"{last}{waited}" if retry_auth else str(last)) from None
            via = f" through {self.proxy_jump}" if self.proxy_jump else ""
            raise SshUnreachable(
                f"{self.label}: cannot connect{via}: {describe(last)}{waited}"
            ) from None

    def _auth_message(self, exc: BaseException) -> str:
        import paramiko

        if isinstance(exc, paramiko.PasswordRequiredException):
            return (
                f"{self.label}: key_file {self.host.key_file} is encrypted; use a key without "
                "a passphrase or load it into ssh-agent"
            )
        how = f"key_file {self.host.key_file}" if self.host.key_file else "your default keys"
        return f"{self.label}: authentication as {self.user!r} with {how} failed"

    def _connect_once(self, key_file: str | None, deadline: float) -> SshConnection:
        import paramiko

        host = self.host
        wait = max(1.0, min(self.attempt_timeout, deadline - time.monotonic()))
        pinned = pinned_from_config(self.label, host.host_key) if host.host_key else None
        gateway: Any = False  # never fabric's own (unpinned) ProxyJump chain
        if self.proxy_jump:
            gateway = self._jump_chain(self.proxy_jump, key_file, wait)
        elif "proxycommand" in self.ssh_config:
            gateway = str(self.ssh_config["proxycommand"])
        connection = self._connection(
            host.address, self.port, host.user, key_file, wait, gateway, pinned=pinned
        )
        self._target_name = known_hosts_name(connection.host, connection.port)  # HostName
        try:
            connection.open()
        except paramiko.BadHostKeyException as exc:
            _close_chain(connection)
            raise SshHostKeyError(self._key_changed(exc, pinned)) from None
        except BaseException:
            _close_chain(connection)
            raise
        if connection.transport is not None:
            connection.transport.set_keepalive(5)
        return SshConnection(host, connection, self.label)

    def _key_changed(self, exc: Any, pinned: dict[str, str] | None) -> str:
        """The refusal of a key that is not the pinned one: the host's, or a jump host's."""
        offered = (exc.key.get_name(), exc.key.get_base64())
        # paramiko names the host as it connected to it: its address, without the port
        name = self._hop_names.get(exc.hostname)
        is_target = name is None
        if is_target and pinned is not None:
            return key_changed_message(self.label, pinned, *offered, "hosts[].host_key")
        name = name or self._target_name
        expected = read_known_keys(self.known_hosts, name)
        label = self.label if is_target else f"{self.label}: jump host {exc.hostname}"
        return key_changed_message(label, expected, *offered, self.known_hosts)

    def _jump_chain(self, proxy_jump: str, key_file: str | None, wait: float) -> Any:
        """fabric Connections for 'user@bastion:22[,user@next...]', each hop through the one
        before it and each with its host key pinned (fabric's own chain would accept any)."""
        previous: Any = False
        self._hop_names = {}
        for hop in proxy_jump.split(","):
            hop_target = parse_ssh_target(hop)  # (validated with the spec: check_proxy_jump)
            previous = self._connection(
                hop_target.address,
                hop_target.port or 22,
                hop_target.user,
                key_file,
                wait,
                previous,
                pinned=None,
            )
            self._hop_names[previous.host] = known_hosts_name(previous.host, previous.port)
        return previous

    def _connection(
        self,
        address: str,
        port: int,
        user: str | None,
        key_file: str | None,
        wait: float,
        gateway: Any,
        *,
        pinned: dict[str, str] | None,
    ) -> fabric.Connection:
        """A fabric Connection (not yet open) whose host key is checked as trainctl pins them:
        `pinned` from the host's config (anything else refused), else known_hosts with
        pinning on first use."""
        import fabric
        import paramiko

        auth: dict[str, Any] = (
            {"key_filename": [key_file], "look_for_keys": False, "allow_agent": False}
            if key_file
            else {"look_for_keys": True, "allow_agent": True}
        )
        connection = fabric.Connection(
            address,
            user=user,
            port=port,
            config=_fabric_config(),
            gateway=gateway,
            connect_timeout=max(1, math.ceil(wait)),
            connect_kwargs={
                **auth,
                "banner_timeout": wait,
                "auth_timeout": wait,
                "channel_timeout": IO_TIMEOUT,
            },
        )
        name = known_hosts_name(connection.host, connection.port)
        label = f"{connection.user}@{connection.host}:{connection.port}"
        client = connection.client
        if pinned is not None:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            pinned = read_known_keys(self.known_hosts, name)
            client.set_missing_host_key_policy(PinOnFirstUse(self.known_hosts, label))
        for key_type, key_b64 in pinned.items():
            client.get_host_keys().add(
                name, key_type, paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
            )
        return connection


def _close_chain(connection: Any) -> None:
    """Close a fabric connection and every jump host behind it (fabric leaves those open)."""
    while connection is not None and not isinstance(connection, (str, bool)):
        with contextlib.suppress(Exception):
            connection.close()
        connection = connection.gateway


_SSH_FILES: Any = None
_SSH_FILES_LOCK = threading.Lock()


def _ssh_files() -> Any:
    """~/.ssh/config and /etc/ssh/ssh_config, parsed once per process and only read after
    (paramiko's SSHConfig.lookup does not change it)."""
    global _SSH_FILES
    with _SSH_FILES_LOCK:
        if _SSH_FILES is None:
            import fabric

            _SSH_FILES = fabric.Config().base_ssh_config
        return _SSH_FILES


def _fabric_config() -> Any:
    """A fabric configuration for one connection, over the SSH files parsed once.

    Never shared between connections: a fabric Connection writes to its configuration as it
    is made (each attribute it sets that is not its own re-merges the whole configuration),
    and a connection opened in another thread meanwhile found keys missing ('No attribute or
    config key found for authentication', seen when the controller connected to several
    nodes at once)."""
    import fabric

    return fabric.Config(ssh_config=_ssh_files())
