"""Keeping secrets out of what trainctl shows: dry runs, events, logs, errors."""

from __future__ import annotations

import re

REDACTED = "<redacted>"
# Names that by convention hold secrets (AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, HF_TOKEN...).
SECRET_NAME_RE = re.compile(
    r"(SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_KEY|AUTH|SESSION)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the values of secret-looking names replaced by "<redacted>"."""
    return {k: REDACTED if is_secret_name(k) else v for k, v in env.items()}
