"""The torchrun wrapper waits for the master's store before it starts (a real socket)."""

from __future__ import annotations


def test_torchrun_main_waits_for_the_master_store() -> None:
    import socket
    import threading

    from trainctl.launcher.torchrun_main import _arg, wait_for_master

    argv = ["--nnodes", "2", "--node-rank=1", "--master-port", "29501", "t.py", "--node-rank", "0"]
    assert _arg(argv, "--node-rank", "0") == "1"  # torchrun's own, not the script's
    assert _arg(argv, "--master-addr", "127.0.0.1") == "127.0.0.1"
    with socket.socket() as probe:  # a port nobody listens on (yet)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        assert wait_for_master("127.0.0.1", port, timeout=0.2) is False
        # The master starts listening a moment later: the wait ends then.
        timer = threading.Timer(0.3, probe.listen)
        timer.start()
        try:
            assert wait_for_master("127.0.0.1", port, timeout=10) is True
        finally:
            timer.join()
