"""Errors users see. Every message is one line that names what is wrong and what is allowed."""

from __future__ import annotations


class TrainctlError(Exception):
    """Base class for errors reported to the user as a single line (no traceback)."""


class SpecError(TrainctlError, ValueError):
    """Bad input, found before anything is provisioned, uploaded or started."""

    def __init__(self, field: str, message: str, *, prefixed: bool = False) -> None:
        self.field = field
        self.message = one_line(message)
        text = self.message if prefixed or not field else f"{field}: {self.message}"
        super().__init__(text)


def one_line(text: str) -> str:
    """User input (paths, names) echoed in an error must not break the one-line contract."""
    return "".join(c if c >= " " or c == "\t" else repr(c)[1:-1] for c in text)


class UnrunnableJobError(TrainctlError):
    """The job cannot run where it was placed and would fail the same way on new capacity
    (an image that cannot run the agent, say): it fails at once instead of relaunching."""


class RefusedError(TrainctlError):
    """A node refuses to run the job as recorded: its code is not the code that was submitted
    (tampered), or it would read or write outside the job's own data. Never retried: new
    capacity would find the same."""


class UnreadableRecordError(TrainctlError):
    """A job's record cannot be read (truncated, not JSON, another schema or version)."""


class StoreError(TrainctlError):
    """A store operation failed (after the store's own retries)."""


class NotFoundError(StoreError, KeyError):
    """The object or job does not exist in the store."""

    def __str__(self) -> str:  # KeyError quotes its argument; users get the plain message
        return str(self.args[0]) if self.args else "not found"


class JobNotFoundError(NotFoundError):
    pass


class PackagingError(TrainctlError):
    """The source directory cannot be packaged, or an archive is unsafe to extract."""
