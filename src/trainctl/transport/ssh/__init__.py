"""SSH transport: fabric connections to hosts with pinned host keys (`connection`,
`hostkeys`), and a node's agent as a remote process that outlives them (`process`)."""

from trainctl.transport.ssh.connection import (
    RemoteResult,
    SshConnection,
    SshConnector,
    default_user,
    host_label,
)
from trainctl.transport.ssh.errors import (
    RemoteCommandError,
    SshAuthError,
    SshError,
    SshHostKeyError,
    SshUnreachable,
)
from trainctl.transport.ssh.hostkeys import known_hosts_name, known_hosts_path
from trainctl.transport.ssh.process import SshProcess

__all__ = [
    "RemoteCommandError",
    "RemoteResult",
    "SshAuthError",
    "SshConnection",
    "SshConnector",
    "SshError",
    "SshHostKeyError",
    "SshProcess",
    "SshUnreachable",
    "default_user",
    "host_label",
    "known_hosts_name",
    "known_hosts_path",
]
