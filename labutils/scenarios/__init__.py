"""The scenario registry: for every cause, a broken and a fixed training script, and how to run them.

Each :class:`Scenario` names its cause id (the one the diagnosis must give the broken script), the two
scripts (files in this folder; ordinary programs that ``python script.py`` runs), the notebook that
teaches it, the run limits of each version, and the knobs it accepts: the run options a learner may
change in the lab without changing what the scenario demonstrates. Nothing in a script tells the
diagnosis what to find. A new cause is one catalogue entry (:mod:`labutils.diagnosis.causes`) plus two scripts
and one entry here.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, make_dataclass, replace

from ..kit.budget import sized_budget
from ..runner.spec import option

__all__ = ["KNOBS", "LAUNCH_SCENARIOS", "LOADER_KNOBS", "RunOptions", "SCENARIOS", "SCENARIO_DIR", "SCENARIO_OPTIONS",
           "Scenario", "get_scenario"]

SCENARIO_DIR = os.path.dirname(os.path.abspath(__file__))

#: The run options a scenario may accept as knobs (the names of :class:`RunOptions`).
KNOBS = ("start_method", "timeout", "stall", "memory_budget", "shm_size", "nofile")
#: Knobs on the DataLoader itself. Each reaches the script as an environment variable ``LAB_<NAME>``
#: (``LAB_NUM_WORKERS=4``; booleans "1"/"0"); the script reads it with its lesson's own value as the
#: default, so ``python script.py`` is unchanged. A scenario lists one only when both scripts read it.
LOADER_KNOBS = ("num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers",
                "sharing_strategy")
KNOBS = KNOBS + LOADER_KNOBS


#: The run limits a scenario sets: rows of the run options' one table (:data:`labutils.runner.spec.OPTIONS`),
#: which gives each its type and default; :class:`RunOptions` has one field per name, in this order.
SCENARIO_OPTIONS = ("timeout", "memory_budget", "shm_size", "nofile", "start_method", "notebook_main", "stall",
                    "max_processes")
#: Where ``python -m labutils diagnose`` names an option otherwise than the table's flag.
_DIAGNOSE_FLAGS = {"notebook_main": "--stdin-main"}


class _RunOptionsMethods:
    """The :func:`labutils.run_isolated` limits of one run (the same names as the diagnose options)."""

    def kwargs(self) -> dict:
        """Keyword arguments for :func:`labutils.run_isolated` (an option left at an unset default is left out)."""
        return {name: value for name, value in asdict(self).items()
                if not (value is None and option(name).default is None)}

    def cli_args(self) -> list:
        """The same limits as ``python -m labutils diagnose`` options."""
        args = []
        for name in SCENARIO_OPTIONS:
            row, value = option(name), getattr(self, name)
            flag = _DIAGNOSE_FLAGS.get(name, row.flag)
            if row.parse is bool:
                args += [flag] if value else []
            elif value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return args


RunOptions = make_dataclass(
    "RunOptions", [(name, option(name).type, field(default=option(name).default)) for name in SCENARIO_OPTIONS],
    bases=(_RunOptionsMethods,), frozen=True)
RunOptions.__doc__, RunOptions.__module__ = _RunOptionsMethods.__doc__, __name__


@dataclass(frozen=True)
class Scenario:
    """One cause, demonstrated by a broken script and a fixed one (file names in this folder)."""

    id: str
    title: str
    broken: str
    fixed: str
    expected: str
    notebook: str
    broken_options: RunOptions = field(default_factory=RunOptions)
    fixed_options: RunOptions = field(default_factory=RunOptions)
    note: str = ""
    knobs: tuple = ("start_method", "timeout")
    #: the role of the process whose failure decides the cause ("main", "child", "worker"), where the scenario
    #: is about which process failed (the launcher scenarios); "" where any is right
    failing: str = ""
    #: where not 0: the memory budgets were sized on torch's CPU wheel for a run with this many workers, and
    #: :meth:`options` adds what this build's ``import torch`` costs beyond it per process that imports
    #: torch itself (:func:`labutils.kit.budget.sized_budget`, for the run's start method)
    budget_workers: int = 0
    #: where not "": the diagnosis is known to name another cause for the broken script (the gap, in a few
    #: words, and where it is written up); the tests expect the failure, strictly, until the gap is closed
    gap: str = ""

    def path(self, which: str) -> str:
        """Absolute path of the ``"broken"`` or ``"fixed"`` script."""
        return os.path.join(SCENARIO_DIR, getattr(self, _which(which)))

    def options(self, which: str) -> RunOptions:
        """The run limits of one version; a budget sized on the CPU wheel comes sized for this build."""
        opts = self.broken_options if _which(which) == "broken" else self.fixed_options
        if self.budget_workers and opts.memory_budget:
            opts = replace(opts, memory_budget=sized_budget(opts.memory_budget, opts.start_method,
                                                            self.budget_workers))
        return opts


def _which(which: str) -> str:
    if which not in ("broken", "fixed"):
        raise ValueError(f"which={which!r}: use 'broken' or 'fixed'")
    return which


def _pair(sid: str, title: str, expected: str, notebook: str, options: RunOptions = RunOptions(),
          **more) -> Scenario:
    """A scenario of the scripts ``<id>_broken.py`` and ``<id>_fixed.py``, both run with ``options`` unless
    ``fixed_options`` is given."""
    return Scenario(sid, title, f"{sid}_broken.py", f"{sid}_fixed.py", expected, notebook, options,
                    more.pop("fixed_options", options), **more)


_SPAWN = RunOptions(timeout=90, start_method="spawn")
_FIXED_METHOD = ("timeout",)  # the lesson belongs to one start method: the script or the run pins it
_LIBS = "13_libraries_you_load_with"
SCENARIOS: dict = {s.id: s for s in [
    Scenario("ok", "A healthy loop: 2 workers, a linear model", "ok_healthy.py", "ok_healthy.py", "ok",
             "01_read_the_error", knobs=("start_method", "timeout") + LOADER_KNOBS),
    _pair("worker_exception", "A mislabelled row raises KeyError in __getitem__", "worker_exception",
          "01_read_the_error", knobs=("start_method", "timeout", "num_workers", "batch_size")),
    _pair("unpicklable_dataset", "spawn: the dataset holds an open file handle", "unpicklable_dataset",
          "02_spawn_and_pickling", _SPAWN, knobs=_FIXED_METHOD),
    _pair("main_not_importable", "spawn from a notebook-like __main__: workers cannot find the class",
          "main_not_importable", "08_main_module_and_guard",
          RunOptions(timeout=90, start_method="spawn", notebook_main=True), knobs=_FIXED_METHOD),
    _pair("missing_main_guard", "spawn: a script without `if __name__ == \"__main__\":`", "missing_main_guard",
          "08_main_module_and_guard", _SPAWN, knobs=_FIXED_METHOD),
    _pair("native_crash", "A segfault in a 'C decoder' (ctypes null read, a stand-in) on a truncated record",
          "native_crash", "03_corrupt_data"),
    _pair("oom_killed", "An unbounded cache in each persistent worker under an 800 MB memory budget",
          "oom_killed", "04_memory_and_oom", RunOptions(timeout=90, memory_budget="800M"),
          note="the run's memory limit kills over budget, as the kernel OOM killer would; each worker "
               "caches what it has read (400 MiB of images in all), so the total grows with num_workers; "
               "on a torch build whose import costs more than the CPU wheel's (CUDA), the budget grows by "
               "the difference for each process that imports torch",
          budget_workers=2,
          knobs=("start_method", "timeout", "memory_budget", "num_workers", "batch_size",
                 "persistent_workers")),
    _pair("shm_exhausted", "12 MiB float batches through an 8 MiB /dev/shm", "shm_exhausted", "05_shared_memory",
          RunOptions(timeout=90, shm_size="8M"),
          note="needs a private mount namespace; reported unsupported where the OS refuses",
          knobs=("start_method", "timeout", "shm_size", "num_workers", "batch_size", "prefetch_factor")),
    _pair("fd_limit", "Keeping every batch alive with RLIMIT_NOFILE=128", "fd_limit", "06_file_descriptors",
          RunOptions(timeout=60, nofile=128),
          knobs=("start_method", "timeout", "nofile", "num_workers", "batch_size", "sharing_strategy")),
    _pair("worker_exit", "A helper calls sys.exit(2) inside a worker on a missing file", "worker_exit",
          "01_read_the_error"),
    _pair("timeout", "A lock held by a thread at fork time; DataLoader(timeout=2)", "timeout",
          "07_hangs_and_timeouts", RunOptions(timeout=60), knobs=_FIXED_METHOD),
    _pair("hang", "A lock held by a thread at fork time; no timeout, the runner's stall limit stops it", "hang",
          "07_hangs_and_timeouts", RunOptions(timeout=90, stall=6), fixed_options=RunOptions(timeout=90),
          knobs=("timeout", "stall"),
          note="stopped by progress: no batch for 6 s while the workers are alive (the script pins fork, "
               "whose workers start at once; spawn and forkserver workers take seconds to start on a loaded "
               "machine: a stall limit must be longer than that)"),
    _pair("cuda_in_worker", "`.cuda()` in __getitem__ (CPU-only build here: no CUDA at all)", "cuda_in_worker",
          "02_spawn_and_pickling",
          note="on a GPU machine the same script fails with 'Cannot re-initialize CUDA in forked subprocess'"),
    _pair("outside_loader", "The loader works; the model's input size is wrong (a shape error in the loop)",
          "outside_loader", "01_read_the_error",
          note="the diagnosis must not blame the DataLoader for an error in the model"),
    _pair("fork_refused", "16 workers under a limit of 12 processes: the kernel refuses a fork", "fork_refused",
          "06_file_descriptors", RunOptions(timeout=60, max_processes=12), knobs=_FIXED_METHOD,
          note="needs a pids cgroup the lab may create (root) or RLIMIT_NPROC (other users); reported "
               "unsupported elsewhere; the scripts pin fork (forkserver's server is refused first)"),
    # The libraries you load with (notebook 13): the same causes, met through a library's own behaviour
    _pair("lmdb_fork", "LMDB: an Environment opened in __init__ and read by forked workers", "worker_exception",
          _LIBS, knobs=_FIXED_METHOD,
          note="every transaction a forked worker begins takes a new reader slot; lmdb raises "
               "MDB_READERS_FULL after about a hundred samples (lmdb 3.0); under spawn the same dataset "
               "cannot be pickled"),
    _pair("h5py_spawn", "h5py: a File opened in __init__, sent to spawn workers", "unpicklable_dataset", _LIBS,
          _SPAWN, knobs=_FIXED_METHOD),
    _pair("polars_fork", "polars: its thread pool ran before the workers were forked", "hang", _LIBS,
          RunOptions(timeout=90, stall=8), fixed_options=RunOptions(timeout=90), knobs=("timeout", "stall"),
          note="a forked worker's first polars call waits for pool threads that fork did not copy (polars "
               "2.1: 5 of 5 runs); the fixed script starts its workers with spawn"),
    _pair("numba_fork", "numba: a parallel kernel on GNU OpenMP ran before the workers were forked",
          "native_crash", _LIBS, knobs=_FIXED_METHOD,
          note="numba itself ends the worker ('Terminating: fork() called from a process already using "
               "GNU OpenMP, this is unsafe.') with SIGTERM: a library's own signal, from inside"),
    _pair("mmap_truncated", "A memory-mapped data file cut short while workers read it", "native_crash", _LIBS,
          note="the worker dies of SIGBUS and PyTorch's message blames shared memory, while /dev/shm is "
               "untouched: the file shrank under the mapping"),
    _pair("imagefolder_corrupt", "An ImageFolder-style tree with files cut short, decoded with Pillow",
          "worker_exception", _LIBS, knobs=("start_method", "timeout")),
]}


#: Where the loader runs below the script, or which kind of task the kernel refuses: the cause must be
#: named for the process that failed, wherever it is in the tree. Not one per cause (the registry above is).
LAUNCH_SCENARIOS: dict = {s.id: s for s in [
    _pair("tree_mp_spawn", "torch.multiprocessing.spawn: a rank's worker segfaults on a truncated record",
          "native_crash", "03_corrupt_data", _SPAWN, knobs=("timeout",), failing="child",
          note="the rank is a spawn child of the script; its workers are grandchildren"),
    _pair("tree_mp_process", "multiprocessing.Process(target=train): a worker raises; the launcher exits 1",
          "worker_exception", "01_read_the_error", failing="child"),
    _pair("tree_pool", "a ProcessPoolExecutor job builds a loader; a worker segfaults", "native_crash",
          "03_corrupt_data", failing="child",
          note="the job's error reaches the script through concurrent.futures' _RemoteTraceback"),
    _pair("tree_exit0", "the launcher exits 0 after its trainer child failed in the loader", "worker_exception",
          "01_read_the_error", failing="child",
          note="the run's own outcome is ok: only the child's traceback and exit code tell"),
    _pair("thread_refused", "8 read threads per worker under a limit of 18 tasks: a thread is refused",
          "fork_refused", "06_file_descriptors", RunOptions(timeout=60, max_processes=18), knobs=("timeout",),
          note="the forks fit and a thread does not (a worker's queue feeder, or a read thread of the "
               "Dataset: a race which one); needs a pids cgroup or RLIMIT_NPROC"),
]}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name] if name in SCENARIOS else LAUNCH_SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; choose one of: "
                       f"{', '.join([*SCENARIOS, *LAUNCH_SCENARIOS])}") from None
