"""trainctl's hook in a job's worker processes: what the node agent cannot see from outside.

The agent puts this directory first on PYTHONPATH of the command it launches, so Python
imports this module at start-up in every process of the job (the way ddtrace-run and
opentelemetry-instrument reach unchanged programs); the `sitecustomize` it shadows, if any
(Debian's, a venv's), is run right after. In a process that is one of the job's ranks (it has
torchrun's or the plain launcher's LOCAL_RANK, or Open MPI's rank) and only there, it:

- registers the process in $TRAINCTL_RANKS_DIR/<pid>.json (rank, parent, command line);
- has faulthandler write every thread's Python stack to <pid>.stacks when the agent sends
  STACK_SIGNAL (a hung attempt's stacks, taken before it is stopped; nothing is stopped
  by the signal itself);
- notes each process group `torch.distributed.init_process_group` forms, with its world
  size, in <pid>.groups, and the first time the process trains through one (a
  DistributedDataParallel made, or a tensor collective: all_reduce, all_gather,
  reduce_scatter, broadcast...; not a barrier) (whether a multi-node job's ranks ever
  trained together: a Hugging Face Trainer on CPU without use_cpu forms the group and
  then trains each rank alone, only ever calling barrier);
- writes <pid>.stepped at its first optimizer step (a global step hook installed as
  torch.optim.optimizer loads): when training began, for a script that reports no steps
  (a fault aimed N s after the first step, the start-up's stages).

With TRAINCTL_PROFILE=START:COUNT (the job's `profile`), a rank also runs torch's profiler
over its optimizer steps START to START+COUNT-1 (counted by a global optimizer step hook,
installed as torch.optim.optimizer loads: the script is not changed), and writes the trace
under $TRAINCTL_TENSORBOARD_DIR/profiler/ with TensorBoard's trace handler.

In every process it also lets SageMaker's `smdistributed.dataparallel` and
`sagemaker_training` import from compat/ where they are not installed (last on
sys.meta_path: an installed one, a SageMaker image's, is always found first).

Standard library only, nothing imported eagerly but what Python has loaded already, and
nothing here may ever raise into the user's program.
"""

import os
import sys

# A real-time signal nothing in the PyTorch stack uses (SIGUSR1 is Lightning's for SLURM).
STACK_SIGNAL_OFFSET = 6
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
C10D = "torch.distributed.distributed_c10d"
DDP_MODULE = "torch.nn.parallel.distributed"
# What trains through a process group (FSDP and DeepSpeed reach these too); a barrier or an
# object collective only keeps ranks in step.
TENSOR_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single",
    "gather", "scatter",
)  # fmt: skip
_used = []  # [True] once this process trained through a group (noted once)


def _rank():
    """This process's global rank if it is one of the job's ranks, else None."""
    if "LOCAL_RANK" not in os.environ and not any(v in os.environ for v in RANK_VARIABLES[1:]):
        return None
    for variable in RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return None


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _note_group(c10d, directory):
    import json

    record = {
        "world_size": c10d.get_world_size(),
        "rank": c10d.get_rank(),
        "backend": str(c10d.get_backend()),
    }
    with open(os.path.join(directory, f"{os.getpid()}.groups"), "a") as f:
        f.write(json.dumps(record) + "\n")


def _note_used(directory):
    if _used:
        return
    _used.append(True)
    try:
        with open(os.path.join(directory, f"{os.getpid()}.groups"), "a") as f:
            f.write('{"used": true}\n')
    except Exception:
        pass


def _wrap_used(owner, name, directory):
    """`owner.name` notes, on its first call, that this process trains through a group."""
    import functools

    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        if not _used:
            _note_used(directory)
        return original(*args, **kwargs)

    setattr(owner, name, wrapped)


def _wrap_init(c10d, directory):
    import functools

    for name in TENSOR_COLLECTIVES:  # (before torch.distributed imports their names)
        _wrap_used(c10d, name, directory)

    original = c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            _note_group(c10d, directory)
        except Exception:
            pass
        return result

    c10d.init_process_group = init_process_group


class _AfterImport:
    """A meta-path finder that lets module `name` load as usual, then calls `then(module)`
    before anything imports names from it (torch.distributed's own `from .distributed_c10d
    import *` comes after the wrap of init_process_group)."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = spec and spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        then = self.then

        def exec_module(module):
            execute(module)
            try:
                then(module)
            except Exception:
                pass

        loader.exec_module = exec_module
        return spec


def _install(directory):
    import faulthandler
    import json
    import signal

    pid = os.getpid()
    stacks = open(os.path.join(directory, f"{pid}.stacks"), "w")  # noqa: SIM115 (kept open)
    faulthandler.register(
        signal.SIGRTMIN + STACK_SIGNAL_OFFSET, file=stacks, all_threads=True, chain=False
    )
    globals()["_stacks_file"] = stacks  # faulthandler keeps the fd, not the file object
    registration = {
        "pid": pid,
        "ppid": os.getppid(),
        "rank": _rank(),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "argv": list(getattr(sys, "orig_argv", sys.argv))[:16],
    }
    _write(os.path.join(directory, f"{pid}.json.tmp"), json.dumps(registration))
    os.replace(os.path.join(directory, f"{pid}.json.tmp"), os.path.join(directory, f"{pid}.json"))
    _after_import(C10D, lambda module: _wrap_init(module, directory))
    _after_import(
        DDP_MODULE,
        lambda module: _wrap_used(module.DistributedDataParallel, "__init__", directory),
    )
    _after_import(OPTIMIZER, lambda module: _note_first_step(module, directory))


def _after_import(name, then):
    """`then(module)` once module `name` is loaded (at once if it is)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


OPTIMIZER = "torch.optim.optimizer"


def _note_first_step(optimizer_module, directory):
    """<pid>.stepped once any optimizer of the process first steps. The hook stays (torch
    iterates its hooks as it calls them: one cannot remove itself) and returns at once."""
    stepped = []

    def after_step(optimizer, args, kwargs):
        if stepped:
            return
        stepped.append(True)
        try:
            _write(os.path.join(directory, f"{os.getpid()}.stepped"), "")
        except Exception:
            pass

    optimizer_module.register_optimizer_step_post_hook(after_step)


def _profile_steps(optimizer_module, start, count, directory, rank):
    """Profile `count` optimizer steps after the first `start` (steps start..start+count-1,
    counted from 0) of the first optimizer that steps."""
    import atexit

    import torch

    state = {"owner": None, "steps": 0, "profiler": None}

    def stop():
        profiler, state["profiler"] = state["profiler"], None
        if profiler is not None:
            profiler.__exit__(None, None, None)  # the trace handler writes the trace

    def begin():
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        handler = torch.profiler.tensorboard_trace_handler(
            os.path.join(directory, "profiler"), worker_name=f"rank{rank}"
        )
        profiler = torch.profiler.profile(activities=activities, on_trace_ready=handler)
        profiler.__enter__()
        state["profiler"] = profiler

    def after_step(optimizer, args, kwargs):
        if state["owner"] is None:
            state["owner"] = id(optimizer)
        if id(optimizer) != state["owner"]:
            return
        state["steps"] += 1
        if state["steps"] == start:
            begin()
        elif state["steps"] == start + count:
            stop()

    optimizer_module.register_optimizer_step_post_hook(after_step)
    if start == 0:
        begin()  # from the first step on (and what comes before it)
    atexit.register(stop)  # a script that ends within the window still leaves its trace


def _install_profiler():
    value = os.environ.get("TRAINCTL_PROFILE", "")
    directory = os.environ.get("TRAINCTL_TENSORBOARD_DIR", "")
    start, _, count = value.partition(":")
    rank = _rank()
    if not (start.isdigit() and count.isdigit() and directory) or rank is None:
        return
    _after_import(
        OPTIMIZER,
        lambda module: _profile_steps(module, int(start), int(count), directory, rank),
    )


def _run_shadowed():
    """The sitecustomize this one hides on sys.path (Debian's, say), as site would run it."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                sys.stderr.write(
                    "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                    f"{type(exc).__name__}: {exc}\n"
                )
        return


# SageMaker's packages that scripts import and that compat/ stands in for.
COMPAT_PACKAGES = ("smdistributed", "sagemaker_training")


class _CompatFallback:
    """A meta-path finder, last: the stand-ins of COMPAT_PACKAGES, for a name no other
    finder found (their submodules then load from the stand-in's own __path__)."""

    def find_spec(self, name, path=None, target=None):
        if name not in COMPAT_PACKAGES:
            return None
        import importlib.machinery

        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat")
        return importlib.machinery.PathFinder.find_spec(name, [here])


def _main():
    try:
        sys.meta_path.append(_CompatFallback())
    except Exception:
        pass
    directory = os.environ.get("TRAINCTL_RANKS_DIR")
    if directory and _rank() is not None and os.path.isdir(directory):
        try:
            _install(directory)
        except Exception:
            pass
    if os.environ.get("TRAINCTL_PROFILE"):
        try:
            _install_profiler()
        except Exception:
            pass
    _run_shadowed()


_main()
