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
  size, in <pid>.groups (whether a multi-node job's ranks ever trained together).

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


def _wrap_init(c10d, directory):
    import functools

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


class _AfterC10d:
    """A meta-path finder that lets torch.distributed.distributed_c10d load as usual, then
    wraps its init_process_group before anything imports the name (torch.distributed's
    own `from .distributed_c10d import *` comes after)."""

    def __init__(self, directory):
        self.directory = directory

    def find_spec(self, name, path=None, target=None):
        if name != C10D:
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
        directory = self.directory

        def exec_module(module):
            execute(module)
            try:
                _wrap_init(module, directory)
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
    if C10D in sys.modules:
        _wrap_init(sys.modules[C10D], directory)
    else:
        sys.meta_path.insert(0, _AfterC10d(directory))


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
    _run_shadowed()


_main()
