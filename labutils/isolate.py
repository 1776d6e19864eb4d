"""Run learner code in a fresh Python process, under per-run limits, and collect the evidence.

The Jupyter kernel only starts a child process and watches it: a segfault, an OOM kill, a hang or fd
exhaustion in the learner's loader ends that child, never the kernel. After every run, whatever its
outcome, no process of the run is left alive and no ``/dev/shm`` file it created remains.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import startmethod as _startmethod
from ._sizes import format_size, parse_size
from .result import ExceptionInfo, ProcessInfo, RunResult

START_METHODS = ("fork", "spawn", "forkserver")
_BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))
_SHM = "/dev/shm"


class IsolationError(ValueError):
    """A run_isolated argument the runner cannot honour; the message says what to do."""


# --------------------------------------------------------------------------- private /dev/shm
_shm_support: Optional[tuple] = None


def private_shm_support() -> tuple:
    """Return ``(argv_prefix, None)`` if a private /dev/shm can be mounted for a run, else ``(None, reason)``.

    Tries ``unshare --mount`` (root or CAP_SYS_ADMIN), then ``unshare --user --map-root-user --mount``
    (unprivileged user namespaces). The answer is cached for the process.
    """
    global _shm_support
    if _shm_support is not None:
        return _shm_support
    if not sys.platform.startswith("linux"):
        _shm_support = (None, f"a private /dev/shm needs Linux mount namespaces; this is {sys.platform}")
        return _shm_support
    unshare = shutil.which("unshare")
    if unshare is None:
        _shm_support = (None, "the `unshare` command (util-linux) is not installed")
        return _shm_support
    errors = []
    for extra in ([], ["--user", "--map-root-user"]):
        prefix = [unshare, *extra, "--mount", "--propagation", "private"]
        probe = prefix + ["sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {_SHM}"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if done.returncode == 0:
            _shm_support = (prefix, None)
            return _shm_support
        errors.append((done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"])
    _shm_support = (None, "this machine does not allow a private mount namespace (unshare: "
                    f"{errors[-1]}); run as root, enable unprivileged user namespaces, or skip this run")
    return _shm_support


# --------------------------------------------------------------------------- process bookkeeping
def _psutil():
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is in requirements.txt
        return None
    return psutil


def _alive(pid: int, create_time: Optional[float] = None) -> bool:
    psutil = _psutil()
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            return False  # the pid was reused by someone else
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class _Monitor(threading.Thread):
    """Samples the run's process tree: pids, peak memory, an optional series, and the memory budget."""

    def __init__(self, pid: int, interval: float, budget: Optional[int], detail: bool):
        super().__init__(daemon=True, name=f"labutils-monitor-{pid}")
        self.pid, self.interval, self.budget, self.detail = pid, interval, budget, detail
        self.seen: dict = {}  # pid -> {"create_time", "name", "ppid", "peak_rss", "peak_uss"}
        self.samples: list = []
        self.kills: list = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        psutil = _psutil()
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            now = round(time.monotonic() - self.t0, 3)
            for proc in procs:
                try:
                    with proc.oneshot():
                        rss = proc.memory_info().rss
                        info = self.seen.get(proc.pid)
                        if info is None:
                            info = self.seen[proc.pid] = {
                                "create_time": proc.create_time(), "ppid": proc.ppid(),
                                "name": proc.name(), "peak_rss": 0, "peak_uss": None,
                                "first_seen": now}
                        info["peak_rss"] = max(info["peak_rss"], rss)
                        info["last_seen"] = now
                        if self.detail:
                            full = proc.memory_full_info()
                            uss, pss = full.uss, getattr(full, "pss", None)
                            info["peak_uss"] = max(info["peak_uss"] or 0, uss)
                            self.samples.append({"t": now, "pid": proc.pid, "rss": rss, "uss": uss,
                                                 "pss": pss})
                    if self.budget is not None and rss > self.budget:
                        proc.kill()  # what the kernel OOM killer does: SIGKILL, no warning
                        self.kills.append({"pid": proc.pid, "rss": rss, "budget": self.budget,
                                           "t": now, "main": proc.pid == self.pid})
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.stop.wait(self.interval)


def _kill_tree(pgid: int, pids: Mapping[int, dict]) -> list:
    """SIGKILL the run's process group and any straggler that left it; return pids still alive."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, info in pids.items():
        if _alive(pid, info.get("create_time")):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 3.0
    left = [pid for pid, info in pids.items() if _alive(pid, info.get("create_time"))]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [pid for pid in left if _alive(pid, pids[pid].get("create_time"))]
    return left


def _shm_entries() -> set:
    try:
        return set(os.listdir(_SHM))
    except OSError:
        return set()


def _mapped_shm_inodes() -> set:
    """Inodes of /dev/shm files that some live process still has mapped (from /proc/*/maps).

    Inodes, not names: glibc creates a semaphore under a temporary name and links it to ``sem.mp-*``
    afterwards, so the maps show ``/dev/shm/sem.XXXXXX (deleted)`` for a semaphore that is alive.
    """
    inodes = set()
    prefix = _SHM + "/"
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if prefix in line:
                        fields = line.split()
                        if len(fields) >= 5 and fields[4].isdigit():
                            inodes.add(int(fields[4]))
        except OSError:
            continue
    return inodes


def _clean_shm(before: set, pids: set) -> list:
    """Remove /dev/shm files this run left: torch segments named after its pids, orphaned mp semaphores.

    ``torch_<pid>_...`` names carry the creating pid, so only this run's are touched. Semaphore names
    (``sem.mp-*``) carry no pid: one is removed only if it appeared during the run and no live process
    maps it any more, so a concurrent run's semaphores are never touched.
    """
    removed = []
    new = _shm_entries() - before
    sems = [n for n in new if n.startswith("sem.mp-")]
    mapped = _mapped_shm_inodes() if sems else set()
    for name in new:
        if name.startswith("torch_"):
            parts = name.split("_")
            owned = len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids
        elif name.startswith("sem.mp-"):
            try:
                owned = os.stat(os.path.join(_SHM, name)).st_ino not in mapped
            except OSError:
                owned = False
        else:
            owned = False
        if owned:
            try:
                os.unlink(os.path.join(_SHM, name))
                removed.append(name)
            except OSError:
                pass
    return sorted(removed)


def find_strays() -> list:
    """Pids of processes left over from finished isolated runs (their run directory is gone).

    Every process of a run, workers included, carries ``LABUTILS_RUN_DIR`` in its environment; the
    directory is deleted when the run is over, so a live process that still names a missing directory
    has outlived its run. Expected result: ``[]``.
    """
    psutil = _psutil()
    strays = []
    for proc in psutil.process_iter(["pid"]):
        try:
            run_dir = proc.environ().get("LABUTILS_RUN_DIR")
            if run_dir and not os.path.isdir(run_dir) and proc.status() != psutil.STATUS_ZOMBIE:
                strays.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return strays


def leftover_shm() -> list:
    """``/dev/shm`` entries named like PyTorch segments (``torch_*``) or multiprocessing semaphores."""
    return sorted(n for n in _shm_entries() if n.startswith(("torch_", "sem.mp-")))


# --------------------------------------------------------------------------- the runner
Target = Union[str, os.PathLike]


def _resolve_func(func: Union[Callable, str]) -> tuple:
    if isinstance(func, str):
        module, sep, qualname = func.partition(":")
        if not sep or not module or not qualname:
            raise IsolationError(f"func={func!r}: give a callable or a 'module:function' string")
        return module, qualname, None
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise IsolationError(f"func={func!r} is not a module-level function; define it at the top of a "
                             "module (e.g. with %%writefile) so a fresh process can import it")
    if module == "__main__":
        raise IsolationError(f"func={qualname} is defined in __main__ (this notebook), which a fresh process "
                             "cannot import; pass the code as a cell (%%isolate) or put it in a module file")
    path = None
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        pass
    return module, qualname, path


def run_isolated(
    code: Optional[str] = None,
    *,
    file: Optional[Target] = None,
    func: Union[Callable, str, None] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    argv: Sequence[str] = (),
    start_method: Optional[str] = None,
    timeout: Optional[float] = 60.0,
    memory_budget: Union[int, str, None] = None,
    shm_size: Union[int, str, None] = None,
    nofile: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    notebook_main: bool = False,
    cwd: Optional[Target] = None,
    sample_interval: float = 0.05,
    memory_detail: bool = False,
    python: Optional[str] = None,
) -> RunResult:
    """Run learner code in a fresh Python process and return what happened as a :class:`RunResult`.

    Give exactly one of ``code`` (the text of a cell; it is written to a real module file and run like
    ``python lab_cell.py``), ``file`` (a script, run unchanged with ``argv``) or ``func`` (a module-level
    callable or ``"module:function"``, called with ``args``/``kwargs``; its JSON-able return value is kept).

    Limits, each enforced for this run only:

    * ``start_method``: ``"fork"``, ``"spawn"`` or ``"forkserver"`` (multiprocessing default if None);
    * ``timeout``: seconds before the whole process group is SIGKILLed (outcome ``timed_out``); a
      Python stack dump of the main process is taken first. ``None`` waits forever (not advised);
    * ``memory_budget``: bytes or "500M"; a watchdog SIGKILLs any process of the run whose RSS exceeds it,
      as the kernel OOM killer would (``result.watchdog_kills`` says it was the lab's watchdog);
    * ``shm_size``: the run sees a private tmpfs of that size on /dev/shm (Linux mount namespace); where the
      OS refuses, the outcome is ``unsupported`` with the reason, and nothing runs;
    * ``nofile``: soft RLIMIT_NOFILE inside the run; ``env``: extra environment variables;
    * ``notebook_main``: run ``code`` (or the file's text) in a ``__main__`` without ``__file__``, as in a
      notebook or ``python -c``: spawn/forkserver children cannot import classes defined there.

    ``memory_detail=True`` also samples USS/PSS of every process each ``sample_interval`` seconds into
    ``result.samples`` (costlier; for the memory lessons).
    """
    given = [x is not None for x in (code, file, func)]
    if sum(given) != 1:
        raise IsolationError("give exactly one of code=, file= or func=")
    if start_method is not None and start_method not in START_METHODS:
        raise IsolationError(f"start_method={start_method!r}: use one of {', '.join(START_METHODS)}")
    if start_method is not None and start_method != "spawn" and sys.platform == "win32":
        raise IsolationError("only 'spawn' exists on Windows; run the lab under WSL for fork/forkserver")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise IsolationError(f"timeout={timeout!r}: give a positive number of seconds (or None)")
    budget = parse_size(memory_budget) if memory_budget is not None else None
    shm = parse_size(shm_size) if shm_size is not None else None
    if shm is not None and shm < 64 * 1024:
        raise IsolationError(f"shm_size={shm_size!r} is below 64 KiB; give e.g. '8M'")
    if nofile is not None and (not isinstance(nofile, int) or nofile < 16):
        raise IsolationError(f"nofile={nofile!r}: give an integer of at least 16 (Python needs a few fds)")
    if notebook_main and func is not None:
        raise IsolationError("notebook_main=True needs code= or file=, not func=")

    try:
        lab_default = _startmethod.requested()
    except ValueError as exc:
        raise IsolationError(str(exc)) from None
    options = {"start_method": start_method, "lab_default_start_method": lab_default,
               "timeout": timeout, "memory_budget": budget, "shm_size": shm,
               "nofile": nofile, "notebook_main": notebook_main, "env": dict(env or {})}

    prefix: list = []
    if shm is not None:
        prefix, reason = private_shm_support()
        if prefix is None:
            return RunResult(outcome="unsupported", reason=f"shm_size={format_size(shm)}: {reason}",
                             options=options)

    run_dir = tempfile.mkdtemp(prefix="labutils-run-")
    try:
        cfg: dict = {"start_method": start_method, "nofile": nofile}
        if code is not None:
            path = os.path.join(run_dir, "lab_cell.py")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(code)
            cfg.update(mode="notebook_main" if notebook_main else "file", path=path, argv=list(argv))
        elif file is not None:
            path = os.path.abspath(os.fspath(file))
            if not os.path.isfile(path):
                raise IsolationError(f"file={os.fspath(file)!r} does not exist; check the path")
            cfg.update(mode="notebook_main" if notebook_main else "file", path=path, argv=list(argv))
        else:
            module, qualname, src = _resolve_func(func)
            cfg.update(mode="func", module=module, qualname=qualname, args=list(args),
                       kwargs=dict(kwargs or {}), argv=list(argv), sys_path0=os.getcwd())
            try:
                json.dumps([cfg["args"], cfg["kwargs"]])
            except TypeError as exc:
                raise IsolationError(f"args/kwargs must be JSON values (numbers, strings, lists): {exc}") from None
        with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(cfg, fh)
        return _execute(run_dir, cfg, options, prefix, shm, budget, timeout, env, cwd, sample_interval,
                        memory_detail, python or sys.executable)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _execute(run_dir, cfg, options, prefix, shm, budget, timeout, env, cwd, interval, detail, python):
    cmd = [python, _BOOTSTRAP, run_dir]
    if prefix:
        mount = f"mount -t tmpfs -o size={shm},mode=1777 tmpfs {_SHM} && exec \"$@\""
        cmd = [*prefix, "sh", "-c", mount, "sh", *cmd]
    child_env = dict(os.environ)
    child_env.update({str(k): str(v) for k, v in (env or {}).items()})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env["LABUTILS_RUN_DIR"] = run_dir
    out_path, err_path = os.path.join(run_dir, "stdout.txt"), os.path.join(run_dir, "stderr.txt")
    shm_before = _shm_entries()
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                                cwd=os.fspath(cwd) if cwd else None, start_new_session=True)
    monitor = _Monitor(proc.pid, interval, budget, detail)
    monitor.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        if hasattr(signal, "SIGUSR1"):
            try:
                proc.send_signal(signal.SIGUSR1)  # faulthandler: where is the main process stuck?
                proc.wait(timeout=0.5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    except BaseException:  # KeyboardInterrupt in the kernel: still leave nothing behind
        monitor.stop.set()
        _kill_tree(proc.pid, monitor.seen)
        proc.wait()
        raise
    finally:
        wall = time.monotonic() - t0
    monitor.stop.set()
    monitor.join(timeout=5)
    pids = dict(monitor.seen)
    procs_log = _read_jsonl(os.path.join(run_dir, "procs.jsonl"))
    for rec in procs_log:
        pids.setdefault(rec["pid"], {"create_time": None})
    left = _kill_tree(proc.pid, pids)
    proc.wait()
    removed = [] if prefix else _clean_shm(shm_before, set(pids) | {proc.pid})

    final = _read_json(os.path.join(run_dir, "final.json")) or {}
    exits = {p["pid"]: p.get("exitcode") for p in final.get("processes", [])}
    workers = []
    for rec in procs_log:
        info = monitor.seen.get(rec["pid"], {})
        kill = next((k for k in monitor.kills if k["pid"] == rec["pid"]), None)
        workers.append(ProcessInfo(
            pid=rec["pid"], name=rec.get("name", ""), role="dataloader_worker"
            if rec.get("target", "").endswith("_worker_loop") else "process",
            exitcode=exits.get(rec["pid"]), peak_rss=info.get("peak_rss"), peak_uss=info.get("peak_uss"),
            killed_by_watchdog=kill is not None))
    exc_chain = [ExceptionInfo(**e) for e in (_read_json(os.path.join(run_dir, "exc.json")) or [])]
    loader_log = _read_jsonl(os.path.join(run_dir, "loader.jsonl"))
    rc = proc.returncode
    if timed_out:
        outcome = "timed_out"
    elif rc == 0:
        outcome = "ok"
    else:
        outcome = "failed"
    main_info = monitor.seen.get(proc.pid, {})
    return RunResult(
        outcome=outcome,
        returncode=rc,
        signal=-rc if rc is not None and rc < 0 else None,
        workers=workers,
        exceptions=exc_chain,
        loader_events=loader_log,
        stdout=_read_text(out_path),
        stderr=_read_text(err_path),
        wall_time=wall,
        peak_rss=main_info.get("peak_rss"),
        watchdog_kills=list(monitor.kills),
        samples=monitor.samples,
        processes_seen=len(pids),
        stray_processes=left,
        shm_removed=removed,
        reason=(f"no result within {timeout:g} s; the runner killed the whole process group" if timed_out
                else None),
        options=options,
        value=_read_json(os.path.join(run_dir, "value.json")),
        values=_merge(_read_jsonl(os.path.join(run_dir, "emitted.jsonl"))),
    )


def _merge(records: list) -> dict:
    out: dict = {}
    for rec in records:
        if isinstance(rec, dict):
            out.update(rec)
    return out


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().replace("\x00", "")
    except OSError:
        return ""


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _read_jsonl(path: str) -> list:
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
