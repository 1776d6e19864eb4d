"""Measurements of this machine and process that bear on DataLoader workers, and the one wording of each.

Used by :mod:`labutils.machine.doctor` (the preflight) and by a diagnosis's evidence lines
(:func:`environment_lines`). Every probe returns None (or an empty value) when it cannot measure, so that
tests can replace one measurement without touching the machine. Nothing here imports torch.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import psutil

from ..runner import cgroupfs, procfs, startmethod
from ..runner.sizes import format_size

SHM_PATH = "/dev/shm"


def shm_usage(path: str = SHM_PATH) -> Optional[tuple]:
    """(total_bytes, free_bytes) of the filesystem at ``path``; None when it does not exist."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def shm_used(path: str = SHM_PATH) -> int:
    """Bytes in use on the filesystem holding ``path`` (blocks minus free blocks); raises where it is absent."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def shm_line(usage: Optional[tuple]) -> str:
    if usage is None:
        return f"{SHM_PATH}: not present"
    return f"{SHM_PATH}: {format_size(usage[0])} total, {format_size(usage[1])} free"


def _own_file(controller: str, name: str) -> tuple:
    """``(text or None, "v1"/"v2"/None)`` of a file of this process's ``controller`` cgroup, found through
    the mounts as the runner finds it (labutils.runner.cgroupfs), so doctor and runner agree in a container."""
    version, directory = cgroupfs.own_cgroup(controller)
    if version is None:
        return None, None
    text = cgroupfs.read_file(os.path.join(directory, name))
    return (text.strip() if text is not None else None), f"v{version}"


def cgroup_memory() -> tuple:
    """(limit_bytes or None, usage_bytes or None, "v1"/"v2"/None) of this process's memory cgroup."""
    v1 = cgroupfs.own_cgroup("memory")[0] == 1
    limit, version = _own_file("memory", "memory.limit_in_bytes" if v1 else "memory.max")
    if version is None:
        return None, None, None
    usage, _ = _own_file("memory", "memory.usage_in_bytes" if v1 else "memory.current")
    usage = int(usage) if usage else None
    if limit is None or limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
        return None, usage, version
    return int(limit), usage, version


def cgroup_cpus() -> Optional[float]:
    """CPU quota of the cgroup in CPUs (v2 cpu.max or v1 cfs quota/period); None when unlimited."""
    text, version = _own_file("cpu", "cpu.max")
    if version == "v2":
        quota, _, period = (text or "max").partition(" ")
        return int(quota) / int(period) if quota != "max" and period else None
    quota, _ = _own_file("cpu", "cpu.cfs_quota_us")
    period, _ = _own_file("cpu", "cpu.cfs_period_us")
    if quota and period and int(quota) > 0:
        return int(quota) / int(period)
    return None


def cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def open_fds() -> Optional[int]:
    """Open descriptors of this process; None where they cannot be listed."""
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d)) - 1  # listdir's own descriptor
        except OSError:
            continue
    return None


try:
    import resource
except ImportError:  # not on Windows
    resource = None
RLIM_INFINITY = getattr(resource, "RLIM_INFINITY", -1)
NOFILE = "open-files limit (RLIMIT_NOFILE)"


def nofile_limits() -> Optional[tuple]:
    """(soft, hard) RLIMIT_NOFILE, :data:`RLIM_INFINITY` for unlimited; None where it does not exist."""
    return None if resource is None else resource.getrlimit(resource.RLIMIT_NOFILE)


def nofile_line(limits: tuple, fds: Optional[int] = None) -> str:
    soft, hard = ("unlimited" if n == RLIM_INFINITY else str(n) for n in limits)
    return f"soft {soft}, hard {hard}" + ("" if fds is None else f"; {fds} open now")


def memory() -> tuple:
    """(total_bytes, available_bytes) of the machine."""
    vm = psutil.virtual_memory()
    return vm.total, vm.available


def memory_line(total: int, available: int) -> str:
    return f"{format_size(total)} total, {format_size(available)} available"


def main_importable(main: Any = None) -> bool:
    """True when a spawn/forkserver child can re-import ``__main__``: it must be a real file.

    False in a notebook kernel and with ``python -c`` (no ``__file__``) and with ``python - < x.py``
    (``__file__`` is ``'<stdin>'``, which the child cannot open).
    """
    main = sys.modules.get("__main__") if main is None else main
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


@dataclass
class TorchInfo:
    module: Any = None  # the torch module when it is imported in this process
    version: Optional[str] = None
    cuda: Optional[str] = None
    location: Optional[str] = None
    error: Optional[str] = None
    import_s: float = 0.0

    @property
    def build(self) -> str:
        return f"CUDA {self.cuda}" if self.cuda else "CPU-only build"


def read_torch_version_file(package_dir: str) -> dict:
    """The literal assignments of torch/version.py (``__version__``, ``cuda``), read without importing."""
    import ast

    values: dict = {}
    try:
        with open(os.path.join(package_dir, "version.py")) as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return values
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name):
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                pass
    return values


def torch_dir() -> Optional[str]:
    """The folder of the installed torch package, found without importing it; None when there is none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


def torch_info(import_torch: bool = False) -> TorchInfo:
    """Describe torch without importing it (importing costs 1-5 s) unless asked to or already imported."""
    if "torch" not in sys.modules and import_torch:
        t0 = time.perf_counter()
        try:
            import torch  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install raising anything
            return TorchInfo(error=f"{type(exc).__name__}: {exc}", import_s=time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
    else:
        seconds = 0.0
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        version = getattr(torch, "__version__", None)
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        return TorchInfo(torch, str(version), cuda, getattr(torch, "__file__", None), import_s=seconds)
    package_dir = torch_dir()
    if package_dir is None:
        return TorchInfo(error="No module named 'torch'")
    values = read_torch_version_file(package_dir)
    return TorchInfo(None, values.get("__version__"), values.get("cuda"), package_dir)


_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def oom_lines_in(text: str, wanted: set, since_boot: Optional[float] = None) -> list:
    """The lines of a kernel log ``text`` that name a pid of ``wanted`` as OOM-killed; with ``since_boot``
    (seconds since boot), only lines stamped at or after it (a line without a stamp cannot show it is)."""
    lines = []
    for line in text.splitlines()[-2000:]:
        for m in re.finditer(r"(?:Killed process|oom-kill:.*?,pid=|task_memcg.*?pid=)\s*(\d+)", line):
            if int(m.group(1)) in wanted and ("oom" in line.lower() or "Killed process" in line):
                stamp = _STAMP.match(line.strip())
                if since_boot is not None and (stamp is None or float(stamp.group(1)) < since_boot):
                    break
                lines.append(line.strip())
                break
    return lines


def kernel_oom_record(pids: Iterable[int], since: Optional[float] = None, timeout: float = 2.0) -> Optional[dict]:
    """The kernel's record of an OOM kill of one of ``pids``, read now: the dmesg lines that name the pid,
    stamped after ``since`` (a ``time.time()``) where it is given; None when there are none or dmesg is closed.

    A pid number is reused, and the kernel log keeps the kills of the machine's whole uptime: a line about an
    earlier process with the same number is not about this one (a soak of the lab's notebooks found such a line
    for a SIGKILL of its own). The counter of this process's own cgroup is no record either: it counts kills of
    any process of the cgroup, at any time (the runner reads its run's child cgroup, which is specific).
    """
    pids = list(pids)
    wanted = {int(p) for p in pids if p}
    if not wanted or not sys.platform.startswith("linux"):
        return None
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    boot = procfs.start_wall(0)  # when the machine booted, in time.time() terms: the zero of the log's stamps
    lines = oom_lines_in(done.stdout, wanted, None if since is None else since - boot)
    if not lines:
        return None
    return {"source": "dmesg", "lines": lines[:3], "pids": pids}


#: Environment variables that name a scheduler or launcher which stops processes with SIGTERM.
_SENDERS = (
    ("SLURM_JOB_ID", "SLURM (at the job's time limit, or scancel; `sacct -j $SLURM_JOB_ID` shows why)"),
    ("TORCHELASTIC_RUN_ID", "torchrun / torch.distributed.elastic (it sends SIGTERM to the other ranks "
                            "when one rank fails: look for the first failing rank in its log)"),
    ("KUBERNETES_SERVICE_HOST", "Kubernetes (an eviction: memory pressure, an emptyDir over its sizeLimit, "
                                "a node drain; `kubectl describe pod` shows it)"),
)


def sigterm_senders(env: Optional[Mapping[str, str]] = None) -> list:
    """Likely senders of a SIGTERM in this environment, from the variables schedulers and launchers set."""
    env = os.environ if env is None else env
    found = []
    for var, who in _SENDERS:
        if env.get(var):
            found.append(who)
    if not found and any(k.startswith("SLURM_") for k in env):
        found.append(_SENDERS[0][1])
    if not found and any(k.startswith("TORCHELASTIC_") for k in env):
        found.append(_SENDERS[1][1])
    return found


def environment_lines(options: Optional[dict] = None, iters: Optional[list] = None, live: bool = False) -> list:
    """Short lines about this machine (and a run's limits) that bear on DataLoader failures, worded as the
    doctor words them."""
    options = options or {}
    info = torch_info(False)
    py = ".".join(map(str, sys.version_info[:3]))
    build = f"torch {info.version} ({info.build})" if info.version else "torch not installed"
    lines = [f"python {py}; {build}"]
    methods = sorted({it.get("start_method") for it in iters or [] if it.get("start_method")})
    if methods:
        sm = f"start method used by the DataLoader: {', '.join(methods)}"
    elif options.get("start_method"):
        sm = f"start method of the run: {options['start_method']}"
    else:
        chosen = multiprocessing.get_start_method(allow_none=True)
        sm = f"start method: {chosen or startmethod.current()}" + ("" if chosen else " (platform default)")
    lines.append(sm)
    for it in (iters or [])[:1]:
        parts = [f"{k}={it.get(k)}" for k in ("num_workers", "batch_size", "prefetch_factor", "timeout",
                                               "sharing_strategy", "pin_memory") if k in it]
        if parts:
            lines.append("DataLoader: " + ", ".join(parts))
    if options.get("shm_size"):
        lines.append(f"/dev/shm of the run: a private tmpfs of {format_size(options['shm_size'])}")
    else:
        lines.append(shm_line(shm_usage()))
    limits = nofile_limits()
    if limits and options.get("nofile"):
        lines.append(f"open-files limit of the run: {options['nofile']} (this shell: {nofile_line(limits)})")
    elif limits:
        lines.append(f"{NOFILE}: " + nofile_line(limits, open_fds() if live else None))
    line = "memory: " + memory_line(*memory())
    if options.get("memory_budget"):
        line += f"; run's memory budget: {format_size(options['memory_budget'])}"
    lines.append(line)
    if live:
        if not main_importable():
            lines.append("this __main__ has no file a new process could import (notebook, stdin or -c): "
                         "spawn/forkserver workers cannot import classes defined here")
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                lines.append(f"CUDA: available={torch.cuda.is_available()}, "
                             f"initialised in this process={torch.cuda.is_initialized()}")
            except Exception:  # noqa: BLE001
                pass
    return lines
