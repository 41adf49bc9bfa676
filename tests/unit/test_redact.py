"""Secrets hidden in every form a script prints them (issue 46): as given, in repr() and
JSON strings, shell-quoted; a short one only where it stands alone."""

from __future__ import annotations

import json
import shlex

import pytest

from trainctl.redact import REDACTED, Redactor, is_secret_name


def redactor(*values: str) -> Redactor:
    return Redactor(set(), {"password"}, list(values))


@pytest.mark.parametrize(
    "secret",
    ["hunter2-very-secret", 'quo"te\\back', "it's-a-secret", "naïve-ünïcode-pass", "tab\there"],
)
def test_every_printed_form_is_hidden(secret):
    r = redactor(secret)
    for shown in (
        secret,
        repr(secret),
        str([secret]),
        str({"password": secret}),
        json.dumps(secret),
        json.dumps({"password": secret}),
        json.dumps(secret, ensure_ascii=False),
        shlex.join(["train.py", "--password", secret]),
    ):
        text = r.text(f"line: {shown} end")
        assert secret not in text and REDACTED in text, (shown, text)
        for form in (repr(secret)[1:-1], json.dumps(secret)[1:-1]):
            assert form not in text, (shown, text)


def test_a_short_secret_is_hidden_where_it_stands_alone():
    r = redactor("abc")
    assert r.text("--short_password abc") == f"--short_password {REDACTED}"
    assert r.text('SM_HPS={"short_password": "abc"}') == (
        f'SM_HPS={{"short_password": "{REDACTED}"}}'
    )
    assert r.text("abcdef and xabc stay") == "abcdef and xabc stay"
    assert r.tree({"a": ["abc", "abcd"]}) == {"a": [REDACTED, "abcd"]}


def test_counts_and_tools_named_like_secrets_are_not_secrets():
    for name in ("max_tokens", "num_tokens", "tokenizer_name", "author", "AUTHOR_EMAIL"):
        assert not is_secret_name(name), name
    for name in ("HF_TOKEN", "auth_token", "GITHUB_TOKEN", "AUTH", "api_key", "db_password"):
        assert is_secret_name(name), name
