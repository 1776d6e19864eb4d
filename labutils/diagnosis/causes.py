"""The cause catalogue: every cause id the diagnosis can name (``diagnose --json`` prints it), with its summary,
fixes and their notebooks, the messages a learner sees for it (the cheat sheet's source) and variants. A new
cause is one entry here plus a broken and a fixed script in ``labutils/scenarios/``. Nothing here imports torch
or reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["CATALOGUE", "CAUSES", "ECHOES", "LOADER_CAUSES", "NOTEBOOKS", "PRECEDENCE", "UNKNOWN", "UNSUPPORTED",
           "Cause", "Fix", "cheatsheet_rows", "fixes_for"]

#: Notebook stems by their two-digit number.
NOTEBOOKS = {
    "01": "01_read_the_error", "02": "02_spawn_and_pickling", "03": "03_corrupt_data",
    "04": "04_memory_and_oom", "04b": "04b_copy_on_read", "05": "05_shared_memory", "06": "06_file_descriptors",
    "07": "07_hangs_and_timeouts", "08": "08_main_module_and_guard", "09": "09_interactive_lab",
    "10": "10_production_loader", "10b": "10b_recommended_loader", "11": "11_cuda_and_accelerators",
    "12": "12_distributed_torchrun", "13": "13_libraries_you_load_with",
}

#: Outside the vocabulary: the run could not start here / it failed and nothing says where.
UNSUPPORTED = "unsupported"
UNKNOWN = "unknown"


@dataclass
class Fix:
    """One way out, and the notebook (stem, e.g. ``04_memory_and_oom``) that demonstrates it."""

    text: str
    notebook: str

    @property
    def path(self) -> str:
        return f"notebooks/{self.notebook}.ipynb"

    def __str__(self) -> str:
        return f"{self.text}  [{self.path}]"


@dataclass(frozen=True)
class Cause:
    """One entry of the catalogue: ``fixes`` (and a variant's) are ``(text, notebook number)``; a variant is
    another summary, fixes or short fix of the same id, where the evidence differs."""

    id: str
    title: str
    summary: str
    notebook: str
    fixes: tuple = ()
    messages: tuple = ()  # each a text, or (text, variant name)
    variants: dict = field(default_factory=dict)  # name -> {"summary": str, "fixes": tuple, "short": str}
    short: str = ""  # the handout's first fix: under 15 words, PyTorch and Python alone

    def message_rows(self) -> list:
        """``[(text, variant or None)]`` for every message of the cause."""
        return [(m, None) if isinstance(m, str) else (m[0], m[1]) for m in self.messages]

    def short_for(self, variant: Optional[str] = None) -> str:
        return (self.variants.get(variant) or {}).get("short") or self.short

    def fix_list(self, variant: Optional[str] = None) -> list:
        fixes = self.fixes
        if variant and variant in self.variants and "fixes" in self.variants[variant]:
            fixes = self.variants[variant]["fixes"]
        return [Fix(text, NOTEBOOKS[nb]) for text, nb in fixes]

    def summary_for(self, variant: Optional[str] = None) -> str:
        if variant and variant in self.variants and "summary" in self.variants[variant]:
            return self.variants[variant]["summary"]
        return self.summary


#: who else sends SIGKILL, besides the kernel's OOM killer
OTHER_SIGKILL_SENDERS = ("a `kill -9` by a person or a script, a scheduler's preemption (SLURM, Kubernetes), "
                      "`timeout -s KILL`, systemd stopping a service")

_ENTRIES = [
    Cause("ok", "the loader finished", "the loader finished; no worker failed", "01_read_the_error"),
    Cause(
        "worker_exception",
        "Python exception in `__getitem__`/collate, re-raised as \"Caught X in DataLoader worker process N\"",
        "a Python exception in the Dataset/collate_fn", "01_read_the_error",
        fixes=(
            ("Read the inner exception after 'Original Traceback' (it names the file and line in your "
             "Dataset or collate_fn); rerun with num_workers=0 to debug it in-process", "01"),
            ("If some samples are bad, skip and record them (labutils.kit.fixes.QuarantineDataset + "
             "collate_skip) instead of returning zeros or letting one file stop the epoch", "03"),
        ),
        messages=("Caught ValueError in DataLoader worker process 0.",),
        short="Read the inner traceback after 'Original Traceback'; rerun with `num_workers=0`",
    ),
    Cause(
        "unpicklable_dataset",
        "dataset / collate_fn / worker_init_fn cannot be pickled for spawn or forkserver",
        "the dataset (or collate_fn/worker_init_fn) cannot be pickled to start a spawn/forkserver worker",
        "02_spawn_and_pickling",
        fixes=(
            ("Find the attribute that cannot be pickled: try pickle.dumps on each value of vars(dataset) "
             "(the lab's helper: labutils.find_unpicklable(dataset))", "02"),
            ("Open files, connections and locks lazily in each worker (labutils.kit.fixes.LazyFile / "
             "PerWorkerResource), not in __init__; keep collate_fn/worker_init_fn module-level functions, "
             "not lambdas or local functions", "02"),
            ("On Linux, multiprocessing_context='fork' avoids pickling (fork is unsafe with threads and "
             "CUDA)", "02"),
        ),
        messages=("TypeError: cannot pickle '_io.TextIOWrapper' object",
                  "UserWarning: Got pickle error when attempting to start a worker Process"),
        short="Open files, connections and locks in each worker, not in `__init__`; no lambdas",
    ),
    Cause(
        "main_not_importable",
        "spawn/forkserver child cannot find a class defined in `__main__` (notebook, stdin, `-c`)",
        "spawn/forkserver workers could not import a class defined in __main__ (notebook, stdin or "
        "python -c)", "08_main_module_and_guard",
        fixes=(
            ("Move the Dataset class (and collate_fn, worker_init_fn) into a .py module and import it: "
             "spawn/forkserver workers import classes by name and a notebook's __main__ has no file", "08"),
            ("Run the training code as a script file (python train.py), not pasted into python -c or "
             "stdin", "08"),
            ("On Linux, multiprocessing_context='fork' needs no import of __main__", "08"),
        ),
        messages=("AttributeError: Can't get attribute 'MyDataset' on <module '__main__' (built-in)>",),
        short="Move the Dataset class into a .py module and import it",
    ),
    Cause(
        "missing_main_guard",
        "spawn/forkserver re-imports a script without `if __name__ == \"__main__\":`",
        "the script has no `if __name__ == \"__main__\":` guard: a process that imports it to start workers "
        "(each spawn worker; the fork server, which preloads it on Python 3.14) re-ran its top level and "
        "tried to start workers of its own", "08_main_module_and_guard",
        fixes=(
            ("Put the code that builds and iterates the DataLoader under `if __name__ == \"__main__\":` - "
             "spawn workers and the fork server import your script and must not start workers themselves", "08"),
        ),
        messages=("An attempt has been made to start a new process before the current process has "
                  "finished its bootstrapping phase.",),
        short="Put the loader code under `if __name__ == \"__main__\":`",
    ),
    Cause(
        "native_crash",
        "worker killed by SIGSEGV / SIGFPE / SIGABRT / SIGILL",
        "a worker died of a fatal signal in native code (segfault/abort), not a Python error",
        "03_corrupt_data",
        fixes=(
            ("A C extension crashed in the worker (decoder, OpenCV, a corrupt file): call faulthandler.enable() "
             "in the DataLoader's worker_init_fn to see which sample and call (the lab's helper: "
             "labutils.kit.fixes.make_worker_init)", "03"),
            ("Find and quarantine the file that crashes the decoder; validate data up front; update the "
             "native library", "03"),
            ("Rerun with num_workers=0 to get the crash in the main process under a debugger", "01"),
        ),
        messages=("DataLoader worker (pid 4242) is killed by signal: Segmentation fault.",
                  ("Segmentation fault (core dumped) (the shell's line: the main process itself died, "
                   "num_workers=0)", "main_process")),
        short="`faulthandler.enable()` in `worker_init_fn`; quarantine the file that crashes the decoder",
        variants={"main_process": {
            "short": "Run `python -X faulthandler`: it prints the Python line of the crash",
            "summary": "the main process died of a fatal signal in native code while the Dataset ran in it "
                       "(num_workers=0): no worker died, the crash is in the data-loading code itself",
            "fixes": (
                ("Run Python with -X faulthandler (or faulthandler.enable()) to get the Python stack of the "
                 "crash: it names the line of __getitem__ or collate_fn", "03"),
                ("Find and quarantine the file that crashes the decoder; validate data up front; update "
                 "the native library", "03"),
            )}},
    ),
    Cause(
        "oom_killed",
        "worker killed by SIGKILL (the OOM killer's signal)",
        "a process was SIGKILLed for using too much memory", "04_memory_and_oom",
        fixes=(
            ("Reduce the memory each worker holds: fewer workers, smaller batch_size or prefetch_factor, "
             "no caches that grow per sample", "04"),
            ("Avoid copy-on-read: keep sample lists/metadata in numpy arrays or one byte buffer instead of "
             "Python lists/dicts, and measure worker USS/PSS (not RSS)", "04"),
            ("Check the container or cgroup memory limit (dmesg shows the kernel OOM killer's log)", "04"),
        ),
        messages=("DataLoader worker (pid 4242) is killed by signal: Killed.",),
        short="Check `dmesg` or the cgroup for an OOM kill; then fewer workers, no caches",
        variants={"no_memory_evidence": {
            "short": "Look for the kernel's record first: `dmesg`, `memory.events`, the scheduler's job log",
            "summary": "a worker was killed by SIGKILL; nothing recorded says it was for memory: the kernel "
                       "OOM killer sends SIGKILL, and so do " + OTHER_SIGKILL_SENDERS,
            "fixes": (
                ("Look for the kernel's record first: `dmesg | grep -i -E 'killed process|oom'` (needs "
                 "root on many systems), the cgroup's memory.events oom_kill counter, or your scheduler's "
                 "job log (sacct, kubectl describe pod: OOMKilled)", "04"),
                ("If it was memory: fewer workers, smaller batches or prefetch_factor, no per-sample "
                 "caches, numpy buffers instead of Python lists (copy-on-read)", "04"),
                ("If it was not: find who sent the signal (a kill -9, a preemption, timeout -s KILL) - "
                 "the loader did nothing wrong", "01"),
            )}},
    ),
    Cause(
        "shm_exhausted",
        "/dev/shm full: \"No space left on device\" on a torch shm file, or SIGBUS",
        "shared memory (/dev/shm) ran out while workers passed batches to the main process",
        "05_shared_memory",
        fixes=(
            ("Give /dev/shm more room (docker run --shm-size=2g or --ipc=host; Kubernetes: an emptyDir "
             "with medium: Memory on /dev/shm)", "05"),
            ("Keep batch bytes x prefetch_factor x num_workers under the free /dev/shm (df -h /dev/shm; "
             "the lab's `python -m labutils doctor` shows the budget)", "05"),
        ),
        messages=("RuntimeError: unable to allocate shared memory(shm) for file </torch_...>: No space "
                  "left on device (28)",
                  "DataLoader worker (pid 4242) is killed by signal: Bus error.",
                  "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                  "memory (shm). (torch before 2.10: SIGBUS)",
                  "RuntimeError: unable to write to file </torch_...>: No space left on device (28) (torch before "
                  "2.10)",
                  ("terminate called after throwing an instance of 'c10::Error' what(): could not unlink the "
                   "shared memory file /torch_... (a file deleted under the loader)", "removed"),
                  ("RuntimeError: unable to open shared memory object </torch_...> in read-write mode: No such "
                   "file or directory (2) (a file deleted under the loader)", "removed")),
        short="Give /dev/shm more room (`docker run --shm-size=2g`), or smaller batches in flight",
        variants={"removed": {
            "short": "Run the job outside your login session (`loginctl enable-linger`), or `RemoveIPC=no`",
            "summary": "a /dev/shm file of a batch in flight was deleted under the running loader (what "
                       "systemd-logind's RemoveIPC=yes does at your last logout, or a job that cleans /dev/shm): "
                       "/dev/shm was not full",
            "fixes": (
                ("Keep the job out of your login sessions: `loginctl enable-linger`, a scheduler or a system "
                 "service; or RemoveIPC=no in /etc/systemd/logind.conf; or keep the default file_descriptor "
                 "sharing strategy, whose files are unlinked at once (the lab's `python -m labutils doctor` warns "
                 "where RemoveIPC applies)", "05"),
                ("Clean /dev/shm only of files whose creator is gone, never while jobs run", "05"),
                ("The default file_descriptor strategy unlinks a batch's file at once, so a deletion cannot hit "
                 "it; file_system keeps every batch by name in /dev/shm", "06"),
            )}},
    ),
    Cause(
        "fd_limit",
        "too many open files / \"received 0 items of ancdata\"",
        "the run hit the open-files limit (RLIMIT_NOFILE) while passing batches between processes",
        "06_file_descriptors",
        fixes=(
            ("Raise the soft open-files limit (ulimit -n 65536, or resource.setrlimit at start-up)", "06"),
            ("torch.multiprocessing.set_sharing_strategy('file_system') needs one fd per batch in flight, "
             "not one per tensor kept alive", "06"),
            ("Do not keep every batch alive: store what you need (.item(), .clone() of small tensors, "
             "numpy copies) and let the batches go", "06"),
        ),
        messages=("RuntimeError: received 0 items of ancdata",
                  "RuntimeError: Too many open files. Communication with the workers is no longer possible.",
                  ("OSError: [Errno 24] Too many open files: '/data/img_0001.jpg' (raised in your own open() in "
                   "__getitem__)", "user_leak")),
        short="`ulimit -n 65536`, or `set_sharing_strategy('file_system')`; do not keep every batch",
        variants={"user_leak": {
            "short": "Close what `__getitem__` opens: `with open(path) as f:`",
            "summary": "your own code ran out of file descriptors: files opened in the Dataset are not "
                       "closed (a leak), so every sample costs one more open file",
            "fixes": (
                ("Close what __getitem__ opens: `with open(path) as f:` (or PIL's `with Image.open(...)`), "
                 "so each sample gives its descriptor back; a higher ulimit only postpones a leak", "06"),
                ("Keep one handle per worker instead of one per sample, opened lazily in the worker (the lab's "
                 "helpers: labutils.kit.fixes.LazyFile / PerWorkerResource)", "02"),
                ("Count the descriptors while it runs (ls /proc/<worker pid>/fd | wc -l): a number that "
                 "grows with every sample is the leak", "06"),
            )}},
    ),
    Cause(
        "fork_refused",
        "the kernel refused a new worker process (or thread): a process-count limit (RLIMIT_NPROC, a pids "
        "cgroup) or no memory to fork",
        "the kernel refused to create a DataLoader worker: the job reached its limit on processes "
        "(RLIMIT_NPROC / `ulimit -u`, a container's pids limit) or fork could not get memory",
        "06_file_descriptors",
        fixes=(
            ("Count what the job starts: num_workers processes (times ranks), each with its own threads; "
             "lower num_workers, or cap threads per worker (torch.set_num_threads(1) in worker_init_fn, "
             "OMP_NUM_THREADS=1)", "06"),
            ("Raise the limit where it is set: `ulimit -u` (RLIMIT_NPROC, per user: all your processes count), "
             "docker run --pids-limit, Kubernetes podPidsLimit, systemd TasksMax", "06"),
            ("[Errno 12] Cannot allocate memory at fork: the parent is too big to fork under strict "
             "overcommit; start workers before loading big data, or use spawn/forkserver", "04"),
        ),
        messages=("BlockingIOError: [Errno 11] Resource temporarily unavailable (at worker start: os.fork)",
                  "OSError: [Errno 12] Cannot allocate memory (at worker start: os.fork)",
                  ("RuntimeError: can't start new thread (a worker's queue feeder, the pin-memory thread, a "
                   "thread of the Dataset: threads count against the same task limit)", "thread")),
        short="Fewer workers or threads (`OMP_NUM_THREADS=1`), or raise `ulimit -u` / the pids limit",
        variants={"thread": {
            "summary": "the kernel refused a new thread (a worker's queue feeder, the pin-memory thread, the main "
                       "process's queue feeder, or a thread the Dataset starts): the job reached its limit on tasks, "
                       "which counts threads as well as processes "
                       "(RLIMIT_NPROC / `ulimit -u`, a container's pids limit)",
        }},
    ),
    Cause(
        "worker_exit",
        "worker ended early without a traceback: an exit code, an exit(0), or a SIGTERM from outside",
        "a worker process ended early (an exit code, an exit(0) before its work was done, or SIGTERM from "
        "outside the script) without a Python traceback", "01_read_the_error",
        fixes=(
            ("Something in the worker called sys.exit()/os._exit() or a library exited: rerun with "
             "num_workers=0 to see it in-process, and read the worker stderr", "01"),
            ("Enable faulthandler in workers (faulthandler.enable() in worker_init_fn; the lab's helper: "
             "labutils.kit.fixes.make_worker_init) to see the last stack", "07"),
        ),
        messages=("DataLoader worker (pid 4242) exited unexpectedly with exit code 3.",),
        short="Find what exited the worker: rerun with `num_workers=0`, read the worker's stderr",
        variants={"sigterm": {
            "short": "Find who sent SIGTERM: a scheduler's time limit, torchrun, a kill",
            "summary": "a worker was stopped by SIGTERM from outside the script (not an exit() of its own)",
            "fixes": (
                ("Find who sent SIGTERM: a scheduler at its time limit (SLURM: sacct -j JOB, --signal to "
                 "get a warning first), torchrun stopping the other ranks after one failed (read the first "
                 "failing rank's log), a Kubernetes eviction (kubectl describe pod), a person's `kill`", "01"),
                ("Make the job resumable: checkpoint often and handle SIGTERM by saving and exiting", "10b"),
            )}},
    ),
    Cause(
        "timeout",
        "\"DataLoader timed out after N seconds\"",
        "DataLoader(timeout=...) expired: a worker delivered no batch in time", "07_hangs_and_timeouts",
        fixes=(
            ("A worker did not deliver a batch in time: dump the workers' stacks (faulthandler."
             "dump_traceback_later in worker_init_fn, or py-spy dump; the lab's helper: labutils.kit.fixes."
             "make_worker_init(dump_after=...)) to see where they wait (lock, network, a deadlock after "
             "fork)", "07"),
            ("Raise DataLoader(timeout=...) only if loading is legitimately slow; otherwise fix the stuck "
             "call (locks or threads created before fork, e.g. OpenCV/OpenMP)", "07"),
        ),
        messages=("RuntimeError: DataLoader timed out after 5 seconds",),
        short="Dump the workers' stacks (`py-spy dump PID`) to see what they wait on",
    ),
    Cause(
        "hang",
        "no progress until the run's own time limit; the runner killed it",
        "the loader made no progress: a worker or the main process was stuck", "07_hangs_and_timeouts",
        fixes=(
            ("Set DataLoader(timeout=...) so a stuck worker raises instead of hanging forever", "07"),
            ("Dump the stacks of the stuck processes (faulthandler, py-spy dump) to see what they wait on",
             "07"),
            ("Bound the job with a watchdog / retry (the lab's helper: labutils.kit.fixes.ResilientLoader)", "10b"),
        ),
        messages=("(no message: the loop stops)",),
        short="Set `DataLoader(timeout=...)`; dump the stuck stacks with `py-spy dump`",
    ),
    Cause(
        "cuda_in_worker",
        "CUDA touched in a forked worker, or on a build without CUDA",
        "CUDA was touched inside a DataLoader worker (or on a build without CUDA)", "02_spawn_and_pickling",
        fixes=(
            ("Keep workers on the CPU: return CPU tensors from __getitem__ and move each batch to the "
             "device in the training loop (pin_memory=torch.cuda.is_available(), batch.to(device, "
             "non_blocking=True))", "02"),
            ("Pick the device once: device = 'cuda' if torch.cuda.is_available() else 'cpu'", "02"),
            ("If workers must touch CUDA, use multiprocessing_context='spawn' (CUDA cannot be used in a "
             "forked child)", "02"),
            ("On a GPU machine: the parent's CUDA before fork, CUDA tensors from workers, the pin-memory "
             "thread; pin_memory=torch.cuda.is_available() on a machine without one", "11"),
        ),
        messages=("RuntimeError: Cannot re-initialize CUDA in forked subprocess.",
                  "AssertionError: Torch not compiled with CUDA enabled"),
        short="Return CPU tensors from workers; move each batch to the GPU in the loop",
    ),
    Cause(
        "outside_loader",
        "the script failed, but not in data loading (the model, the loss, torch.save/load, the user's own "
        "code)",
        "the script failed outside data loading: the DataLoader is not to blame", "01_read_the_error",
        fixes=(
            ("Read the traceback of the error shown: its last frames are in your training code or a "
             "library it called (the model, the loss, torch.save/torch.load, your own pickling), not in "
             "torch.utils.data", "01"),
            ("torch.save pickles what it is given: save model.state_dict(), not objects holding lambdas, "
             "locks or open files; torch.load of a whole pickled model needs its class importable under "
             "the same module name (define Net in a module, not in __main__)", "02"),
        ),
        messages=("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 4x2)",),
        short="Read the traceback's last frames: your model or loop, not the loader",
    ),
]

CATALOGUE: dict = {c.id: c for c in _ENTRIES}

#: The vocabulary (DESIGN.md), in catalogue order: ``ok``, the 13 loader causes, ``outside_loader``.
CAUSES = tuple(CATALOGUE)
#: The causes that blame data loading.
LOADER_CAUSES = tuple(c for c in CAUSES if c not in ("ok", "outside_loader"))

#: When one failure shows the evidence of several causes, the first listed wins. Resource exhaustion is
#: named before the symptoms it produces (an exception in a worker, a killed worker, a hang); spawn
#: start-up failures before the exit code or hang they cause; a bare hang is the last resort.
PRECEDENCE = ("shm_exhausted", "fd_limit", "fork_refused", "cuda_in_worker", "missing_main_guard",
              "main_not_importable", "unpicklable_dataset", "native_crash", "oom_killed", "worker_exception", "timeout",
              "worker_exit", "hang", "outside_loader", UNKNOWN)

_UNKNOWN_FIXES = (("Read the exception above: nothing recorded says where it came from", "01"),)


def fixes_for(cause_id: str, variant: Optional[str] = None) -> list:
    """The :class:`Fix` list of a cause (and of one of its variants); ``[]`` for ``ok``/``unsupported``."""
    if cause_id == UNKNOWN:
        return [Fix(text, NOTEBOOKS[nb]) for text, nb in _UNKNOWN_FIXES]
    if cause_id in ("ok", UNSUPPORTED) or cause_id not in CATALOGUE:
        return []
    return CATALOGUE[cause_id].fix_list(variant)


#: Messages the later notebooks (10-12) teach that are not a cause's own text: an echo, a warning, a launcher's
#: report, a variant. ``(error text, what the diagnosis says, first fix, notebook stem)``.
TAUGHT = (
    ("DataLoader worker (pid(s) N) exited unexpectedly, whose __cause__ is an empty queue.Empty (after the "
     "loader's whole timeout)", "worker_exit",
     "A worker exited with code 0 before its work was done (its own SIGTERM handler, an exit(0)): PyTorch "
     "reports only non-zero exits at once; let SIGTERM kill the worker, or re-raise it", "10b_recommended_loader"),
    ("DataLoader worker (pid N) is killed by signal: Terminated.", "worker_exit",
     "Something outside the loader asked the job to stop (a scheduler, kill, a launcher): save and exit in the "
     "main process's SIGTERM handler; do not catch it in workers", "10b_recommended_loader"),
    ("AttributeError: Can't get attribute 'LabeledDataset' on <module '__mp_main__' from 'train.py'>",
     "main_not_importable",
     "spawn/forkserver workers import the script as __mp_main__, where the __main__ block does not run: define "
     "the Dataset at module level (or in a module), not under `if __name__ == \"__main__\":`",
     "10_production_loader"),
    ("UserWarning: 'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
     "won't be used", "ok",
     "Only a warning: PyTorch switched pinning off. Set it from the machine: "
     "pin_memory=torch.cuda.is_available() (not torch.accelerator: on Apple MPS it is True and the DataLoader "
     "still warns)", "10_production_loader"),
    ("UserWarning: 'pin_memory' argument is set as true but not supported on MPS now, device pinned memory won't "
     "be used.", "ok",
     "Only a warning (Apple MPS, read in torch's source, not run: the lab has no Mac): torch.accelerator says "
     "an accelerator is there, yet the DataLoader switches pinning off; pin_memory=torch.cuda.is_available() "
     "leaves it off without the warning", "11_cuda_and_accelerators"),
    ("UserWarning: This DataLoader will create N worker processes in total. Our suggested max number of worker in "
     "current system is M, which is smaller than what this DataLoader is going to create.", "ok",
     "Only a warning: M is the CPUs this process may use (os.sched_getaffinity where it exists), and more "
     "workers than that take turns on them. Use at most M workers (fewer if the main process needs a CPU), "
     "then measure samples/s against num_workers", "10_production_loader"),
    ("RuntimeError: Caught RuntimeError in DataLoader worker process 0 ... stack expects each tensor to be equal "
     "size, but got [3, 224, 224] at entry 0 and [...] at entry N", "worker_exception",
     "default_collate stacks a batch's samples and one of them has another shape (a file that loads but is not "
     "what the others are): check the shape in __getitem__ and raise naming the file (then quarantine it), or "
     "resize in the transform; data of varying size needs a collate_fn that pads", "10_production_loader"),
    ("RuntimeError: Caught RuntimeError in pin memory thread for device 0.", "worker_exception",
     "The pin-memory thread in the main process failed on a batch: its inner traceback names the batch type "
     "whose pin_memory() raised; return tensors (or types with a working pin_memory())",
     "11_cuda_and_accelerators"),
    ("RuntimeError: Caught RuntimeError in pin memory thread for device 0 ... cannot pin "
     "'torch.cuda.FloatTensor' only dense CPU tensors can be pinned", "worker_exception",
     "Workers returned CUDA tensors to a loader with pin_memory=True: pinning is for CPU tensors. Return CPU "
     "tensors (and keep pin_memory), or set pin_memory=False for workers that must use CUDA",
     "11_cuda_and_accelerators"),
    ("RuntimeError: Caught AssertionError in DataLoader worker process 0 ... Torch not compiled with CUDA "
     "enabled", "cuda_in_worker",
     "Keep CUDA out of __getitem__: return CPU tensors and move the batch in the training loop",
     "11_cuda_and_accelerators"),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError ... Root Cause (first observed "
     "failure): [0]: rank: 1 ... exitcode: 1", "the failed rank's own cause",
     "Read the Root Cause block (rank, exitcode, pid), then that rank's own [rankN]: traceback (the lab's "
     "`python -m labutils diagnose --torchrun` names its cause)", "12_distributed_torchrun"),
    ("Sending process N closing signal SIGTERM; exitcode : -15 (pid: N) ... (SIGTERM)",
     "an echo (not a cause)",
     "torchrun stopped the other ranks after the first failure: look for the rank that failed first, not "
     "these", "12_distributed_torchrun"),
    ("terminate called without an active exception, and a worker killed by SIGABRT after another worker's "
     "death (spawn)", "an echo (not a cause)",
     "A spawned worker's interpreter exit aborted while its queue feeder thread was inside torch, as the "
     "DataLoader shut its workers down after the real failure: diagnose the worker that died first",
     "04_memory_and_oom"),
    ("traceback : Signal 15 (SIGTERM) received by PID N (a rank's entry in the Root Cause block)",
     "an echo (not a cause)",
     "torchrun writes this for a rank it stopped with SIGTERM (exitcode : -15; a signal leaves no error file): "
     "that rank did not fail. Read the entry with a positive exitcode, then that rank's [rankN]: traceback",
     "12_distributed_torchrun"),
    ("ERROR: Unexpected segmentation fault encountered in worker.", "native_crash",
     "A worker's last line, printed by torch's signal handler as it dies (under torchrun without the [rankN]: "
     "prefix: a worker is not the rank's main process); its rank then raises 'is killed by signal: "
     "Segmentation fault.'. Enable faulthandler in workers to see the call; quarantine the sample that crashes",
     "12_distributed_torchrun"),
    ("ConnectionResetError / Connection closed by peer (gloo, NCCL) on a rank", "an echo (not a cause)",
     "A collective lost the peer that died: find the rank that failed first (@record gives each rank its own "
     "timestamped error file)", "12_distributed_torchrun"),
    ("RuntimeError: Gloo connectFullMesh failed ... Connection refused, in init_process_group of a restarted "
     "attempt (--max-restarts)", "not the loader: the restart's own connection race",
     "torch 2.8+: TORCH_GLOO_LAZY_INIT=1 connects the ranks at their first collective; give "
     "init_process_group a timeout so that a hung attempt fails", "12_distributed_torchrun"),
)


#: What an echo says: another process's death shows through it, and that death's exit status decides
ECHO = "an echo (not a cause): read the worker's exit status"
#: Messages that are no cause of their own: ``(error text, what the diagnosis says, first fix, notebook stem,
#: the handout's short fix)``.
ECHOES = tuple(
    (text, ECHO, "Read the worker's exit status in the lines around it: SIGKILL (Killed) is a kill, memory first "
     "(04_memory_and_oom); an exit code is the worker's own exit (01_read_the_error)", "01_read_the_error",
     "Read the worker's exit status: SIGKILL, see 04; an exit code, see 01")
    for text in ("ConnectionResetError: [Errno 104] Connection reset by peer (in rebuild_storage_fd: a worker died "
                 "while handing a batch over)",
                 "EOFError (in rebuild_storage_fd / recvfds: a worker died while handing a batch over)")
)


def cheatsheet_rows() -> list:
    """``(error text, cause id, first fix, notebook path)`` for every message of every cause (a message of a
    variant with fixes of its own: that variant's first fix), then :data:`ECHOES` and :data:`TAUGHT`."""
    rows = []
    for cause in _ENTRIES:
        if cause.id == "ok":
            continue
        for msg, variant in cause.message_rows():
            first = cause.fix_list(variant)[0]
            rows.append((msg, cause.id, first.text, first.path))
    for msg, cause, fix, stem, _short in ECHOES:
        rows.append((msg, cause, fix, f"notebooks/{stem}.ipynb"))
    for msg, cause, fix, stem in TAUGHT:
        rows.append((msg, cause, fix, f"notebooks/{stem}.ipynb"))
    return rows
