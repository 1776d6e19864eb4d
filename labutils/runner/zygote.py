"""The warm launcher: ``python zygote.py FD``, a template process that has imported torch once and forks
one child per isolated run (``warm.refusal`` says which runs may start here).

The child is made to look like ``python bootstrap.py RUN_DIR`` started fresh by the runner: the same
interpreter and flags, its own session, stdio, working directory and environment, a new multiprocessing
identity (authkey, process counter), reseeded RNGs, no inherited descriptors beyond 0-2, and a normal
interpreter exit (atexit handlers run).

Executed by path (``warm`` imports only :func:`send`). The protocol, one JSON line each way on the
socket ``FD`` (a socketpair with the runner), one request at a time:

* ``{"op": "spawn", "run_dir", "cwd", "env"}`` with stdout and stderr descriptors attached
  (SCM_RIGHTS) -> ``{"pid": N}`` with a pidfd of the child attached; where ``pidfd_open`` fails, the
  child is killed and reaped at once and the answer is ``{"error": ..., "pid": N}``;
* ``{"op": "reap", "pid"}`` -> ``{"status": wait status}``: the child is reaped only when the runner
  says so, after it has killed the child's process group (until then its pid cannot be reused);
* ``{"op": "ping"}`` -> ``{"ok": true, "pid": N}``.

End of file on the socket (the runner's process exited) ends the template; children still running are
the runner's to kill, and it does.
"""

from __future__ import annotations

import sys

AT_START = frozenset(sys.modules)  # what a fresh interpreter has imported before its script (see bootstrap)

import atexit  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")


def _preload() -> list:
    """What a run's main process imports anyway before its first batch (nothing that starts a thread pool
    it would keep: OpenBLAS's idle thread is re-created by its own at-fork handler in the child). Returns
    the exit handlers these imports registered, ``[(importing, func, args, kwargs)]`` in their order, with
    the modules whose import was under way at the time (``importing``): a run's child registers each again
    when the script imports one of those, as a fresh process would register it then (see the bootstrap's
    ``_follow_imports``)."""
    handlers, register = [], atexit.register

    def recording(func, *args, **kwargs):
        handlers.append((_importing(), func, args, kwargs))
        return register(func, *args, **kwargs)

    atexit.register = recording
    try:
        _import_torch()
    finally:
        atexit.register = register
    # What the template imported stays alive in every child: frozen, it is out of the cyclic collector's
    # sight, so a child's collections (the interpreter's exit runs several) neither walk those objects nor
    # write to their pages (each write would copy a page from the template).
    gc.freeze()
    return handlers


def _importing() -> tuple:
    """The modules whose import is under way here, outermost first (their module-level frames)."""
    names, frame = [], sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") not in (None, "__main__"):
            names.append(frame.f_globals["__name__"])
        frame = frame.f_back
    return tuple(reversed(names))


def _import_torch() -> None:
    """torch first, as a script imports it: an exit handler registered on the way is then known to come
    with ``import torch`` (multiprocessing's comes with it too)."""
    try:
        import torch  # noqa: F401
        import torch.multiprocessing  # noqa: F401
        import torch.utils.data  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken torch: the runs themselves will show why
        pass
    import multiprocessing.connection  # noqa: F401
    import multiprocessing.queues  # noqa: F401
    import multiprocessing.synchronize  # noqa: F401


def _readline(sock: socket.socket, buf: bytearray, fds: list) -> bytes | None:
    while b"\n" not in buf:
        data, anc, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
        if not data:
            return None
        buf.extend(data)
        fds.extend(anc)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def send(sock: socket.socket, obj: dict, fds: tuple = ()) -> None:
    data = json.dumps(obj).encode("utf-8") + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _become_run(sock: socket.socket, req: dict, out_fd: int, err_fd: int, handlers: list, code) -> None:
    """In the forked child: turn into a fresh-looking bootstrap process, then run the bootstrap."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sock.close()
    os.closerange(3, _max_fd())
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    import multiprocessing.process as mp_process

    mp_process.ORIGINAL_DIR = os.path.abspath(req["cwd"])
    mp_process._process_counter = __import__("itertools").count(1)
    mp_process._children = set()
    mp_process.current_process()._config["authkey"] = mp_process.AuthenticationString(os.urandom(32))
    mp_process.current_process()._config.pop("tempdir", None)  # a pymp-* folder is made per run, in its TMPDIR
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # read TMPDIR again: the run's own folder, not the template's
    _reseed()
    sys.argv = [BOOTSTRAP, req["run_dir"]]
    # The exit handlers of the template's imports run in the child as in a fresh process: after the
    # bootstrap's first one (which records the run's exit codes last), before the script's.
    atexit._clear()
    import types

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=BOOTSTRAP, __builtins__=sys.modules["builtins"],
                           _TEMPLATE_EXIT_HANDLERS=handlers, _TEMPLATE_AT_START=AT_START)
    sys.modules["__main__"] = module
    # The bootstrap runs as this process's main module, not through runpy: what escapes it (SystemExit, a
    # KeyboardInterrupt) reaches the interpreter as it would from ``python bootstrap.py``, and the
    # interpreter's own exit follows, teardown included.
    exec(code, module.__dict__)  # noqa: S102


def _reseed() -> None:
    """Draw new seeds from the OS, as a fresh process does: ``import torch`` seeded torch's default CPU
    generator once, in the template, and nothing reseeds it at fork (torch registers no at-fork hook), so
    without this every warm run would share ``torch.initial_seed()``, shuffle orders and worker seeds.
    CUDA is never initialised in the template, so the CPU generator is the only one to reseed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.seed()
        except Exception:  # noqa: BLE001, S110 - a broken torch: the run's own import shows why
            pass
    # numpy's global RandomState, from the OS as in a fresh process, where the template has one: numpy 2
    # imports numpy.random only when first used, so ``np.random`` here would import it into every run
    # (14 ms a run, and a module a fresh ``import torch`` does not load); a run that uses it later
    # imports it then, seeded from the OS as in a fresh process
    mtrand = sys.modules.get("numpy.random")
    if mtrand is not None:
        mtrand.seed()


def _max_fd() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if 0 < soft < (1 << 20) else 1 << 16
    except (ImportError, ValueError, OSError):
        return 1 << 16


def serve(fd: int):
    """Answer requests until the runner goes; return the request to run in a forked child, or None."""
    sock = socket.socket(fileno=fd)
    buf, fds = bytearray(), []
    while True:
        line = _readline(sock, buf, fds)
        if line is None:
            return None
        req = json.loads(line)
        op = req.get("op")
        if op == "ping":
            send(sock, {"ok": True, "pid": os.getpid()})
        elif op == "spawn":
            out_fd, err_fd = fds[0], fds[1]
            del fds[:2]
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return sock, req, out_fd, err_fd
            os.close(out_fd)
            os.close(err_fd)
            try:
                pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError) as exc:
                # without a handle the runner could not supervise the run: end it here, before it
                # does anything, rather than leave an unwatched copy of the learner's script running
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                send(sock, {"error": f"pidfd_open failed ({exc}); the run was killed and reaped", "pid": pid})
                continue
            send(sock, {"pid": pid}, (pidfd,))
            os.close(pidfd)
        elif op == "reap":
            try:
                _pid, status = os.waitpid(int(req["pid"]), 0)
            except ChildProcessError:
                status = None
            send(sock, {"status": status})
        else:
            send(sock, {"error": f"unknown op {op!r}"})


if __name__ == "__main__":
    exit_handlers = _preload()
    with open(BOOTSTRAP, "rb") as fh:  # compiled once for every run (the runner retires a template whose
        boot = compile(fh.read(), BOOTSTRAP, "exec")  # bootstrap changed: warm.process_state)
    job = serve(int(sys.argv[1]))
    if job is None:
        os._exit(0)  # the runner is gone; the template has nothing to finish
    _become_run(*job, exit_handlers, boot)
