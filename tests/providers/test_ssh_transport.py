"""The SSH transport and agent bootstrap against real sshd servers on loopback addresses.

Remote commands are small python scripts run by this venv's interpreter on the "host" (this
machine, reached through sshd), so what they print and which signals they get are real.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.rigs.sshd import SSH_KEYGEN, SshdServer, free_port, processes_with_env
from trainctl.protocol import EXIT_INFRA
from trainctl.spec.capacity import SshHost
from trainctl.toolkit import (
    agent_version,
    content_hash,
    package_dir,
    package_files,
    package_tarball,
)
from trainctl.transport.bootstrap import ensure_agent
from trainctl.transport.ssh import (
    RemoteCommandError,
    SshAuthError,
    SshConnector,
    SshHostKeyError,
    SshProcess,
    SshUnreachable,
)

SECRET = "tok-5ecret-value-81f3"


def script(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def start(server: SshdServer, body: str, env: dict[str, str] | None = None, **kwargs) -> SshProcess:
    run_dir = server.home / "runs" / f"run-{time.monotonic_ns()}"
    return SshProcess(
        SshConnector(server.host()),
        script(body),
        env or {},
        cwd=str(server.home),
        run_dir=str(run_dir),
        **kwargs,
    )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.timeout(60)
def test_runs_command_streams_lines_and_exit_code(sshd):
    server = sshd.servers[0]
    proc = start(
        server,
        """
        import os, sys
        print("hello from", os.getcwd(), flush=True)
        print("token", os.environ["API_TOKEN"], flush=True)
        print("", flush=True)
        print("naïve ✓", flush=True)
        sys.stdout.write("last line without newline")
        sys.exit(3)
        """,
        env={"API_TOKEN": SECRET},
    )
    lines = list(proc.lines())
    assert lines == [
        f"hello from {server.home}",
        f"token {SECRET}",  # the value reached the remote process intact
        "",
        "naïve ✓",
        "last line without newline",
    ]
    assert proc.wait(timeout=10) == 3
    assert proc.poll() == 3
    # detached: its own session and process group, recorded in the run dir
    assert proc.pgid != proc.pid
    pid_file = Path(proc.run_dir) / "pid"
    assert f'"pgid": {proc.pgid}' in pid_file.read_text()
    assert (Path(proc.run_dir) / "exit").read_text().strip() == "3"


@pytest.mark.timeout(60)
def test_exit_codes_and_a_missing_command(sshd):
    server = sshd.servers[0]
    assert start(server, "pass").wait(timeout=20) == 0
    killed = start(server, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.wait(timeout=20) == 128 + signal.SIGKILL  # as a shell reports a signal
    with pytest.raises(RemoteCommandError, match=r"cannot start /nonexistent/python"):
        SshProcess(
            SshConnector(server.host()),
            ["/nonexistent/python", "x.py"],
            {"API_TOKEN": SECRET},
            cwd=str(server.home),
            run_dir=str(server.home / "runs" / "missing"),
        )


@pytest.mark.timeout(60)
def test_process_survives_dropped_connection_and_lines_resume_exactly(sshd):
    """The server side of the connection is killed mid-stream: the remote process goes on,
    and lines() reconnects and resumes from its byte offset - no line lost or repeated."""
    server = sshd.servers[0]
    count = 400
    proc = start(
        server,
        f"""
        import time
        for i in range({count}):
            print(f"line {{i:04d}} " + "x" * (i % 37), flush=True)
            time.sleep(0.005)
        """,
    )
    seen: list[str] = []
    dropped: list[int] = []
    for line in proc.lines():
        seen.append(line)
        if len(seen) == 50:
            dropped = server.drop_connections()
    assert dropped, "no server-side session process was found to kill"
    assert proc.reconnects >= 1
    assert seen == [f"line {i:04d} " + "x" * (i % 37) for i in range(count)]
    assert proc.wait(timeout=10) == 0


@pytest.mark.timeout(60)
def test_terminate_signals_the_remote_process_group(sshd):
    server = sshd.servers[0]
    proc = start(
        server,
        """
        import signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", '''
        import signal, sys, time
        def bye(*_):
            print("child got SIGTERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("child ready", flush=True)
        time.sleep(60)
        '''])
        def bye(*_):
            child.wait()
            print("parent got SIGTERM", flush=True)
            sys.exit(5)
        signal.signal(signal.SIGTERM, bye)
        time.sleep(60)
        """,
    )
    lines = proc.lines()
    assert next(lines) == "child ready"
    proc.terminate()
    rest = list(lines)
    assert sorted(rest) == ["child got SIGTERM", "parent got SIGTERM"]
    assert proc.wait(timeout=10) == 5


@pytest.mark.timeout(60)
def test_kill_ends_the_group_and_descendants_in_other_sessions(sshd):
    """kill() reaches processes that left the group (torchrun's workers start sessions of
    their own) and that ignore SIGTERM."""
    server = sshd.servers[0]
    proc = start(
        server,
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; "
             "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"],
            start_new_session=True,
        )
        print("child", child.pid, flush=True)
        time.sleep(60)
        """,
    )
    lines = proc.lines()
    child = int(next(lines).split()[1])
    assert alive(child) and alive(proc.pid)
    proc.kill()
    assert wait_until(lambda: not alive(child) and not alive(proc.pid))
    assert list(lines) == []
    assert proc.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.timeout(60)
def test_process_gone_without_exit_code_counts_as_lost_node(sshd):
    """The whole process group SIGKILLed behind our back (a node taken away): EXIT_INFRA."""
    server = sshd.servers[0]
    proc = start(server, "import time\nprint('up', flush=True)\ntime.sleep(60)")
    lines = proc.lines()
    assert next(lines) == "up"
    os.killpg(proc.pgid, signal.SIGKILL)
    rest = list(lines)
    assert proc.wait(timeout=10) == EXIT_INFRA
    assert len(rest) == 1 and "ended without an exit code" in rest[0], rest


@pytest.mark.timeout(60)
def test_unreachable_host_becomes_exit_infra_after_the_timeout(sshd):
    server = sshd.servers[0]
    proc = start(
        server,
        "import time\nprint('up', flush=True)\ntime.sleep(60)",
        unreachable_timeout=2.0,
    )
    try:
        lines = proc.lines()
        assert next(lines) == "up"
        server.stop()  # listener and connections gone: nothing answers on that port
        lost_at = time.monotonic()
        rest = list(lines)
        waited = time.monotonic() - lost_at
        assert proc.poll() == EXIT_INFRA
        assert 2.0 <= waited < 15.0, waited
        assert len(rest) == 1, rest
        assert f"{server.address}:{server.port} unreachable for" in rest[0]
        assert "counting the node as lost" in rest[0]
    finally:  # the remote process outlived its host's sshd, as on a partitioned host
        os.killpg(proc.pgid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_env_values_stay_out_of_command_lines_errors_and_logs(sshd, caplog):
    caplog.set_level(logging.DEBUG)
    server = sshd.servers[0]
    proc = start(
        server,
        "import time\nprint('up', flush=True)\ntime.sleep(60)",
        env={"API_TOKEN": SECRET, "QUOTED": "a'b\"c $HOME `x`"},
    )
    lines = proc.lines()
    assert next(lines) == "up"
    cmdlines = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdlines.append(Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                pass
    assert not [c for c in cmdlines if SECRET.encode() in c]
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert f"API_TOKEN={SECRET}".encode() in environ
    assert b"QUOTED=a'b\"c $HOME `x`" in environ  # passed verbatim, not through a shell
    proc.kill()
    list(lines)
    errors = []
    try:
        SshProcess(
            SshConnector(server.host()),
            ["/nonexistent/agent"],
            {"API_TOKEN": SECRET},
            cwd=str(server.home),
            run_dir=str(server.home / "runs" / "secret"),
        )
    except RemoteCommandError as exc:
        errors.append(str(exc))
    assert errors and SECRET not in errors[0]
    assert SECRET not in caplog.text


@pytest.mark.timeout(60)
def test_host_key_is_pinned_on_first_use_and_a_change_is_refused(sshd, home):
    server = sshd.servers[0]
    SshConnector(server.host()).connect(timeout=5).close()
    known_hosts = home / "known_hosts"
    pinned = known_hosts.read_text()
    assert pinned == f"[{server.address}]:{server.port} {server.host_public_key.split()[0]} " + (
        f"{server.host_public_key.split()[1]}\n"
    )
    SshConnector(server.host()).connect(timeout=5).close()  # the same key: accepted
    server.stop()
    server.new_host_key()
    server.start()
    with pytest.raises(SshHostKeyError) as raised:
        SshConnector(server.host()).connect(timeout=5)
    message = str(raised.value)
    assert f"{server.address}:{server.port}: host key changed" in message
    assert str(known_hosts) in message
    assert known_hosts.read_text() == pinned  # never silently replaced


@pytest.mark.timeout(60)
def test_host_key_given_in_config_must_match(sshd, home):
    server, other = sshd.servers
    SshConnector(server.host(host_key=server.host_public_key)).connect(timeout=5).close()
    with pytest.raises(SshHostKeyError, match="host key mismatch"):
        SshConnector(server.host(host_key=other.host_public_key)).connect(timeout=5)
    assert not (home / "known_hosts").exists()  # pinned by config: nothing to remember


@pytest.mark.timeout(60)
def test_connect_retries_until_the_host_accepts(sshd, tmp_path):
    late = SshdServer(
        address="127.0.0.4",
        root=tmp_path / "late",
        client_key=sshd.client_key,
        client_public_key=sshd.client_public_key,
        port=free_port("127.0.0.4"),
    )
    sshd.servers.append(late)  # stopped with the others at teardown
    starter = threading.Timer(1.5, late.start)
    starter.start()
    try:
        began = time.monotonic()
        SshConnector(late.host()).connect(timeout=20).close()
        assert time.monotonic() - began >= 1.0
    finally:
        starter.join()


@pytest.mark.timeout(60)
def test_unreachable_and_bad_key_fail_clearly(sshd, tmp_path):
    server = sshd.servers[0]
    nobody = SshHost(
        address="127.0.0.9", port=free_port("127.0.0.9"), key_file=str(sshd.client_key)
    )
    began = time.monotonic()
    with pytest.raises(SshUnreachable, match=rf"127\.0\.0\.9:{nobody.port}: cannot connect"):
        SshConnector(nobody).connect(timeout=1.0)
    assert time.monotonic() - began < 10
    with pytest.raises(SshAuthError, match=r"key_file /no/such/key not found"):
        SshConnector(server.host(key_file="/no/such/key")).connect(timeout=1)
    stranger = tmp_path / "stranger"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(SshAuthError) as raised:
        SshConnector(server.host(key_file=str(stranger))).connect(timeout=1)
    assert f"key_file {stranger}" in str(raised.value)
    assert stranger.read_text().splitlines()[1] not in str(raised.value)  # path, not content


@pytest.fixture
def behind_bastion(sshd, monkeypatch):
    """(bastion, target): the target sshd cannot be reached from this process, only from the
    bastion's sshd (a separate process), as a node without a public address is reachable only
    from inside its VPC. The refusal is at this process's `connect`, so nothing can cheat."""
    import socket

    bastion, target = sshd.servers
    real_connect = socket.socket.connect

    def no_route(sock, address):  # type: ignore[no-untyped-def]
        if isinstance(address, tuple) and tuple(address[:2]) == (target.address, target.port):
            raise ConnectionRefusedError(111, "Connection refused")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", no_route)
    return bastion, target


@pytest.mark.timeout(60)
def test_a_host_is_reached_through_its_jump_host(behind_bastion, home):
    bastion, target = behind_bastion
    with pytest.raises(SshUnreachable, match="Connection refused"):
        SshConnector(target.host()).connect(timeout=1)  # no route from here
    jump = f"root@{bastion.address}:{bastion.port}"
    conn = SshConnector(target.host(proxy_jump=jump)).connect(timeout=10)
    try:
        done = conn.run(["sh", "-c", "echo $HOME"])
        assert (done.code, done.stdout.strip()) == (0, str(target.home))  # the target ran it
        conn.put_bytes(b"through the bastion", f"{target.home}/note")
    finally:
        conn.close()
    assert (target.home / "note").read_bytes() == b"through the bastion"
    # Both hosts' keys are pinned, each under its own name.
    pinned = (home / "known_hosts").read_text().splitlines()
    assert sorted(line.split()[0] for line in pinned) == sorted(
        [f"[{bastion.address}]:{bastion.port}", f"[{target.address}]:{target.port}"]
    )


@pytest.mark.timeout(90)
def test_a_process_behind_a_jump_host_streams_and_survives_a_dropped_bastion_link(
    behind_bastion, monkeypatch
):
    bastion, target = behind_bastion
    monkeypatch.setenv("TRAINCTL_SSH_PROXY_JUMP", f"root@{bastion.address}:{bastion.port}")
    proc = SshProcess(
        SshConnector(target.host()),  # the setting applies to hosts without their own
        script(
            """
            import time
            for i in range(6):
                print("line", i, flush=True)
                time.sleep(0.3)
            """
        ),
        {},
        cwd=str(target.home),
        run_dir=str(target.home / "runs" / "behind"),
    )
    lines = proc.lines()
    assert next(lines) == "line 0"
    bastion.drop_connections()  # the bastion's side of the link goes: reconnect through it
    assert list(lines) == [f"line {i}" for i in range(1, 6)]
    assert proc.wait(timeout=10) == 0
    assert proc.reconnects >= 1


@pytest.mark.timeout(60)
def test_a_changed_jump_host_key_is_refused_and_named(behind_bastion, home):
    bastion, target = behind_bastion
    jump = f"root@{bastion.address}:{bastion.port}"
    SshConnector(target.host(proxy_jump=jump)).connect(timeout=10).close()
    bastion.stop()
    bastion.new_host_key()
    bastion.start()
    with pytest.raises(SshHostKeyError) as raised:
        SshConnector(target.host(proxy_jump=jump)).connect(timeout=5)
    assert f"jump host {bastion.address}" in str(raised.value)
    assert "host key changed" in str(raised.value)


@pytest.mark.timeout(60)
def test_ssh_config_proxy_jump_and_host_alias_are_honoured(behind_bastion, tmp_path, monkeypatch):
    """~/.ssh/config, as `ssh` reads it: an alias with HostName, Port and ProxyJump."""
    import trainctl.transport.ssh.connection as connection

    bastion, target = behind_bastion
    user_home = tmp_path / "user"
    (user_home / ".ssh").mkdir(parents=True)
    (user_home / ".ssh" / "config").write_text(
        f"Host gpu-box\n  HostName {target.address}\n  Port {target.port}\n"
        f"  ProxyJump root@{bastion.address}:{bastion.port}\n"
    )
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.setattr(connection, "_SSH_FILES", None)  # read this HOME's config
    conn = SshConnector(target.host(address="gpu-box", port=22)).connect(timeout=10)
    try:
        assert conn.run(["sh", "-c", "echo $HOME"]).stdout.strip() == str(target.home)
    finally:
        conn.close()
        connection._SSH_FILES = None


def test_proxy_jump_values_are_checked() -> None:
    from pydantic import ValidationError

    assert SshHost(address="a", proxy_jump="u@bastion:2222,other").proxy_jump
    assert SshHost(address="a", proxy_jump="none").proxy_jump == "none"
    for bad in ("-oProxyCommand=x", "a b", "u@:22", "bastion:port"):
        with pytest.raises(ValidationError, match="not a jump host"):
            SshHost(address="a", proxy_jump=bad)


# --- agent bootstrap ---------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_version_is_a_content_hash_of_the_package(tmp_path):
    copy = tmp_path / "trainctl"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert agent_version(copy) == agent_version()
    (copy / "__pycache__").mkdir(exist_ok=True)
    (copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    assert content_hash(copy) == content_hash()  # bytecode caches differ per host
    (copy / "errors.py").write_text((copy / "errors.py").read_text() + "\n# a dev edit\n")
    assert content_hash(copy) != content_hash()
    assert agent_version().startswith("0.1.0-")


@pytest.mark.timeout(30)
def test_package_tarball_is_reproducible():
    import io
    import tarfile

    first, second = package_tarball(), package_tarball()
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert names == {f"trainctl/{p.as_posix()}" for p in package_files()}
    assert "trainctl/node/agent.py" in names
    assert not [n for n in names if "__pycache__" in n]


def bare_python(root: Path, *extra_paths: Path) -> str:
    """A venv that sees this venv's libraries (torch, pydantic...) but not its trainctl.

    A path in a .pth file is added to sys.path without processing the .pth files there,
    so the editable install's finder in the main site-packages stays out.
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60
    )
    site = next((root / "lib").glob("python3*/site-packages"))
    paths = [*extra_paths, Path(sysconfig.get_paths()["purelib"])]
    (site / "main-libs.pth").write_text("".join(f"{p}\n" for p in paths))
    return str(root / "bin" / "python")


@pytest.mark.timeout(60)
def test_host_with_this_trainctl_needs_no_upload(sshd):
    server = sshd.servers[0]
    conn = SshConnector(server.host()).connect(timeout=5)
    try:
        runtime = ensure_agent(conn)
    finally:
        conn.close()
    assert runtime.version == agent_version()
    assert runtime.pythonpath is None and runtime.env == {}
    assert not runtime.uploaded
    assert not (server.home / ".trainctl" / "agent").exists()


@pytest.mark.timeout(90)
def test_bootstrap_uploads_once_when_host_cannot_import_this_trainctl(sshd, tmp_path):
    server = sshd.servers[0]
    python = bare_python(tmp_path / "bare")
    check = subprocess.run([python, "-c", "import trainctl"], capture_output=True, cwd=tmp_path)
    assert check.returncode != 0, "the bare interpreter must not import trainctl"
    host = server.host(python=python)

    conn = SshConnector(host).connect(timeout=5)
    try:
        first = ensure_agent(conn)
    finally:
        conn.close()
    target = server.home / ".trainctl" / "agent" / agent_version()
    assert first.uploaded and first.installed == []
    assert first.pythonpath == f"{target}:{target}/deps"
    assert (target / "trainctl" / "node" / "agent.py").is_file()
    assert agent_version(target / "trainctl") == agent_version()
    assert not list(target.parent.glob(".upload-*"))  # the tarball is removed once unpacked

    conn = SshConnector(host).connect(timeout=5)
    try:
        second = ensure_agent(conn)
    finally:
        conn.close()
    assert not second.uploaded and second.pythonpath == first.pythonpath  # cached

    # the uploaded agent runs, from the uploaded copy
    proc = SshProcess(
        SshConnector(host),
        [
            python,
            "-c",
            "import trainctl.node.agent as a, trainctl.toolkit as b; "
            "print(a.__file__); print(b.agent_version())",
        ],
        first.env,
        cwd=str(server.home),
        run_dir=str(server.home / "runs" / "agent"),
    )
    lines = list(proc.lines())
    assert proc.wait(timeout=10) == 0
    assert lines == [str(target / "trainctl" / "node" / "agent.py"), agent_version()]


@pytest.mark.timeout(90)
def test_bootstrap_replaces_a_host_trainctl_of_another_version(sshd, tmp_path):
    server = sshd.servers[0]
    old = tmp_path / "old-install"
    shutil.copytree(package_dir(), old / "trainctl", ignore=shutil.ignore_patterns("__pycache__"))
    (old / "trainctl" / "cli.py").write_text("# an older trainctl\n")
    python = bare_python(tmp_path / "old-venv", old)
    conn = SshConnector(server.host(python=python)).connect(timeout=5)
    try:
        runtime = ensure_agent(conn)
    finally:
        conn.close()
    assert runtime.uploaded
    assert runtime.pythonpath is not None and agent_version() in runtime.pythonpath


@pytest.mark.timeout(90)
def test_missing_dependencies_are_pip_installed_into_the_agent_dir(sshd, tmp_path):
    """No pydantic and no pip on the host: the install is attempted with --target <dir>/deps
    and fails with a message naming the host, the requirements and pip's error."""
    server = sshd.servers[0]
    root = tmp_path / "isolated"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    host = server.host(python=str(root / "bin" / "python"))
    conn = SshConnector(host).connect(timeout=5)
    try:
        with pytest.raises(RemoteCommandError) as raised:
            ensure_agent(conn)
    finally:
        conn.close()
    message = str(raised.value)
    assert f"{server.address}:{server.port}" in message
    assert "pydantic>=2.6,<3" in message and "-m pip failed" in message
    assert "No module named pip" in message
    assert processes_with_env("HOME", str(server.home)) == []


@pytest.mark.timeout(60)
def test_connections_made_in_parallel_threads_see_their_whole_configuration(tmp_path):
    """The controller connects to its nodes from a thread each. fabric writes to a connection's
    configuration as it makes the connection, so a configuration shared between threads was
    seen half-merged by another ('No attribute or config key found for authentication', a
    CI failure). A short switch interval makes the interleaving that load made likely."""
    connector = SshConnector(SshHost(address="127.0.0.1", port=2222), known_hosts=tmp_path / "kh")
    errors: list[BaseException] = []

    def connect_often() -> None:
        for _ in range(150):
            try:
                made = connector._connection("127.0.0.1", 2222, "root", None, 5, None, pinned={})
                assert made.authentication.strategy_class is None
                assert made.gateway is None
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=connect_often) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} of 600 connections: {errors[0]!r}"
