"""The node agent: one per node, started by the controller through the provider.

It stages the node (code, SageMaker layout, channels, an isolated Python environment for
`requirements.txt`), runs the launcher's command for its rank with the code directory as
working directory, streams and saves the node's log, and on success uploads the model and
output data. It talks back to the controller through its output: user lines verbatim,
control messages as `@@trainctl@@ {json}` lines.

Run as: python -m trainctl.node.agent --store URI --job NAME --attempt K --rank R
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.errors import NotFoundError, RefusedError, StoreError
from trainctl.gpus import health_problems, visible_gpus
from trainctl.node.output import (
    LauncherNoise,
    LogShipper,
    NodeStatus,
    RankedLines,
    console,
    emit,
    failure_from_output,
    yielding,
)
from trainctl.node.remote_start import ENDPOINTS_VARIABLE, RemoteStartServer
from trainctl.node.staging import pack_directory, stage_channel, write_json
from trainctl.protocol import CONTROL_PREFIX, EXIT_INFRA, EXIT_PREEMPTED, EXIT_REFUSED, ranked_line
from trainctl.protocol import split as split_control

if TYPE_CHECKING:
    from trainctl.store import Store

from trainctl.node.remote_starts import STRAY_GRACE_SECONDS, RemoteStarts
from trainctl.node.reports import NodeReports
from trainctl.node.stopping import NodeStopping

# After the launcher exits: how long its output may still drain (then a process it left
# behind has STRAY_GRACE_SECONDS between SIGTERM and SIGKILL).
STRAY_OUTPUT_SECONDS = 2.0
OUTPUT_DRAIN_SECONDS = 60.0


def become_subreaper() -> bool:
    """Make this agent the reaper of every orphan below it (Linux PR_SET_CHILD_SUBREAPER):
    a daemonised or `setsid` process of the script is re-parented here, not to init, so it
    stays in the agent's tree and ends with the node, whatever its environment says.
    False where the system does not allow it (the environment tag still finds most)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # not Linux
        return False


class Agent(NodeStopping, NodeReports, RemoteStarts):
    def __init__(self, store_uri: str, job: str, attempt: int, rank: int) -> None:
        from trainctl.cluster import ClusterInfo
        from trainctl.launcher.layout import Layout
        from trainctl.record.jobstore import JobStore
        from trainctl.spec.settings import get_settings
        from trainctl.store import open_store

        self.settings = get_settings()
        self.store = open_store(store_uri)
        # For the status each heartbeat: the next beat writes it again (see Store.prompt)
        self.prompt_store = self.store.prompt()
        self.jobs = JobStore(self.store, job)
        self.record = self.jobs.load()
        self.spec = self.record.spec
        self.cluster = ClusterInfo.model_validate_json(
            self.store.get_text(self.jobs.keys.cluster(attempt))
        )
        self.rank = rank
        self.attempt = attempt
        self.node = self.cluster.node(rank)
        self.layout = Layout(Path(self.node.root))
        self.tail: deque[str] = deque(maxlen=400)
        self.proc: subprocess.Popen[str] | None = None
        self.stopping = False
        self.notice: str | None = None  # why this node is being interrupted, if it is
        self.orphaned = False  # the controller's lease went stale past the orphan timeout
        self._notice_lock = threading.Lock()
        self.preempted_at: int | None = None  # step of the script's emergency checkpoint
        self.status = NodeStatus(rank)
        self.finished = False  # the result is being recorded: no more status writes
        self.sync = None
        self.outputs: Store | None = None  # where the outputs go, opened when checked
        self.workdir = None  # the working directory's sync (node.workdir), once staged
        self.tensorboard = None  # the TensorBoard logs' copy (node.tensorboard), once staged
        self.remote_starts: RemoteStartServer | None = None  # multi-host MPI (see there)
        self.fastfile_originals: list[Path] = []  # read-only in the node's view (sandbox)
        # Where the job's rank processes register (node.ranks), once launched.
        self.ranks_dir: Path | None = None
        self.idle = False  # runs no launcher of its own (an MPI host that mpirun reaches)
        # Per rank (None: not told apart), a line of a script's that a control message cut.
        self.started_lines: dict[int | None, str] = {}
        self.noise = LauncherNoise()
        self.forwarding = threading.Lock()  # mpirun's two outputs are read by two threads
        from trainctl.redact import Redactor

        # Nothing of the node is for other users of the machine (its config holds the job's
        # hyperparameters, its log may hold what the script printed).
        self.layout.private.mkdir(parents=True, exist_ok=True)
        os.chmod(self.layout.private, 0o700)
        self.redactor = Redactor.for_spec(self.spec)
        log_path = self.layout.output / "node.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.logs = LogShipper(
            log_path,
            self.store,
            self.jobs.keys.log(attempt, rank),
            self.settings.log_ship_seconds(len(self.cluster.nodes)),
            redact=self.redactor.text,
        )

    def log(self, message: str) -> None:
        self.logs.write(f"[trainctl] {message}")

    # -- staging ------------------------------------------------------------------------
    def stage(self) -> None:
        from trainctl.launcher.layout import (
            ARGV_FILE,
            hides_arguments,
            input_data_config,
            resource_config,
            script_args,
        )
        from trainctl.node.extract import safe_extract
        from trainctl.node.guard import (
            check_claimed_locations,
            check_job_uris,
            claim_checkpoint_dir,
            verify_source,
        )
        from trainctl.record.locations import output_store
        from trainctl.store import open_store

        check_job_uris(self.record)
        # Opened before the check and kept: the folder checked is the one written to hours
        # later, whatever is put in its place meanwhile (pinned; see LocalStore).
        self.outputs = output_store(self.record, pinned=True)
        check_claimed_locations(self.record)
        claim_checkpoint_dir(
            self.layout.checkpoints(self.spec), self.record, self.settings.home, self.layout.root
        )
        for path in self.layout.all_dirs(self.spec):
            path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="trainctl-src-") as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            parent_uri, _, leaf = self.record.source_uri.rpartition("/")
            open_store(parent_uri).get_file(leaf, archive)
            verify_source(archive, self.record)
            members = safe_extract(archive, self.layout.code)
        self.log(
            f"code: {len(members)} entries from {self.record.source_uri} "
            f"(sha256 {self.record.source_sha256[:12]} verified)"
        )
        write_json(self.layout.config / "hyperparameters.json", self.spec.hyperparameters)
        if hides_arguments(self.spec):  # read by launcher.script_main, off the command line
            write_json(self.layout.code / ARGV_FILE, script_args(self.spec))
        write_json(
            self.layout.config / "resourceconfig.json", resource_config(self.cluster, self.rank)
        )
        write_json(self.layout.config / "inputdataconfig.json", input_data_config(self.spec))
        nodes = len(self.cluster.nodes)
        for name, uri in sorted(self.spec.inputs.items()):
            config = self.spec.channel_config.get(name)
            sharded = config is not None and config.distribution == "ShardedByS3Key"
            shard = (self.rank, nodes) if sharded else None
            link = config is not None and config.input_mode == "FastFile"
            linked = stage_channel(
                name, uri, self.layout.channel(name), self.log, shard=shard, link=link,
                store_uri=self.record.store_uri,
            )  # fmt: skip
            if linked is not None:
                self.fastfile_originals.append(linked)
        half_written: list[str] = []  # checkpoint folders a lost node left half-written
        restoring = time.monotonic()
        checkpoints = self.start_checkpoint_sync(half_written)
        workdir = self.start_workdir_sync(members)
        restored_in = time.monotonic() - restoring
        self.start_tensorboard_sync()
        # Where this attempt starts from, for the record (controller: Attempt.restored).
        workdir["unsettled"] += [f"SM_CHECKPOINT_DIR/{folder}" for folder in half_written]
        self.say(
            "restored",
            checkpoint_files=len(checkpoints),
            checkpoint_bytes=sum(size for size, _ in checkpoints.values()),
            seconds=round(restored_in, 3),
            **workdir,
        )

    def start_checkpoint_sync(self, half_written: list[str]) -> dict[str, tuple[int, int]]:
        """Restore the checkpoints and start uploading new ones; returns what was restored
        (and adds to `half_written` the folders it left out: see checkpoints.restore)."""
        from trainctl.node.checkpoints import CheckpointSync, restore
        from trainctl.record.locations import checkpoint_store

        store = checkpoint_store(self.record, pinned=True)
        local = self.layout.checkpoints(self.spec)
        known = restore(store, local, self.log, left_out=half_written)
        self.sync = CheckpointSync(
            store,
            local,
            self.rank,
            interval=self.settings.checkpoint_sync_seconds,
            log=self.log,
            known=known,
            on_state=self.stored_state,
            nodes=len(self.cluster.nodes),
        ).start()
        return known

    def start_tensorboard_sync(self) -> None:
        """Copy what the script writes to its TensorBoard dir to the job's TensorBoard
        location while it runs (node.tensorboard); SageMaker's config file names the dir."""
        from trainctl.node.tensorboard import TensorBoardSync
        from trainctl.record.locations import tensorboard_store

        store = tensorboard_store(self.record)
        local = self.layout.tensorboard(self.spec)
        write_json(
            self.layout.config / "tensorboardoutputconfig.json",
            {"LocalPath": str(local), "S3OutputPath": store.uri},
        )
        self.tensorboard = TensorBoardSync(
            store,
            local,
            self.rank,
            interval=self.settings.tensorboard_sync_seconds,
            log=self.log,
        ).start()

    def start_workdir_sync(self, shipped: list[str]) -> dict[str, Any]:
        """Put back the working directories the nodes of earlier attempts left (every node's
        files, newest copies), and keep copying this one (node.workdir); returns what was
        restored."""
        from trainctl.node.workdir import (
            NodeRestore,
            StateRoots,
            WorkdirSync,
            ignore_spec,
            normalise_member,
            restore,
        )
        from trainctl.store import open_store

        if self.spec.workdir_max_mb <= 0:
            return NodeRestore().summary()
        roots = StateRoots(
            dirs={
                "code": self.layout.code,
                "model": self.layout.model,
                "output": self.layout.output_data,
            },
            shipped=frozenset(normalise_member(m) for m in shipped),
            skip_dirs=(self.layout.checkpoints(self.spec), self.layout.tensorboard(self.spec)),
            ignore=ignore_spec(self.spec.workdir_ignore),
        )
        store = open_store(self.record.store_uri).child(self.jobs.keys.workdir)
        max_bytes = int(self.spec.workdir_max_mb * 2**20)
        restored = restore(store, self.rank, roots, self.log, max_bytes=max_bytes)
        self.workdir = WorkdirSync(
            store,
            self.rank,
            self.attempt,
            roots,
            max_bytes=max_bytes,
            interval=self.settings.workdir_sync_seconds,
            log=self.log,
            known=restored.known,
            borrowed=restored.borrowed,
            superseded=restored.superseded,
            on_state=self.stored_state,
            staging=self.layout.workdir_staging,
        ).start()
        return restored.summary()

    def nccl_env(self, env: dict[str, str]) -> dict[str, str]:
        """NCCL's interface (this node's route to the master), its async error handling and
        the aws-ofi-nccl plug-in where EFA is used (see trainctl.launcher.nccl)."""
        from trainctl.launcher.nccl import OFI_NCCL_DIRS, nccl_env
        from trainctl.node.route import route_interface

        plugin = next((d for d in OFI_NCCL_DIRS if Path(d, "libnccl-net.so").exists()), None)
        return nccl_env(
            self.cluster.network_env,
            route_interface=route_interface(self.cluster.master.address),
            ofi_nccl_dir=plugin,
            ld_library_path=env.get("LD_LIBRARY_PATH"),
        )

    def gpu_problems(self) -> list[str]:
        """What is wrong with this node's GPUs before training (see trainctl.gpus): fewer
        than its instance type has, one busy with another process, ECC errors."""
        from trainctl.spec.catalog import CATALOG

        if not self.settings.gpu_health_check:
            return []
        known = CATALOG.get(self.cluster.instance_type)
        expected = known.gpus if known and known.gpus else None
        ids = visible_gpus()
        if not ids and expected is None:
            return []  # a CPU node
        warnings: list[str] | None = None if self.settings.gpu_busy_fails_node else []
        problems = health_problems(ids, expected, busy_warnings=warnings)
        for warning in warnings or []:
            self.log(f"GPU health (warning, the job runs beside it): {warning}")
        for problem in problems:
            self.log(f"GPU health: {problem}")
        return problems

    def python(self) -> str:
        from trainctl.node.pyenv import prepare_python

        return prepare_python(self.layout.code, self.settings.home / "envs", self.logs.write)

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        from trainctl.launcher.layout import sagemaker_env
        from trainctl.launcher.threads import thread_env, usable_cpus

        env = dict(os.environ)
        env.update(self.cluster.network_env)
        env.update(self.nccl_env(env))
        env.update(
            sagemaker_env(
                self.spec,
                self.cluster,
                self.rank,
                self.layout,
                num_gpus=len(visible_gpus()),
                num_cpus=os.cpu_count() or 1,
                source_uri=self.record.source_uri,
            )
        )
        env.update(extra)
        env.update(
            thread_env(self.spec, self.cluster, self.rank, cpus=usable_cpus(), inherited=env)
        )
        env["PYTHONUNBUFFERED"] = "1"
        # Temp files of the job (torchrun's torchelastic_* dirs among them) live in the node
        # and go with it, instead of piling up in the machine's /tmp.
        tmp = self.layout.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env.update(self.spec.environment)  # the user's explicit values win
        if self.ranks_dir is not None:  # (the hook goes first: the user's PYTHONPATH follows)
            from trainctl.node.ranks import hook_env

            env = hook_env(env, self.ranks_dir)
        return env

    def in_own_view(self, argv: list[str], python: str) -> list[str]:
        """`argv` started in the node's own view of the machine (trainctl.node.sandbox):
        the store, trainctl's home and the other nodes' folders empty, its layout at
        /opt/ml. Not on a machine whose root is the node's (a cloud host, a container)."""
        from trainctl.node import sandbox
        from trainctl.spec.uris import parse_uri

        writable = "; its FastFile channels' originals are writable" * bool(self.fastfile_originals)
        if not self.settings.node_sandbox or self.layout.root == Path("/"):
            if writable:
                self.log(f"the job runs in the machine's own view{writable}")
            return argv
        if sys.platform != "linux":
            self.log(
                f"this system has no mount namespaces: the job sees every file you can{writable}"
            )
            return argv
        scheme, store_path = parse_uri(self.record.store_uri)
        hidden = [self.settings.home] + ([Path(store_path)] if scheme == "file" else [])
        if self.layout.root.parent.name.startswith("attempt-"):  # <base>/<job>/attempt-N/
            hidden.append(self.layout.root.parents[2])  # every job's nodes (Slurm, SSH too)
        shown = [self.layout.root, Path(python).parent.parent, Path(sandbox.__file__).parents[2]]
        shown += [self.layout.checkpoints(self.spec), self.layout.tensorboard(self.spec)]
        view = sandbox.view(
            hidden=hidden, shown=shown, opt_ml=self.layout.ml, read_only=self.fastfile_originals
        )
        return sandbox.command(sys.executable, view, argv)

    # -- running ------------------------------------------------------------------------
    def run(self) -> int:
        from trainctl.launcher import build_node_command
        from trainctl.launcher.mpi import starts_remotely

        self.install_signals()
        if not become_subreaper():
            self.log("not this node's subreaper: a daemon the script starts may outlive it")
        self.start_watching()
        emit("agent_started", rank=self.rank, pid=os.getpid())
        try:
            started = time.monotonic()
            self.stage()
            staged = time.monotonic()
            python = self.python()
            startup = {"code": staged - started, "venv": time.monotonic() - staged}
        except RefusedError as exc:
            return self.finish(EXIT_REFUSED, f"refused: {exc}", None)
        except Exception as exc:
            return self.finish(EXIT_INFRA, f"node setup failed: {exc}", None)
        if problems := self.gpu_problems():
            # Infrastructure, not the user's code: the controller replaces the node.
            reason = f"GPU health check failed: {'; '.join(problems)}"
            return self.finish(EXIT_INFRA, reason, None, unhealthy=True)
        command = build_node_command(
            self.spec, self.cluster, self.rank, python=python, agent_python=sys.executable
        )
        from trainctl.node.ranks import prepare

        self.ranks_dir = self.layout.ranks
        prepare(self.ranks_dir)
        if self.spec.launcher == "mpi" and starts_remotely(self.cluster):
            try:
                self.take_remote_starts(python)
            except (OSError, StoreError) as exc:
                return self.finish(EXIT_INFRA, f"cannot take mpirun's remote starts: {exc}", None)
        if not command.argv:
            self.idle = True
            self.say("idle")
            self.log("this host runs no launcher of its own; waiting for the job to end")
            while not self.stopping:
                time.sleep(0.5)
            self.log_stacks_if_asked()  # (of the ranks mpirun started here)
            return self.finish(0, None, None)  # (which ends the remote starts)
        env = self.environment(command.env)
        if self.remote_starts is not None:
            try:
                env[ENDPOINTS_VARIABLE] = str(self.remote_start_table())
            except ValueError as exc:
                return self.finish(EXIT_INFRA, f"cannot start mpirun: {exc}", None)
        self.log(f"launching: {' '.join(command.argv)}")
        try:
            self.proc = subprocess.Popen(
                self.in_own_view(command.argv, python),
                cwd=self.layout.code,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if command.mpirun_output else subprocess.STDOUT,
                text=True,
                encoding="utf-8",
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            return self.finish(EXIT_INFRA, f"cannot start {command.argv[0]}: {exc}", None)
        self.say(
            "launched", pid=self.proc.pid, startup={k: round(v, 3) for k, v in startup.items()}
        )
        code = self.follow_launcher(mpirun_output=command.mpirun_output)
        if code == 0 and self.notice is None:
            return self.succeed()
        if self.notice is not None or self.preempted_at is not None:
            return self.finish(EXIT_PREEMPTED, f"preempted: {self.notice or 'peer notice'}", None)
        reason, detail = self.failure_reason(code)
        return self.finish(code, reason, detail)

    def follow_launcher(self, *, mpirun_output: bool) -> int:
        """The launcher's exit code, its output forwarded by a thread at the agent's lower
        priority (the launcher, already started, keeps its own). The job's end is the
        launcher's exit, not the end of its output: a process the script left behind may
        hold the pipe."""
        assert self.proc is not None
        read = functools.partial(self.read_output, mpirun=mpirun_output)
        reader = threading.Thread(target=yielding(read), name="output", daemon=True)
        reader.start()
        code = self.proc.wait()
        reader.join(timeout=STRAY_OUTPUT_SECONDS)
        self.end_strays()
        # Nothing of the node holds the pipe now: what is left is a backlog to drain (the
        # reader runs at a lower priority), bounded in case a holder is outside the node.
        reader.join(timeout=OUTPUT_DRAIN_SECONDS)
        if reader.is_alive():  # a holder outside this node's tree: the result goes first
            self.log("the output is still held open from outside the node; not waiting for it")
        for rank, started in sorted(self.started_lines.items(), key=lambda i: str(i[0])):
            self.keep_line(rank, started)
        for line in self.noise.flush():
            self.keep_line(None, line)
        return code

    def read_output(self, mpirun: bool = False) -> None:
        """Forward the launcher's output (`mpirun`: its processes' on stdout, tagged, and its
        own reports on stderr, read here in a thread of their own; see NodeCommand)."""
        assert self.proc is not None and self.proc.stdout is not None
        reports = None
        if self.proc.stderr is not None:
            reports = threading.Thread(
                target=self.read_reports, args=(self.proc.stderr,), name="reports", daemon=True
            )
            reports.start()
        pieces = RankedLines(mpirun=mpirun)
        for raw in self.proc.stdout:
            for rank, text in pieces.feed(raw.rstrip("\n")):
                with self.forwarding:
                    self.forward(rank, text)
        with self.forwarding:
            for rank, text in pieces.flush():
                self.forward(rank, text)
        if reports is not None:
            reports.join()  # (its pipe ends with the launcher, as stdout did)

    def read_reports(self, stream: Any) -> None:
        for raw in stream:
            with self.forwarding:
                self.forward(None, raw.rstrip("\n"))

    def end_strays(self) -> None:
        """End what the script left running once its launcher has exited (a daemon, a
        `setsid` child with an empty environment, a child that kept the output pipe): as
        the node's subreaper every one of them is still a descendant of this agent."""
        from trainctl.procs import end_descendants

        ended = end_descendants(os.getpid(), grace=STRAY_GRACE_SECONDS)
        if ended:
            names = ", ".join(f"{name} (pid {pid})" for pid, name in ended[:5])
            more = f" and {len(ended) - 5} more" if len(ended) > 5 else ""
            self.log(f"ended {len(ended)} process(es) the script left running: {names}{more}")

    def forward(self, rank: int | None, text: str) -> None:
        """One line of a worker's output (`rank`: which of several processes, if known):
        its control message to the controller, its text to the log."""
        started, msg = split_control(self.started_lines.pop(rank, "") + text)
        if msg is None:
            self.keep_line(rank, started)
            return
        if started:  # a line of the script's that the message cut in two
            self.started_lines[rank] = started
        self.status.observe(msg)  # the script's progress messages: for the controller only
        if msg.get("event") == "preempted":
            self.preempted_at = int(msg.get("step", 0))
        if msg.get("event") in ("checkpoint", "preempted") and self.sync is not None:
            # (Not the working directory's sync: a script that says it checkpointed keeps its
            # state in the checkpoint dir, and a pass at that moment slowed the upload that
            # matters then: steps lost after a kill went up in the bit-exact trials.)
            self.sync.wake()
        console(CONTROL_PREFIX + json.dumps({**msg, "rank": self.rank}) + "\n")

    def keep_line(self, rank: int | None, text: str) -> None:
        """A line for the node log; torchrun's own noise is dropped once the node is being
        stopped on purpose (see LauncherNoise)."""
        kept = self.noise.feed(text, self.stopping) if rank is None else [text]
        for line in kept:
            self.tail.append(self.redactor.text(line))
            self.logs.write(ranked_line(rank, line))

    def stopped_why(self) -> str:
        """Why the controller stopped this node (a lost peer, the user...), as it said."""
        try:
            why = json.loads(self.store.get_text(self.jobs.keys.stopping(self.attempt)))["why"]
        except Exception:  # not said (a stop from elsewhere): the job's stop request, if any
            try:
                why = self.jobs.stop_requested()
            except Exception:
                why = None
        why = str(why or "the controller stopped the job")
        return why if why.startswith("stopped") else f"stopped: {why}"

    def failure_reason(self, code: int) -> tuple[str, str | None]:
        if self.stopping:
            return self.stopped_why(), None
        if self.layout.failure.is_file():
            text = self.layout.failure.read_text(errors="replace").strip()
            if text:
                return text.splitlines()[-1][:500], text[-4000:]
        reason, detail = failure_from_output(list(self.tail))
        return (reason or exit_text(code)), detail

    def succeed(self) -> int:
        if self.rank == 0:
            self.say("uploading")
            try:
                self.upload_outputs()
            except Exception as exc:
                return self.finish(EXIT_INFRA, f"uploading outputs failed: {exc}", None)
        return self.finish(0, None, None)

    def upload_outputs(self) -> None:
        from trainctl.record.locations import output_store

        out = self.outputs or output_store(self.record, pinned=True)
        if self.spec.disable_output_compression:  # SageMaker's: the files as they are
            for prefix, local in (("model", self.layout.model), ("data", self.layout.output_data)):
                files = sorted(p for p in local.rglob("*") if p.is_file() and not p.is_symlink())
                out.put_files([(f"{prefix}/{p.relative_to(local).as_posix()}", p) for p in files])
                if files:
                    self.log(f"{prefix}: {len(files)} file(s) at {out.url(prefix + '/')}")
            return
        with tempfile.TemporaryDirectory(prefix="trainctl-out-") as tmp:
            model = Path(tmp) / "model.tar.gz"
            if pack_directory(self.layout.model, model, self.log):
                out.put_file("model.tar.gz", model)
                self.log(f"model: {out.url('model.tar.gz')}")
            data = Path(tmp) / "output.tar.gz"
            if pack_directory(self.layout.output_data, data, self.log):
                out.put_file("output.tar.gz", data)
                self.log(f"output data: {out.url('output.tar.gz')}")

    def finish(
        self, code: int, reason: str | None, detail: str | None, *, unhealthy: bool = False
    ) -> int:
        """End the node with `code`; `unhealthy`: its machine failed a health check (the
        controller replaces the node instead of failing the job)."""
        reason = None if reason is None else self.redactor.text(reason)
        detail = None if detail is None else self.redactor.text(detail)
        self.write_status()  # the last progress, before the result says the node is done
        self.finished = True
        self.end_remote_starts()
        if self.sync is not None:
            try:  # the emergency checkpoint, or the last periodic one, goes up before we go
                self.sync.close(trained=code == 0)
            except Exception as exc:
                self.log(f"final checkpoint upload failed: {exc}")
        if self.workdir is not None:
            try:  # on success the model and output data go up packed, not copied again
                # (Its own end: exit 0, or an emergency save after a notice; not a kill.)
                self.workdir.close(outputs=code != 0, ended_cleanly=code in (0, EXIT_PREEMPTED))
            except Exception as exc:
                self.log(f"final working directory upload failed: {exc}")
        if self.tensorboard is not None:
            try:
                self.tensorboard.close()
            except Exception as exc:
                self.log(f"final TensorBoard log upload failed: {exc}")
        if reason and self.stopping and code != EXIT_PREEMPTED:
            self.log(reason)  # "stopped: algo-2 was lost", "stopped by the user"
        elif reason:
            verb = "ended" if code == EXIT_PREEMPTED else "failed"
            self.log(f"node {verb}: {reason}")
        result = {
            "rank": self.rank,
            "exit_code": code,
            "reason": reason,
            "detail": detail,
            "stopped": self.stopping,
            "preempted": code == EXIT_PREEMPTED,
            "notice": self.notice,
            "unhealthy": unhealthy,
        }
        if self.ranks_dir is not None:  # the process groups its ranks formed (node.ranks)
            from trainctl.node.ranks import groups

            found = groups(self.ranks_dir)
            result["groups"] = {"ranks": found.ranks, "largest": found.largest, "used": found.used}
        # The log's last lines go up before the result: whoever reads the result from the
        # store (a controller that took over) then has the whole log.
        self.logs.close()
        try:
            self.store.put_text(
                self.jobs.keys.node_result(self.attempt, self.rank), json.dumps(result)
            )
        except Exception as exc:
            sys.stderr.write(f"[trainctl] could not record the node result: {exc}\n")
        emit("result", **result)
        return code


def exit_text(code: int) -> str:
    """`exit code 3`; a process a signal ended (Popen's negative code): `killed by SIGKILL`;
    a shell's or torchrun's 128+N stays as given, as the user's tools print it."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainctl-agent")
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        agent = Agent(args.store, args.job, args.attempt, args.rank)
    except Exception as exc:
        # A store this node cannot reach (no credentials from the instance yet, a network
        # fault) is the machine's failure, not the user's: the controller relaunches, as for
        # a node that fails its health check (and gives up after a few such attempts in a
        # row). A missing record (the job was removed) or a bad one is no such thing.
        unreachable = isinstance(exc, StoreError) and not isinstance(exc, NotFoundError)
        emit(
            "result",
            rank=args.rank,
            exit_code=EXIT_INFRA,
            reason=f"agent start failed: {exc}",
            unhealthy=unreachable,
        )
        return EXIT_INFRA
    code = agent.run()
    if agent.orphaned and agent.settings.poweroff_when_orphaned:
        power_off(agent.log)
    return code


def power_off(log: Callable[[str], None]) -> None:
    """Halt the machine: an orphaned cloud node stops billing (EC2 instances are launched
    with InstanceInitiatedShutdownBehavior=terminate, so a halt terminates them)."""
    command = ["shutdown", "-h", "now"]
    if os.geteuid() != 0:
        command = ["sudo", "-n", *command]
    log(f"powering off this node: {' '.join(command)}")
    try:
        subprocess.run(command, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"could not power off: {exc}")


if __name__ == "__main__":
    sys.exit(main())
