"""Watch /dev/shm while a loader runs (:class:`PeakMeter`, :func:`try_config`), and decide how notebook 05 can
show a full /dev/shm on this machine (:func:`plan`). Where there is no /dev/shm (macOS) the meters report
themselves unsupported instead of raising. Torch is imported inside :func:`try_config` only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..machine.doctor import in_flight_rule  # noqa: F401 - the lessons import it here
from ..machine.probes import shm_usage, shm_used
from ..runner import isolate, startmethod
from ..runner.ownership import torch_segment_pid
from ..runner.sizes import format_size
from .shmfiles import SHM_PATH, maps_extents, shm_root

MiB = 2**20

#: Set to ``off`` to make :func:`plan` behave as where ``unshare`` is refused (Docker's default seccomp,
#: rootless containers, macOS), whatever this machine allows.
ENV_PRIVATE = "LABUTILS_PRIVATE_SHM"
#: A real /dev/shm at most this big is "small" (Docker gives 64 MiB): the lesson runs there for real.
SMALL_SHM = 256 * MiB
#: The lesson's /dev/shm in the private mount.
LESSON_SHM = 8 * MiB
#: Bytes of one image of the lesson at 8 MiB: 3 x 256 x 256 float32.
LESSON_SAMPLE = 3 * 256 * 256 * 4


def why_unsupported(path: str = SHM_PATH) -> Optional[str]:
    """None where ``path`` is a filesystem this module can measure; else the reason, in one sentence."""
    if not hasattr(os, "statvfs"):
        return f"os.statvfs does not exist on this platform ({sys.platform}): {path} cannot be measured"
    if not os.path.isdir(path):
        return (f"there is no {path} on this machine ({sys.platform}): POSIX shared memory lives in the "
                "kernel here, with no filesystem to measure")
    try:
        os.statvfs(path)
    except OSError as exc:
        return f"{path} cannot be measured: {exc}"
    return None


def supported(path: str = SHM_PATH) -> bool:
    """Whether the meters of this module work on ``path`` here (see :func:`why_unsupported`)."""
    return why_unsupported(path) is None


class PollingMeter(threading.Thread):
    """A daemon thread that calls :meth:`sample` every ``interval`` seconds until :meth:`stop` (which takes
    one last sample) and keeps the peak in ``peak_total``; a context manager. Where ``supported`` is False
    it starts no thread and :meth:`stop` gives None. Subclasses set ``supported`` and define ``read``, the
    value of one sample."""

    supported = False

    def __init__(self, interval: float, name: str):
        super().__init__(daemon=True, name=name)
        self.interval = interval
        self.samples = 0
        self._done = threading.Event()

    @property
    def peak(self) -> Optional[int]:
        return self.peak_total

    def read(self) -> int:
        raise NotImplementedError

    def sample(self) -> int:
        value = self.read()
        self.peak_total = max(self.peak_total, value)
        self.samples += 1
        return value

    def start(self) -> None:
        if self.supported:
            super().start()

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            time.sleep(self.interval)

    def stop(self) -> Optional[int]:
        """Stop polling (one last sample is taken) and return :attr:`peak` (None where unsupported)."""
        self._done.set()
        if not self.supported:
            return None
        if self.is_alive():
            self.join()
        self.sample()
        return self.peak

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PeakMeter(PollingMeter):
    """Poll the use of ``path`` every ``interval`` seconds and keep the peak above the use at creation.

    A peak shorter than the interval can be missed: a measured peak is a lower bound. Where ``path`` cannot
    be measured, ``supported`` is False, ``reason`` says why, and ``peak`` and :meth:`stop` give None.
    """

    def __init__(self, path: str = SHM_PATH, interval: float = 0.001):
        super().__init__(interval, "shm-peak-meter")
        self.path = path
        self.reason = why_unsupported(path)
        self.supported = self.reason is None
        self.baseline = shm_used(path) if self.supported else None
        self.peak_total = self.baseline

    @property
    def peak(self) -> Optional[int]:
        """Highest use seen, minus the use when the meter was created (None where unsupported)."""
        return None if not self.supported else self.peak_total - self.baseline

    def read(self) -> int:
        return shm_used(self.path)

    def __str__(self) -> str:
        if not self.supported:
            return f"PeakMeter({self.path}): unsupported - {self.reason}"
        return f"PeakMeter({self.path}): peak {format_size(self.peak)} in {self.samples} samples"


def try_config(
    dataset: Any,
    batch_size: int,
    num_workers: int,
    prefetch_factor: int,
    *,
    read: Optional[Callable[[Any], list]] = None,
    step_s: float = 0.01,
    clear_frames: bool = True,
    path: str = SHM_PATH,
    **loader_kwargs: Any,
) -> dict:
    """One pass of ``DataLoader(dataset, ...)`` with a :class:`PeakMeter` running; a JSON-able dict of
    ``config``, ``error``, ``seen``, ``batches``, ``peak`` (bytes above the start) and ``start_method``.

    Each batch goes to ``read`` (its list is collected in ``seen``), then the loop sleeps ``step_s`` (the
    "training step"). A ``RuntimeError`` ends the pass and is kept as text; ``clear_frames`` clears its
    traceback's frames at once, which lets the failed iterator's shared memory go (notebook 05).
    """
    from torch.utils.data import DataLoader

    seen: list = []
    batches = 0
    error = None
    method = None
    with PeakMeter(path) as meter:
        try:
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                prefetch_factor=prefetch_factor, **loader_kwargs)
            ctx = loader.multiprocessing_context
            method = ctx.get_start_method() if ctx is not None else startmethod.current()
            it = iter(loader)
            for batch in it:
                batches += 1
                if read is not None:
                    seen += read(batch)
                time.sleep(step_s)
            del it
        except RuntimeError as exc:
            error = str(exc)
            if clear_frames:
                traceback.clear_frames(exc.__traceback__)
    return {"config": [batch_size, num_workers, prefetch_factor], "error": error, "seen": seen,
            "batches": batches, "peak": meter.peak, "start_method": method}


@dataclass
class ShmPlan:
    """How notebook 05 shows a full /dev/shm here (:func:`plan`): ``mode`` ``private``, ``real`` or
    ``recorded``; ``sample_bytes`` is one image, sized so that 4 per batch overflow the space and 1 fits."""

    mode: str
    reason: str
    shm_bytes: int
    free_bytes: int
    sample_bytes: int
    facts: dict = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        """True when the lesson's loaders really run here (``private`` or ``real``)."""
        return self.mode in ("private", "real")

    @property
    def forced(self) -> bool:
        """True when ``LABUTILS_PRIVATE_SHM=off`` made this plan (the machine itself may allow the mount)."""
        return bool(self.facts.get("forced"))

    @property
    def isolate_args(self) -> str:
        """The ``%%isolate`` option for the lesson's runs: none on the real /dev/shm, else an 8 MiB private one."""
        return "" if self.mode == "real" else f"--shm-size {LESSON_SHM // MiB}M"

    @property
    def image_width(self) -> int:
        """Width of a 3 x 256 x W float32 image of ``sample_bytes``."""
        return self.sample_bytes // (3 * 256 * 4)

    def __str__(self) -> str:
        where = {"private": f"a private {format_size(self.shm_bytes)} /dev/shm for each run",
                 "real": f"this machine's real /dev/shm ({format_size(self.free_bytes)} free of "
                         f"{format_size(self.shm_bytes)})",
                 "recorded": "recorded results (nothing runs)"}[self.mode]
        return f"{self.mode}: {where} - {self.reason}"


def sample_for(free_bytes: int) -> int:
    """Bytes per image so that the lesson scales to ``free_bytes``: at 8 MiB, 768 KiB (3 x 256 x 256 float32).

    Keeps ``free / image = 32 / 3``: a batch of 4 images needs 18 of 8 units under the +2 rule with 2
    workers and ``prefetch_factor=2`` (it fails), a batch of 1 needs 4.5 (it fits). The width of a
    3 x 256 x W image is rounded down, so an image is a multiple of 3 KiB.
    """
    width = max(1, (free_bytes * 3 // 32) // (3 * 256 * 4))
    return width * 3 * 256 * 4


def plan(
    private: Optional[tuple] = None,
    *,
    path: str = SHM_PATH,
    small: int = SMALL_SHM,
    env: Optional[dict] = None,
) -> ShmPlan:
    """Decide where notebook 05's loaders meet a full /dev/shm on this machine, and say why.

    ``private`` is :func:`labutils.private_shm_support`'s answer (asked when None); ``LABUTILS_PRIVATE_SHM=off``
    in ``env`` forces "refused". A private mount gives ``private`` (8 MiB per run); else a real /dev/shm of at
    most ``small`` gives ``real`` (images sized from its free space), and a big one ``recorded``: filling a
    /dev/shm shared with everything else on the machine is not a lesson worth its risk.
    """
    env = os.environ if env is None else env
    forced = env.get(ENV_PRIVATE, "").strip().lower() in ("off", "0", "no", "false")
    facts: dict = {"forced": forced}
    if forced:
        reason = f"{ENV_PRIVATE}={env.get(ENV_PRIVATE)} (as where unshare is refused)"
    else:
        if private is None:
            private = isolate.private_shm_support()
        prefix, reason = private
        if prefix is not None:
            return ShmPlan("private", "this machine allows a private mount namespace", LESSON_SHM,
                           LESSON_SHM, LESSON_SAMPLE)
    usage = shm_usage(path)
    if usage is None:
        return ShmPlan("recorded", f"no private /dev/shm ({reason}) and no {path} here", 0, 0,
                       LESSON_SAMPLE, facts={**facts, "refused": reason})
    total, free = usage
    if total <= small:
        return ShmPlan("real", f"no private /dev/shm ({reason}); {path} is small "
                       f"({format_size(total)} <= {format_size(small)}), as in a container",
                       total, free, sample_for(free), facts={**facts, "refused": reason})
    # nothing runs: the lesson's numbers are those of the recorded 8 MiB runs
    return ShmPlan("recorded", f"no private /dev/shm ({reason}), and {path} is {format_size(total)}: "
                   f"filling it would disturb everything else on this machine", total, LESSON_SHM,
                   LESSON_SAMPLE, facts={**facts, "refused": reason, "measured_free": free})


def shm_names(path: str = SHM_PATH) -> set:
    """Names of PyTorch segments (``torch_*``) and multiprocessing semaphores (``sem.mp-*``) in ``path``."""
    try:
        return {n for n in os.listdir(path) if n.startswith(("torch_", "sem.mp-"))}
    except OSError:
        return set()


def _mapped_inodes(path: str) -> set:
    """Inodes of the files under ``path`` that any process maps (the maps reader of notebook 12's meter)."""
    root, sizes = shm_root(path), {}
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                maps_extents(pid, sizes, root)
            except (OSError, ValueError, IndexError):  # gone, or not ours to read
                continue
    return {inode for _dev, inode in sizes}


def leaked_shm(before: set, path: str = SHM_PATH, grace: float = 10.0, poll: float = 0.1) -> set:
    """Files of :func:`shm_names` that appeared since ``before`` and that nobody uses any more.

    A new name alone is no leak on a shared machine: a ``torch_<pid>_*`` segment whose creator is alive, or
    a semaphore a live process still maps (by inode), belongs to a run still going. Nor is a file unused for
    a moment: under spawn and forkserver a semaphore is unlinked by its finalizer or the resource tracker
    *after* the last process that mapped it ended (notebook 12's check once caught one in that window). So a
    candidate counts only if it is still there, and unused, ``grace`` seconds later (polled every ``poll``).
    """
    if grace < 0 or poll <= 0:
        raise ValueError(f"grace={grace!r}, poll={poll!r}: grace must be >= 0 and poll > 0 seconds")
    deadline = time.monotonic() + grace
    while True:
        leaked = _unused_new(before, path)
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def _unused_new(before: set, path: str) -> set:
    import psutil

    new = shm_names(path) - set(before)
    if not new:
        return set()
    mapped = _mapped_inodes(path)
    leaked = set()
    for name in new:
        try:
            inode = os.stat(os.path.join(path, name)).st_ino
        except OSError:
            continue  # gone already
        pid = torch_segment_pid(name)
        if inode in mapped or (pid is not None and psutil.pid_exists(pid)):  # mapped, or its maker lives
            continue
        leaked.add(name)
    return leaked


def refuse_private_mounts(plan_: ShmPlan) -> bool:
    """For a plan forced by ``LABUTILS_PRIVATE_SHM=off``, set the runner's cached answer to "no private
    /dev/shm" with the plan's reason, so every ``shm_size=`` run reports ``unsupported`` as where ``unshare``
    is refused; return True if it did."""
    if not plan_.forced:
        return False
    isolate._shm_support = (None, plan_.reason)
    return True


#: What notebook 05 measured in a private 8 MiB /dev/shm (Linux, torch 2.13, 2 cores), shown where the
#: lesson cannot run. Each row: (what, outcome).
RECORDED_8M = [
    ("batch 3 MiB, 2 workers, prefetch 2 (needs 18 MiB)",
     "Caught RuntimeError in DataLoader worker process 0 ... unable to allocate shared memory(shm) for "
     "file </torch_...>: No space left on device (28)"),
    ("a Dataset writing 12 MiB through multiprocessing.shared_memory",
     "worker killed by signal: Bus error (SIGBUS, exit -7); 'Unexpected bus error encountered in worker'"),
    ("batch 0.75 MiB, 2 workers, prefetch 2 (needs 4.5 MiB)", "ok, every image once"),
    ("batch 3 MiB with the file_system strategy", "the same No space left on device"),
    ("batch 3 MiB with TMPDIR on disk", "the same No space left on device; TMPDIR gets only pymp-* folders"),
    ("batch 3 MiB in a 64 MiB /dev/shm", "ok"),
]


def remove_files_of(pids, path: str = SHM_PATH) -> list:
    """Delete the ``torch_<pid>_*`` files of ``path`` that these live processes created; return their names.

    What logind's ``RemoveIPC=yes`` does at a user's last logout, limited to the caller's own processes. A file
    is a process's by its name *and* its time (changed after that process started: an earlier holder of
    the pid number made the others); pids that are gone are skipped.
    """
    import psutil

    started = {}
    for pid in pids:
        try:
            started[int(pid)] = psutil.Process(int(pid)).create_time()
        except (psutil.Error, ValueError):
            continue
    removed = []
    for name in sorted(shm_names(path)):
        born = started.get(torch_segment_pid(name))
        full = os.path.join(path, name)
        try:
            if born is None or os.stat(full).st_mtime < born - 0.02:
                continue
            os.unlink(full)
        except OSError:
            continue
        removed.append(name)
    return removed
