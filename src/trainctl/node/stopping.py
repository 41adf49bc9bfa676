"""How a node's agent stops: its signals (SIGTERM and SIGINT stop it; a scheduler's own
warnings are notices), interruption notices from every source (relayed in the job's lease,
EC2's IMDS, a scheduler's signal) turned into the workers' emergency checkpoint, a controller
gone past the orphan timeout, and the ranks' stacks when the controller found the attempt
hung. A part of the Agent (trainctl.node.agent), by what it does.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from trainctl.procs import children, descendants, signal_all


def controller_silence(lease: dict[str, Any] | None, now: float) -> float:
    """Seconds since the job's controller last showed itself in its lease. A released lease
    counts from its release: a controller that hands the job on (a closed terminal's, to a
    detached one) lets go a moment before the next one takes it, and the nodes must still
    be there then. No lease at all: gone since ever."""
    last = (lease.get("renewed_at") or lease.get("released_at")) if lease else None
    return now - float(last or 0.0)


class NodeStopping:
    """The agent's methods for this part; the Agent holds the state they use."""

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the node; a scheduler's own warnings (Slurm: SIGTERM at
        preemption, SIGUSR1 before the time limit) are notices, and the controller's stop
        then comes as SIGUSR2 instead."""
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        if self.settings.notice_signals:
            for name in self.settings.notice_signals.split(","):
                signal.signal(getattr(signal, f"SIG{name}"), self.on_notice_signal)
            signal.signal(signal.SIGUSR2, self.on_sigterm)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        first = not self.stopping
        self.stopping = True
        if self.proc and self.proc.poll() is None:
            if first:  # (off the signal handler: it reads the store)
                threading.Thread(target=self.stop_launcher, name="stop", daemon=True).start()
        elif not self.idle:  # (an idle node's loop sees `stopping` and ends it in order)
            raise SystemExit(128 + signum)

    @property
    def stop_signal(self) -> int:
        """What stops this agent: SIGTERM, or SIGUSR2 where SIGTERM is a notice."""
        return signal.SIGUSR2 if self.settings.notice_signals else signal.SIGTERM

    def on_notice_signal(self, signum: int, frame: Any) -> None:
        detail = f"{signal.Signals(signum).name} from the scheduler (preemption or time limit)"
        # (off the signal handler: on_notice waits for the workers)
        threading.Thread(target=self.on_notice, args=(detail,), name="notice", daemon=True).start()

    def stop_launcher(self) -> None:
        """SIGTERM to the launcher (torchrun forwards it to the workers); first, where the
        controller asks (a hung attempt), every rank's stacks into the node log."""
        self.log_stacks_if_asked()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop_request(self) -> dict[str, Any]:
        """What the controller said as it stopped this attempt's nodes ({} if nothing)."""
        try:
            said = json.loads(self.store.get_text(self.jobs.keys.stopping(self.attempt)))
        except Exception:  # not said (a stop from elsewhere), or unreadable: nothing asked
            return {}
        return said if isinstance(said, dict) else {}

    def log_stacks_if_asked(self) -> None:
        """The controller found the attempt hung: each rank's Python stack (faulthandler, in
        the rank itself: see node.ranks) goes to the node log, and where each waits to the
        controller, before anything is stopped."""
        from trainctl.node.ranks import dump_stacks

        if self.ranks_dir is None or not self.stop_request().get("stacks"):
            return
        try:
            dumps = dump_stacks(self.ranks_dir, str(self.layout.code))
        except Exception as exc:  # a diagnosis, never a reason not to stop
            self.log(f"could not take the ranks' stacks: {exc}")
            return
        if not dumps:
            self.log("no rank's stack to show (no rank registered, or none answered)")
        for dump in dumps:
            self.log(f"rank {dump.rank} (pid {dump.pid}) is in {dump.waits_in}; its stacks:")
            for line in dump.text.splitlines():
                self.logs.write(line, shown=False)
        self.say("stacks", ranks={str(d.rank): d.waits_in for d in dumps})

    def watch_lease(self) -> None:
        """Read the job's lease every control_poll_seconds: an interruption notice that the
        controller relays there (a relaunch by choice, an injected fault, the stop of an
        adopted node) is this node's notice; a controller gone past the orphan timeout shuts
        the node down.

        A dead controller is not a dead job: `trainctl stop` (and later `attach`) take over
        through the store, so nodes wait `orphan_timeout_seconds` before giving up.
        """
        from trainctl.record.jobstore import lease_notice

        timeout = self.settings.orphan_timeout_seconds
        check = min(self.settings.control_seconds(len(self.cluster.nodes)), max(0.5, timeout / 4))
        wait = random.uniform(0.0, check)  # (spread over the interval: see LogShipper._run)
        while not self.stopping:
            time.sleep(wait)
            wait = check
            try:
                lease = self.jobs.read_lease()
            except Exception:
                continue  # store trouble is not evidence of a dead controller
            notice = lease_notice(lease, self.attempt, self.rank)
            if notice is not None and self.notice is None:
                # (its own thread: on_notice waits for the workers, and the lease is still
                # watched meanwhile)
                threading.Thread(
                    target=self.on_notice, args=(notice,), name="notice", daemon=True
                ).start()
            if controller_silence(lease, time.time()) > timeout:
                self.log(f"controller gone (no lease renewal for {timeout:.0f} s); shutting down")
                self.orphaned = True
                os.kill(os.getpid(), self.stop_signal)
                return

    def watch_pipe(self) -> None:
        """The controller that started this node tells it of a notice at once, on the
        agent's input (RunningProcess.tell), rather than in the lease it reads every
        control_poll_seconds; the lease stays the channel for a node that a controller
        adopted, or that only the store reaches. Input that ends (the controller gone, or
        none given) ends this watch."""
        from trainctl.protocol import parse

        for line in sys.stdin:
            msg = parse(line)
            if msg is None or msg.get("event") != "notice" or self.notice is not None:
                continue
            why = msg.get("why") if isinstance(msg.get("why"), str) else "interruption notice"
            self.log(f"the controller's notice, over its pipe: {why}")
            threading.Thread(target=self.on_notice, args=(why,), name="notice", daemon=True).start()

    def watch_spot_notices(self) -> None:
        """EC2's own notice, IMDSv2 spot/instance-action, polled when the node is on EC2."""
        from trainctl.node.imds import ImdsClient

        interval = self.settings.imds_poll_seconds
        try:
            imds = ImdsClient()
        except ValueError as exc:
            self.log(f"spot interruption notices not watched: {exc}")
            return
        self.log(f"watching spot interruption notices at {imds.endpoint} every {interval:g} s")
        reported_error: str | None = None
        rebalance_logged = False
        while not self.stopping and self.notice is None:
            action = imds.spot_instance_action()
            if action is not None:
                self.on_notice(f"spot interruption notice: {action['action']} at {action['time']}")
                return
            if imds.last_error != reported_error:  # once when IMDS fails, once when it is back
                reported_error = imds.last_error
                self.log(f"IMDS: {reported_error or 'answering again'}")
            if not rebalance_logged and (advice := imds.rebalance_recommendation()):
                rebalance_logged = True  # advice only: the notice is what ends the attempt
                self.log(f"EC2 rebalance recommendation at {advice['noticeTime']}")
            time.sleep(interval)

    def on_notice(self, detail: str) -> None:
        """SIGTERM the workers so they save an emergency checkpoint, then end them."""
        with self._notice_lock:  # two sources (store relay, IMDS) may report one interruption
            if self.notice is not None:
                return
            self.notice = detail or "interruption notice"
        self.say("notice")
        proc = self.proc
        if proc is None:  # still staging: nothing to save
            self.log(f"interruption notice ({self.notice}); nothing to save yet")
            os.kill(os.getpid(), self.stop_signal)
            return
        self.log_stacks_if_asked()  # (an adopted node is stopped through a notice)
        self.log(f"interruption notice; asking the workers to checkpoint ({self.notice})")
        grace = self.settings.notice_grace_seconds
        signal_all(self.worker_pids(proc), signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.log(f"workers did not stop within {grace:.0f} s; ending them")
            signal_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)

    def worker_pids(self, proc: subprocess.Popen[str]) -> list[int]:
        """The processes running the user's code: torchrun's children, else the launcher.

        Signalling torchrun itself would make it kill its workers after its own 30 s
        timeout; signalling the workers leaves the grace period to us.
        """
        if self.spec.launcher == "torchrun":
            workers = children(proc.pid)
            if workers:
                return workers
        return [proc.pid]
