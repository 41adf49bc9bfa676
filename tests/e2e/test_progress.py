"""Progress where work is long: `trainctl submit` on a terminal (a real pty) shows the source
being packaged and uploaded; with `-o json`, or when stderr is not a terminal, nothing."""

from __future__ import annotations

import json
import os
import pty
import subprocess

import pytest

from tests.helpers import TRAINCTL, read_terminal


def _on_a_terminal(argv: list[str], timeout: float = 60) -> tuple[int, str, bytes]:
    """Run `argv` with stdin and stderr on a pty (stdout piped): (code, stdout, terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=subprocess.PIPE, stderr=slave, env={**os.environ}
    )
    os.close(slave)
    try:
        seen = read_terminal(master, proc, timeout)
        code = proc.wait(timeout=10)
        assert proc.stdout is not None
        return code, proc.stdout.read().decode(), seen
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def big_source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "hello.py").write_text("print('hi')\n")
    (src / "weights.bin").write_bytes(os.urandom(8 * 2**20))  # a source worth a bar
    return src


@pytest.mark.timeout(90)
def test_submit_on_a_terminal_shows_packaging_and_upload(home, big_source):
    code, out, terminal = _on_a_terminal(
        [TRAINCTL, "submit", "hello.py", "--source-dir", str(big_source), "--detach"]
    )
    assert code == 0, terminal.decode(errors="replace")
    assert b"packaging" in terminal and b"uploading source" in terminal
    assert b"MB" in terminal  # a byte count, not just a spinner
    assert out.strip().startswith("hello-")


@pytest.mark.timeout(90)
def test_no_progress_with_json_output_or_without_a_terminal(home, big_source):
    argv = [TRAINCTL, "submit", "hello.py", "--source-dir", str(big_source), "--detach"]
    code, out, terminal = _on_a_terminal([*argv, "-o", "json"])
    assert code == 0
    assert b"uploading" not in terminal and b"\x1b[" not in terminal
    assert json.loads(out)["state"] == "Pending"
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0
    assert "uploading" not in piped.stderr and "\x1b[" not in piped.stderr
