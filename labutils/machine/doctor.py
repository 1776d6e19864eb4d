"""Preflight of this machine for multi-process data loading: ``labutils.doctor()`` / ``labutils doctor``.

Each check is one :class:`CheckResult` with a status (``OK``, ``WARN``, ``FAIL``), what was measured and
what to do about it. Nothing here changes the process: the start method is read without fixing the
default context, CUDA is inspected without being initialised, and no worker is started.
"""

from __future__ import annotations

import argparse
import configparser
import glob
import html
import json
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

from ..runner import capabilities, startmethod
from ..runner.sizes import format_size, parse_size
from ..runner.spec import whole_number
from . import probes

__all__ = ["CheckResult", "DoctorReport", "doctor", "doctor_main", "shm_budget"]

GiB = 1024**3
_RANK = {"OK": 0, "WARN": 1, "FAIL": 2}

SHM_WARN_TOTAL = 1 * GiB  # below this /dev/shm is "small" (Docker's default is 64 MiB)
NOFILE_WARN_SOFT = 4096
MEM_WARN_AVAILABLE = 2 * GiB


@dataclass
class CheckResult:
    """One line of the doctor's report: ``name`` (``shm``, ``nofile``...), ``status`` (OK, WARN, FAIL),
    ``detail`` (what was measured), ``advice`` (what to do, or empty), ``data`` (the numbers, for programs)."""

    name: str
    status: str
    detail: str
    advice: str = ""
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"status must be one of OK, WARN, FAIL, not {self.status!r}")

    def __str__(self) -> str:
        line = f"{self.status:<4} {self.name:<15} {self.detail}"
        return f"{line}\n{'':<20}-> {self.advice}" if self.advice else line


@dataclass
class DoctorReport:
    """All checks of one :func:`doctor` run: ``.checks``, ``.ok`` (no FAIL), ``.worst``, ``to_dict()``."""

    checks: list
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    @property
    def worst(self) -> str:
        return max((c.status for c in self.checks), key=_RANK.__getitem__, default="OK")

    def __getitem__(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def __contains__(self, name: object) -> bool:
        return any(c.name == name for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "worst": self.worst,
            "elapsed_s": round(self.elapsed_s, 3),
            "checks": [asdict(c) for c in self.checks],
        }

    def __str__(self) -> str:
        lines = [str(c) for c in self.checks]
        lines.append(f"-- worst: {self.worst} ({len(self.checks)} checks in {self.elapsed_s:.2f} s)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colors = {"OK": "#1a7f37", "WARN": "#9a6700", "FAIL": "#cf222e"}
        rows = []
        for c in self.checks:
            advice = f"<br><i>{html.escape(c.advice)}</i>" if c.advice else ""
            rows.append(
                f"<tr><td style='color:{colors[c.status]};font-weight:bold'>{c.status}</td>"
                f"<td><code>{html.escape(c.name)}</code></td>"
                f"<td style='text-align:left'>{html.escape(c.detail)}{advice}</td></tr>"
            )
        return (
            "<table><thead><tr><th>status</th><th>check</th><th style='text-align:left'>detail</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>"
            f"<p>worst: <b>{self.worst}</b>, {len(self.checks)} checks in {self.elapsed_s:.2f} s</p>"
        )


def _check_python() -> CheckResult:
    v = sys.version_info
    detail = f"Python {platform.python_version()} ({platform.python_implementation()}) on {sys.platform}"
    if v < (3, 9):
        return CheckResult("python", "WARN", detail, "this lab is tested with Python >= 3.9")
    return CheckResult("python", "OK", detail, data={"version": platform.python_version()})


def _check_torch(info: probes.TorchInfo) -> CheckResult:
    if info.error is not None:
        return CheckResult(
            "torch", "FAIL", f"cannot import torch ({info.error})",
            "install it: pip install -r requirements.txt (or the wheel for your platform from pytorch.org)",
        )
    if info.module is None:
        how = "not imported here; read from its version.py"
    elif info.import_s:
        how = f"imported in {info.import_s:.1f} s"
    else:
        how = "already imported"
    data = {"version": info.version, "cuda": info.cuda, "imported": info.module is not None}
    if info.version is None:
        return CheckResult("torch", "WARN", f"torch installed at {info.location} but its version is unknown "
                           f"({how})", "reinstall torch: pip install -r requirements.txt", data=data)
    return CheckResult("torch", "OK", f"torch {info.version} ({info.build}; {how})", data=data)


_MEANING = {
    "fork": "workers are forked: the dataset is inherited (copy-on-write), nothing is pickled",
    "spawn": "workers start a fresh interpreter: dataset, collate_fn and worker_init_fn are pickled and "
             "their classes re-imported",
    "forkserver": "workers fork from a clean server process: dataset, collate_fn and worker_init_fn are "
                  "pickled and their classes re-imported",
}


def _check_start_method(planned: Optional[str]) -> CheckResult:
    default = startmethod.current()
    available = multiprocessing.get_all_start_methods()
    method = planned or default
    if method not in available:
        return CheckResult(
            "start_method", "FAIL", f"start method {method!r} is not available here (available: "
            f"{', '.join(available)})", f"use one of: {', '.join(available)}",
            data={"default": default, "planned": planned, "available": available},
        )
    why = {
        "fork": "the Linux default up to Python 3.13",
        "forkserver": "the Linux default from Python 3.14",
        "spawn": "the macOS and Windows default",
    }.get(default, "")
    source = f"planned {method}; default here is {default}" if planned else f"{default} ({why})"
    return CheckResult("start_method", "OK", f"{source}: {_MEANING.get(method, '')}",
                       data={"default": default, "planned": planned, "effective": method})


def _check_main(method: str) -> CheckResult:
    importable = probes.main_importable()
    data = {"importable": importable, "start_method": method}
    if importable:
        return CheckResult("main_importable", "OK", "__main__ is a file: workers can import its classes",
                           data=data)
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    what = f"__main__ is {main_file!r}, not a readable file" if main_file else (
        "__main__ has no file (notebook, `python -c` or stdin)")
    if method == "fork":
        return CheckResult("main_importable", "OK", f"{what}; fine with fork, nothing is re-imported",
                           data=data)
    return CheckResult(
        "main_importable", "WARN",
        f"{what}: {method} workers cannot import a Dataset, collate_fn or worker_init_fn defined here",
        "move them into a .py module and import it (labutils.run_isolated does this for a cell)",
        data=data,
    )


def _check_shm(probe: Optional[tuple]) -> CheckResult:
    if sys.platform == "darwin":
        return CheckResult("shm", "OK", "macOS has no /dev/shm: POSIX shared memory has no fixed-size tmpfs")
    if sys.platform == "win32":
        return CheckResult("shm", "OK", "Windows has no /dev/shm: tensors are shared through file mappings")
    if probe is None:
        return CheckResult(
            "shm", "FAIL", f"{probes.SHM_PATH} is missing: workers cannot hand tensors to the main process",
            "mount a tmpfs there (`mount -t tmpfs -o size=2g tmpfs /dev/shm`), or in Docker run with "
            "--shm-size=2g or --ipc=host",
        )
    total, free = probe
    data = {"total_bytes": total, "free_bytes": free}
    detail = probes.shm_line(probe)
    if total < SHM_WARN_TOTAL:
        return CheckResult(
            "shm", "WARN", f"{detail} (small: Docker's default is 64 MiB)",
            "give it more: docker run --shm-size=2g (or --ipc=host), Kubernetes: an emptyDir with "
            "medium: Memory on /dev/shm; or use smaller batches / fewer workers / prefetch_factor",
            data=data,
        )
    return CheckResult("shm", "OK", detail, data=data)


def in_flight_rule(batch_bytes: int, num_workers: int, prefetch_factor: int) -> int:
    """Bytes of /dev/shm a loader can hold at its worst: ``prefetch_factor x num_workers`` batches that the
    workers have ready or are building, plus 2 in the main process (the loop's batch and the next one);
    notebook 05 measures it."""
    return batch_bytes * (num_workers * prefetch_factor + 2)


def shm_budget(
    batch_bytes: int | str,
    prefetch_factor: int = 2,
    num_workers: int = 1,
    free_shm: int | str | None = None,
) -> CheckResult:
    """Compare :func:`in_flight_rule` with the free /dev/shm (measured when ``free_shm`` is None).

    ``batch_bytes`` is an int or a size like ``"12M"``. FAIL when the estimate exceeds the free space, WARN
    above half of it; ``data`` holds ``estimate_bytes``, ``free_bytes`` and ``fraction``.
    """
    batch = parse_size(batch_bytes)
    if prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1, not {prefetch_factor}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, not {num_workers}")
    if free_shm is None:
        probe = probes.shm_usage()
        if probe is None:
            return CheckResult("shm_budget", "WARN", f"cannot measure {probes.SHM_PATH} (missing or not Linux)",
                               "check the shm line above", data={"estimate_bytes": None})
        free = probe[1]
    else:
        free = parse_size(free_shm)
    estimate = in_flight_rule(batch, num_workers, prefetch_factor) if num_workers else 0
    fraction = estimate / free if free else (None if estimate else 0.0)  # None: no free space at all
    data = {"estimate_bytes": estimate, "free_bytes": free, "fraction": fraction,
            "batch_bytes": batch, "prefetch_factor": prefetch_factor, "num_workers": num_workers}
    if num_workers == 0:
        return CheckResult("shm_budget", "OK", "num_workers=0: batches stay in this process, no shm used",
                           data=data)
    detail = (f"{format_size(batch)} per batch x ({prefetch_factor} prefetched x {num_workers} workers + 2 "
              f"in the loop) = {format_size(estimate)} in flight; {format_size(free)} free"
              + (f" ({fraction:.0%})" if fraction is not None else ""))
    advice = ("lower num_workers, prefetch_factor or the batch size, or give /dev/shm more room "
              "(docker --shm-size, --ipc=host)")
    if estimate > free:
        return CheckResult("shm_budget", "FAIL", detail + ": workers will fail with 'unable to allocate "
                           "shared memory' / No space left on device, or die of SIGBUS", advice, data=data)
    if estimate > free / 2:
        return CheckResult("shm_budget", "WARN", detail + ": little headroom if the loop keeps batches",
                           advice, data=data)
    return CheckResult("shm_budget", "OK", detail, data=data)


def _check_nofile() -> CheckResult:
    limits = probes.nofile_limits()
    if limits is None:
        return CheckResult("nofile", "OK", "RLIMIT_NOFILE does not exist on this platform")
    (soft, hard), fds = limits, probes.open_fds()
    unlimited = probes.RLIM_INFINITY
    data = {"soft": soft, "hard": hard, "open_fds": fds}
    detail = f"{probes.NOFILE}: " + probes.nofile_line(limits, fds)
    advice = (
        "raise the soft limit: `ulimit -n 65536` in the shell that starts Jupyter/Python, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)) before creating the loader; or "
        "torch.multiprocessing.set_sharing_strategy('file_system')"
    )
    if soft != unlimited and soft < NOFILE_WARN_SOFT:
        return CheckResult("nofile", "WARN", detail + f" (below {NOFILE_WARN_SOFT}: the default "
                           "file_descriptor sharing strategy keeps one fd per shared tensor)", advice, data=data)
    if soft != unlimited and fds is not None and fds > soft / 2:
        return CheckResult("nofile", "WARN", detail + " (more than half used)", advice, data=data)
    return CheckResult("nofile", "OK", detail, data=data)


def _check_memory() -> CheckResult:
    total, available = probes.memory()
    limit, usage, version = probes.cgroup_memory()
    data = {"total_bytes": total, "available_bytes": available, "cgroup": version,
            "cgroup_limit_bytes": limit, "cgroup_usage_bytes": usage}
    detail = probes.memory_line(total, available)
    effective = available
    if limit is not None:
        room = limit - (usage or 0)
        detail += f"; cgroup {version} limit {format_size(limit)}, {format_size(max(room, 0))} left"
        effective = min(available, max(room, 0))
    else:
        detail += f"; no cgroup memory limit{f' ({version})' if version else ''}"
    data["effective_available_bytes"] = effective
    if effective < MEM_WARN_AVAILABLE:
        return CheckResult(
            "memory", "WARN", detail + " (little room: each worker can grow to a full copy of a "
            "Python-object dataset, and the OOM killer sends SIGKILL)",
            "fewer workers; keep the dataset in numpy/arrow buffers instead of lists of Python objects",
            data=data,
        )
    return CheckResult("memory", "OK", detail, data=data)


def _check_cpus(num_workers: Optional[int]) -> CheckResult:
    cpus = probes.cpu_count()
    quota = probes.cgroup_cpus()
    usable = min(cpus, max(1, int(quota))) if quota else cpus
    data = {"cpus": cpus, "cgroup_quota": quota, "usable": usable, "num_workers": num_workers}
    detail = f"{cpus} CPUs usable by this process" + (f", cgroup quota {quota:g}" if quota else "")
    if num_workers is None:
        return CheckResult("cpus", "OK", detail + f"; num_workers up to {usable} keeps one worker per CPU",
                           data=data)
    if num_workers > usable:
        return CheckResult(
            "cpus", "WARN", detail + f"; num_workers={num_workers} is more than that: workers will "
            "compete with each other and the training loop",
            f"use num_workers <= {usable} (measure throughput for a few values)", data=data,
        )
    return CheckResult("cpus", "OK", detail + f"; num_workers={num_workers} fits", data=data)


def _check_cuda(info: probes.TorchInfo, method: str) -> CheckResult:
    if info.error is not None:
        return CheckResult("cuda", "OK", "torch not importable: CUDA not checked")
    built = info.cuda
    cuda = getattr(info.module, "cuda", None)  # None when torch is not imported: CUDA cannot be initialised
    initialised = bool(cuda is not None and cuda.is_initialized())
    data = {"built_with_cuda": built, "initialized": initialised}
    if initialised and method == "fork":
        return CheckResult(
            "cuda", "WARN", "CUDA is already initialised in this process and workers are forked: a worker "
            "that touches CUDA fails ('Cannot re-initialize CUDA in forked subprocess')",
            "keep CUDA out of Dataset/collate (move to the GPU in the training loop), or use "
            "multiprocessing_context='spawn'", data=data,
        )
    if not built:
        return CheckResult("cuda", "OK", "CPU-only torch build: no CUDA; pin_memory has nothing to pin for",
                           data=data)
    state = "initialised" if initialised else "not initialised"
    return CheckResult("cuda", "OK", f"built with CUDA {built}; CUDA {state} in this process", data=data)


LOGIND_CONF = "/etc/systemd/logind.conf"
LOGIND_DROPINS = ("/usr/lib/systemd/logind.conf.d", "/usr/local/lib/systemd/logind.conf.d",
                  "/run/systemd/logind.conf.d", "/etc/systemd/logind.conf.d")
SYSTEM_UID_MAX = 999  # logind leaves system users' IPC alone (SYS_UID_MAX of login.defs, usually 999)


def _removeipc_setting(main_conf: str, dropin_dirs: Sequence[str]) -> tuple:
    """``(value or None, files read, files unreadable)`` of logind's RemoveIPC=, later files winning."""
    dropins: dict = {}
    for d in dropin_dirs:  # a drop-in of the same name in a later directory replaces the earlier one
        for path in glob.glob(os.path.join(d, "*.conf")):
            dropins[os.path.basename(path)] = path
    files = [main_conf] + [dropins[name] for name in sorted(dropins)]
    conf = configparser.ConfigParser(strict=False, interpolation=None, allow_no_value=True)
    conf.optionxform = str  # systemd's keys are case-sensitive
    try:
        read = conf.read(files, encoding="utf-8")
    except configparser.Error:
        read = []
    unreadable = [path for path in files if path not in read and os.path.exists(path)]
    value = conf.get("Login", "RemoveIPC", fallback=None)
    return (value.strip().lower() if value else None), read, unreadable


def _check_removeipc(uid: Optional[int] = None, systemd_running: Optional[bool] = None,
                     main_conf: str = LOGIND_CONF, dropin_dirs: Sequence[str] = LOGIND_DROPINS) -> CheckResult:
    """Will systemd-logind delete this user's /dev/shm files and semaphores at their last logout?"""
    if not sys.platform.startswith("linux"):
        return CheckResult("removeipc", "OK", "not Linux: no systemd-logind to remove your IPC at logout")
    if systemd_running is None:
        systemd_running = os.path.isdir("/run/systemd/system")  # what sd_booted() tests
    if not systemd_running:
        return CheckResult("removeipc", "OK", "systemd is not running here (no /run/systemd/system): no logind "
                           "removes IPC at logout")
    uid = os.getuid() if uid is None else uid
    if uid <= SYSTEM_UID_MAX:
        return CheckResult("removeipc", "OK", f"uid {uid} is {'root' if uid == 0 else 'a system user'}: "
                           "logind's RemoveIPC leaves its /dev/shm files alone", data={"uid": uid})
    value, read, unreadable = _removeipc_setting(main_conf, dropin_dirs)
    data = {"uid": uid, "value": value, "files": read, "unreadable": unreadable}
    if value in ("no", "false", "0", "off"):
        return CheckResult("removeipc", "OK", f"RemoveIPC={value} in {read[-1] if read else main_conf}",
                           data=data)
    where = f"RemoveIPC={value}" if value else "RemoveIPC is not set (systemd's default is yes)"
    if unreadable:
        where += f"; could not read {', '.join(unreadable)}"
    return CheckResult(
        "removeipc", "WARN",
        f"{where}: when your last session ends (the last SSH logout), systemd-logind deletes your /dev/shm "
        "files and semaphores, and a loader still running fails (FileNotFoundError on a SemLock, "
        "'could not unlink the shared memory file')",
        "keep the job out of your login sessions: `loginctl enable-linger` (your user manager stays), a "
        "scheduler or a system service; or ask the admin for RemoveIPC=no in /etc/systemd/logind.conf",
        data=data,
    )


def doctor(
    num_workers: Optional[int] = None,
    batch_bytes: int | str | None = None,
    prefetch_factor: int = 2,
    start_method: Optional[str] = None,
    *,
    import_torch: bool = False,
    runner_probes: bool = False,
) -> DoctorReport:
    """Check this machine and process for multi-process data loading; ``report.ok`` is False on any FAIL.

    Checks: python, torch, start_method, main_importable, shm, shm_budget (only with ``batch_bytes``),
    nofile, memory (and the cgroup limit), cpus (against ``num_workers``), cuda, removeipc, runner (what
    the isolated runner may do here). The planned ``num_workers``, ``batch_bytes``, ``prefetch_factor``
    and ``start_method`` (the platform's when None) refine them. ``import_torch`` imports torch to prove
    it works (1-5 s) instead of reading its version file; ``runner_probes`` also tries a systemd scope and
    a private /dev/shm (seconds).
    """
    t0 = time.perf_counter()
    torch = probes.torch_info(import_torch)
    method = start_method or startmethod.current()
    shm = probes.shm_usage() if sys.platform not in ("darwin", "win32") else None
    checks = [
        _check_python(),
        _check_torch(torch),
        _check_start_method(start_method),
        _check_main(method),
        _check_shm(shm),
    ]
    if batch_bytes is not None:
        workers = num_workers if num_workers is not None else probes.cpu_count()
        budget = shm_budget(batch_bytes, prefetch_factor, workers, shm[1] if shm else None)
        if num_workers is None:
            budget.detail += f" (num_workers not given: assumed {workers}, one per CPU)"
        checks.append(budget)
    checks += [_check_nofile(), _check_memory(), _check_cpus(num_workers),
               _check_cuda(torch, method), _check_removeipc()]
    # the runner's capabilities: each tried once, and the fallback in use
    checks.append(CheckResult(**capabilities.doctor_check(runner_probes)))
    return DoctorReport(checks, time.perf_counter() - t0)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="labutils doctor",
        description="Preflight of this machine for PyTorch DataLoader workers. Exit code 0 when no check "
                    "FAILs, 1 when one does, 2 for a bad option.",
    )
    p.add_argument("--num-workers", type=whole_number(0), metavar="N", help="planned DataLoader num_workers")
    p.add_argument("--batch-bytes", type=_size_arg, metavar="B",
                   help="bytes of one collated batch, e.g. 12M or 3145728 (K/M/G are 1024-based)")
    p.add_argument("--prefetch-factor", type=whole_number(1), default=2, metavar="P",
                   help="planned prefetch_factor (default 2)")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], metavar="M",
                   help="planned start method: fork, spawn or forkserver (default: the platform's)")
    p.add_argument("--import-torch", action="store_true",
                   help="import torch to prove it works (1-5 s) instead of reading its version file")
    p.add_argument("--runner", action="store_true", help="also try a systemd scope and a private /dev/shm")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def doctor_main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``doctor`` command: print the report; return 0 (no FAIL), 1 (a FAIL) or 2 (bad option)."""
    try:
        args = _parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse already printed usage and the reason to stderr
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    report = doctor(num_workers=args.num_workers, batch_bytes=args.batch_bytes,
                    prefetch_factor=args.prefetch_factor, start_method=args.start_method,
                    import_torch=args.import_torch, runner_probes=args.runner)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(doctor_main())
