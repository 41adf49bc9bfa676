"""Errors of the SSH transport: each names the host (never a key or a secret)."""

from __future__ import annotations

from trainctl.errors import TrainctlError


class SshError(TrainctlError):
    """An SSH host could not be used; the message names the host (never a key or a secret)."""


class SshUnreachable(SshError):
    """The host did not accept an SSH connection within the time allowed."""


class SshHostKeyError(SshError):
    """The host's key is not the pinned one: refused (a reinstall, or a man in the middle)."""


class SshAuthError(SshError):
    """The host refused the key, or the key file cannot be used."""


class RemoteCommandError(SshError):
    """A command on the host failed."""
