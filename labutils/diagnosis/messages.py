"""PyTorch's words for a DataLoader failure, in one place: the messages it raises and prints, the echoes of a
worker's death (the exception types and frames a fetch from a dead worker fails in), and the signal words.

Every reader of a death uses these: the notebooks' checks (:mod:`labutils.kit.deaths`), the diagnosis of a
run, an exception or a log. Patterns match a message's stable parts, for the wordings of torch 0.4 to 2.x (an
older wording is a second alternative), with ``.match`` on a message's first line or ``.search`` in a text.
Signal words are ``signal.strsignal``'s, exactly what PyTorch's SIGCHLD handler prints (``Killed``).
"""

from __future__ import annotations

import re
import signal
from typing import Optional

# --------------------------------------------------------------------------- a worker's death
#: the status check's generic line: ``DataLoader worker (pid(s) 12, 13) exited unexpectedly``
DIED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
#: the SIGCHLD handler's signal line: ``DataLoader worker (pid 12) is killed by signal: Killed.``
KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")
#: the SIGCHLD handler's exit-code line (``... exited unexpectedly with exit code 1. Details are lost ...``)
EXIT_CODE = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
PIN_DIED = re.compile(r"Pin memory thread exited unexpectedly")
#: at exit, multiprocessing's handler terminates the daemonic workers still alive and joins each; one killed
#: by that SIGTERM before its own handler was set (a spawn worker still importing) makes PyTorch's SIGCHLD
#: handler raise inside the join, and the workers not yet joined outlive the main process (under python
#: they end themselves once they find their parent gone)
EXIT_JOIN_RAISED = re.compile(r"Exception ignored in atexit callback: <function _exit_function\b[\s\S]*?"
                              r"DataLoader worker \(pid \d+\) is killed by signal")
#: what a worker writes to its stderr (C level) before its own signal handler re-raises the signal
WORKER_LINE = re.compile(r"ERROR: Unexpected (segmentation fault|floating-point exception|bus error) "
                         r"encountered in worker")

# --------------------------------------------------------------------------- a worker's Python exception
#: ``Caught ValueError in DataLoader worker process 0.`` (torch >= 1.2; also the pin-memory thread's)
WRAPPER = re.compile(r"^\W?Caught (\w[\w.]*) in (DataLoader worker process (\d+)|pin memory thread[^.]*)")
#: before torch 1.2 the worker's traceback was the re-raised exception's whole message
OLD_WRAPPER = re.compile(r"^Traceback \(most recent call last\):[\s\S]*?in _worker_loop\b")
ORIGINAL = "Original Traceback (most recent call last):"
TIMEOUT = re.compile(r"^DataLoader timed out after ([\d.]+) seconds")

# --------------------------------------------------------------------------- resources and start-up
SHM = re.compile(r"unable to (allocate|open|write to|mmap)[^\n]*shared memory|"
                 r"unable to write to file </torch_|"
                 r"No space left on device[^\n]*(torch_|/dev/shm)|(torch_|/dev/shm)[^\n]*No space left on device|"
                 r"out of shared memory", re.I)
SHM_GONE = re.compile(r"could not unlink the shared memory file|"
                      r"unable to open shared memory object[^\n]*No such file or directory")
FD = re.compile(r"Too many open files|\[Errno 24\]|received 0 items of ancdata|EMFILE")
#: the open-files message itself (not only an errno that a message quotes): decides fd_limit over SHM
FD_EXACT = re.compile(r"\[Errno 24\] Too many open files|Too many open files \(24\)|received 0 items of ancdata|"
                      r"Too many open files\. Communication with the workers is no longer possible")
FORK_REFUSED = re.compile(r"\[Errno 11\] Resource temporarily unavailable|\[Errno 12\] Cannot allocate memory|"
                          r"can't start new thread")
THREAD_REFUSED = re.compile(r"can't start new thread")
CUDA = re.compile(r"Torch not compiled with CUDA enabled|re-initialize CUDA in forked subprocess|"
                  r"CUDA error|Found no NVIDIA driver|No CUDA GPUs are available|"
                  r"CUDA driver initialization failed")
GUARD = re.compile(r"attempt has been made to start a new process before the\s+current process has "
                   r"finished its bootstrapping phase")
MAIN_ATTR = re.compile(r"Can't get attribute '([^']+)' on <module '(__main__|__mp_main__)'")
STDIN_MAIN = re.compile(r"No such file or directory: '[^']*<stdin>'")
PICKLE = re.compile(r"cannot pickle|can't pickle|Can't get local object|pickle error|"
                    r"attribute lookup .* failed|is not picklable|PicklingError", re.I)
TORCH_WARNING = re.compile(r"^(\S*/torch/utils/data/\S+\.py):\d+: (\w+Warning): (.*)$", re.M)

#: /dev/shm really short: the kernel's or torch's words for it (PyTorch's bus-error hint "out of shared
#: memory" is a guess, not evidence)
SHM_FULL = re.compile(r"No space left on device|unable to allocate shared memory|unable to write to file </torch_|"
                      r"unable to mmap[^\n]*shared memory")
#: a library that ends the worker itself, with the signal it raises inside it: (pattern, library)
LIBRARY_STOPS = ((re.compile(r"Terminating: fork\(\) called from a process already using GNU OpenMP, this is "
                             r"unsafe\."), "GNU OpenMP (libgomp, as numba, BLAS or scikit-learn load it)"),
                 (re.compile(r"OMP: Error #\d+: [^\n]+"), "Intel OpenMP (libiomp)"))


def library_stop(text: str) -> Optional[tuple]:
    """``(the line, the library)`` of a library's own stop of a process in ``text``, else None."""
    for regex, library in LIBRARY_STOPS:
        m = regex.search(text or "")
        if m:
            return m.group(0), library
    return None


# --------------------------------------------------------------------------- echoes of a death
#: the exceptions a fetch from a dead worker raises (its end of the fd-passing socket, or its batch's
#: file, is gone): echoes of the death, never its reason
ECHO_TYPES = frozenset({"ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError",
                        "BrokenPipeError", "EOFError", "FileNotFoundError"})
#: the frames such a fetch fails in: torch's tensor rebuild and multiprocessing's fd receipt
ECHO_FRAMES = frozenset({"rebuild_storage_fd", "rebuild_storage_filename", "recvfds"})
#: deeper frames of the same fetch (multiprocessing's connection), which count with a DataLoader frame
ECHO_DEEP_FRAMES = ECHO_FRAMES | {"detach", "_recv", "recv", "_recv_bytes", "recv_bytes", "rebuild_tensor",
                                  "rebuild_cuda_tensor", "_rebuild"}


def is_echo_traceback(etype: str, traceback: str) -> bool:
    """True for an exception of :data:`ECHO_TYPES` whose traceback passes through :data:`ECHO_FRAMES`."""
    return etype in ECHO_TYPES and any(f"in {name}" in (traceback or "") for name in ECHO_FRAMES)


# --------------------------------------------------------------------------- signals
#: the signals that mean native code crashed (a bug in C/C++, not a kill from outside)
NATIVE_SIGNALS = frozenset(int(s) for s in (signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGILL,
                                            signal.SIGTRAP, signal.SIGSYS))


def signal_from_word(word: str) -> Optional[int]:
    """The signal number whose words ``word`` starts with (``Bus error`` and macOS's ``Bus error: 10`` alike),
    or a ``SIGXXX`` name; None when no signal is worded so."""
    word = (word or "").strip().rstrip(".")
    if word.startswith("SIG"):
        try:
            return int(signal.Signals[word.split()[0]])
        except KeyError:
            return None
    for s in signal.Signals:
        text = signal.strsignal(s) or ""
        base = text.split(":")[0]  # macOS adds ": N"
        if text and (word == text or word.startswith(base) and base):
            return int(s)
    return None


def worker_pids(text: str) -> list:
    """Every worker pid PyTorch's death messages in ``text`` name, in order of first mention."""
    pids: list = []
    for m in re.finditer(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\)", text or ""):
        for p in m.group(1).replace(" ", "").split(","):
            if p and int(p) not in pids:
                pids.append(int(p))
    return pids
