"""Keeping secrets out of what trainctl shows: dry runs, events, logs, errors."""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "<redacted>"
# Names that by convention hold secrets (AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, HF_TOKEN...);
# not counts and tools named alike (max_tokens, tokenizer, author).
SECRET_NAME_RE = re.compile(
    r"(SECRET|TOKEN(?!S|IZ)|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_KEY|AUTH(?!OR)"
    r"|SESSION)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the values of secret-looking names replaced by "<redacted>"."""
    return {k: REDACTED if is_secret_name(k) else v for k, v in env.items()}


# Values shorter than this are redacted only where they stand alone (not inside a longer
# word or number): cutting every "ab" out of a log would hide the log, not a secret.
MIN_SECRET_CHARS = 4
_WORD = r"[A-Za-z0-9_]"


def printed_forms(value: str) -> set[str]:
    """The ways a script may print `value`: as given, inside its repr() or a JSON string
    (quotes and backslashes escaped, non-ASCII as \\u escapes or not), shell-quoted."""
    import shlex

    return {
        value,
        repr(value)[1:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        shlex.quote(value),
    }


class Redactor:
    """The secret values of one job, and how to hide them: in its spec's environment and
    hyperparameters (by name), and wherever they appear in text (the launch line, a script
    that prints its arguments, a failure message)."""

    def __init__(self, env_names: set[str], hp_names: set[str], values: list[str]) -> None:
        self.env_names = env_names
        self.hp_names = hp_names
        forms = {form for value in values if value for form in printed_forms(value)}
        # Longest first: a secret that contains another is hidden whole.
        self.values = sorted({v for v in forms if len(v) >= MIN_SECRET_CHARS}, key=len)[::-1]
        short = sorted((v for v in forms if len(v) < MIN_SECRET_CHARS), key=len)[::-1]
        self.short = (
            re.compile(f"(?<!{_WORD})(?:{'|'.join(map(re.escape, short))})(?!{_WORD})")
            if short
            else None
        )

    @classmethod
    def for_spec(cls, spec: Any) -> Redactor:
        env_names = {k for k in spec.environment if is_secret_name(k) or k in set(spec.secret_env)}
        hp_names = {
            k
            for k in spec.hyperparameters
            if is_secret_name(k) or k in set(spec.secret_hyperparameters)
        }
        values = [spec.environment[k] for k in env_names]
        for k in hp_names:
            value = spec.hyperparameters[k]
            values.append(value if isinstance(value, str) else json.dumps(value))
            values.append(str(value))
        return cls(env_names, hp_names, values)

    def __bool__(self) -> bool:
        return bool(self.env_names or self.hp_names)

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        if self.short is not None:
            text = self.short.sub(REDACTED, text)
        return text

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {k: REDACTED if k in self.env_names else v for k, v in env.items()}

    def hyperparameters(self, hps: dict[str, Any]) -> dict[str, Any]:
        return {k: REDACTED if k in self.hp_names else v for k, v in hps.items()}

    def tree(self, data: Any) -> Any:
        """`data` (JSON-like) with every secret value hidden in its strings."""
        if not self.values and self.short is None:
            return data
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self.tree(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.tree(v) for v in data]
        return data
