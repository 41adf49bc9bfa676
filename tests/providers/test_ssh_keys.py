"""The job's SSH key made with ssh-keygen where the cryptography package is missing."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.timeout(30)
def test_trainctl_key_without_cryptography_uses_ssh_keygen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import shutil
    import stat
    import sys

    from trainctl.provisioning.aws.keys import ensure_key

    if shutil.which("ssh-keygen") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ssh-keygen is missing (apt-get install openssh-client)")
        pytest.skip("ssh-keygen is not installed")
    path = tmp_path / "ssh" / "id_ed25519"
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "cryptography.hazmat.primitives", None)  # import fails
        line = ensure_key(path)
    assert line.startswith("ssh-ed25519 ") and line.endswith(" trainctl")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_key(path) == line  # read back with cryptography: the same key
