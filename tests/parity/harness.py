"""The runner's differential check: a corpus script run under plain ``python`` and under the lab, and what
a user would observe of each, side by side.

A case is a ``*.py`` file of this folder (``*.broken``: a script that does not compile) whose first line
is ``# parity: FLAGS``, or a folder holding such a ``main.py`` (a script with modules of its own). Flags,
separated by spaces:

* ``fast``: in the fast subset (plain ``pytest``); the rest runs only with ``--lab-matrix``;
* ``torch``: the script imports torch (slower; a longer default timeout);
* ``diagnose``: also compared under ``python -m labutils diagnose --json`` (a process of its own);
* ``code``: also compared as a cell's code (``run_isolated(code)``, what ``%%isolate`` runs);
* ``shm``: the script prints ``shm-name: NAME`` for each /dev/shm file it makes; whether each is still
  there after the run is compared;
* ``race``: the outcome is a race: the lab's outcome must be one that python shows in a few runs
  (``tests/tools/parity_soak.py`` compares the distributions);
* ``intended=NAME``: the lab differs on purpose; :data:`INTENDED` says how (the test checks that exact
  difference and nothing else);
* ``argv=A,B``: the script's arguments; ``timeout=S``; ``link=NAME``: run through a symlink ``NAME``
  to the main file (the folder case ``symlinked``).

What is compared (:class:`Seen`): the exit status (a negative number: the signal), stdout and stderr
(normalised only for the case's folder, the lab's temporary folders, pids and addresses), the files the
script wrote in its working folder, the processes still alive in that folder after the run, and the
/dev/shm files named by the script that are left. Plain python runs with ``PYTHONUNBUFFERED=1`` and
stdin from /dev/null, as every isolated run does (``unflushed_os_exit`` pins what that changes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SITE = HERE / "_site"
STARTMETHOD_PY = REPO / "labutils" / "runner" / "startmethod.py"


@dataclasses.dataclass
class Case:
    name: str
    source: Path  # the script, or the folder holding main.py
    main: str  # the file to run, relative to the copied folder
    flags: frozenset
    opts: dict

    @property
    def fast(self) -> bool:
        return "fast" in self.flags

    @property
    def timeout(self) -> float:
        return float(self.opts.get("timeout", 90 if "torch" in self.flags else 30))

    @property
    def argv(self) -> list:
        value = self.opts.get("argv")
        return value.split(",") if value else []

    @property
    def intended(self) -> Optional[str]:
        return self.opts.get("intended")


def _header(path: Path) -> Optional[tuple]:
    try:
        first = path.read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("# parity:"):
        return None
    flags, opts = set(), {}
    for word in first[len("# parity:"):].split():
        key, sep, value = word.partition("=")
        if sep:
            opts[key] = value
        else:
            flags.add(key)
    return frozenset(flags), opts


def cases() -> list:
    """Every case of the corpus, sorted by name."""
    out = []
    for path in sorted(HERE.iterdir()):
        if path.is_file() and path.suffix in (".py", ".broken"):  # .broken: python cannot compile it
            head, main = _header(path), path.name
        elif path.is_dir() and not path.name.startswith("_"):
            mains = sorted(path.rglob("main.py"))
            head = _header(mains[0]) if mains else None
            main = str(mains[0].relative_to(path)) if mains else ""
        else:
            continue
        if head is not None:
            out.append(Case(path.stem if path.is_file() else path.name, path, main, *head))
    return out


def by_name(name: str) -> Case:
    return next(c for c in cases() if c.name == name)


# --------------------------------------------------------------------------- one observation
@dataclasses.dataclass
class Seen:
    """What a user can observe of one run."""

    rc: Optional[int]
    stdout: str
    stderr: str
    files: dict
    left: int  # processes of the run still alive after it ended
    shm_left: list

    def outcome(self) -> tuple:
        """Everything but the texts' exact order across streams: what the soak's distributions count."""
        return (self.rc, self.stdout, self.stderr, tuple(sorted(self.files.items())), self.left,
                tuple(self.shm_left))


def differences(python: Seen, lab: Seen) -> list:
    """The fields where the lab's run differs from python's: ``[(field, python's, lab's)]``."""
    return [(f.name, getattr(python, f.name), getattr(lab, f.name)) for f in dataclasses.fields(Seen)
            if getattr(python, f.name) != getattr(lab, f.name)]


def prepare(case: Case, root: Path) -> Path:
    """Copy the case into a fresh folder under ``root``; return the path to run (absolute)."""
    work = root / case.name
    if work.exists():
        shutil.rmtree(work)
    if case.source.is_dir():
        shutil.copytree(case.source, work, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        work.mkdir(parents=True)
        shutil.copy(case.source, work / case.source.name)
    script = work / case.main
    link = case.opts.get("link")
    if link:
        (work / link).symlink_to(script)
        script = work / link
    return script


_PID = re.compile(r"\b(pid[ =:(]*|process |parent=)\d+", re.IGNORECASE)
_ADDR = re.compile(r"0x[0-9a-fA-F]{4,}")
_LABTMP = re.compile(r"/tmp/(labutils-[\w.-]+|pymp-\w+)")
_SHMNAME = re.compile(r"^shm-name: (\S+)$", re.MULTILINE)


def normalise(text: str, work: Path) -> str:
    for path in {str(work), os.path.realpath(work)}:
        text = text.replace(path, "<DIR>")
    text = _LABTMP.sub("<LABTMP>", text)
    text = _PID.sub(lambda m: m.group(1) + "<N>", text)
    text = _ADDR.sub("0x<ADDR>", text)
    return _SHMNAME.sub("shm-name: <NAME>", text)


def _files(work: Path, before: set) -> dict:
    out = {}
    for path in sorted(work.rglob("*")):
        rel = str(path.relative_to(work))
        if rel in before or "__pycache__" in path.parts or not path.is_file():
            continue
        data = path.read_bytes()
        try:
            out[rel] = normalise(data.decode("utf-8"), work)
        except UnicodeDecodeError:
            out[rel] = "<binary>"
    return out


def _in_folder(work: Path) -> list:
    """Pids of processes whose working directory is the case's folder (every process a run starts there)."""
    real, found = os.path.realpath(work), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == real:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _alive_after(work: Path, grace: float = 5.0) -> int:
    """How many processes are still running in the folder once the run's helpers had ``grace`` seconds to
    go (a resource tracker or a fork server sees its pipe close and exits by itself: a fork server that
    preloaded torch took over a second on a loaded machine); those left are killed here."""
    deadline = time.monotonic() + grace
    while True:
        pids = [p for p in _in_folder(work) if not _zombie(p)]
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _shm_left(stdout: str) -> list:
    names = _SHMNAME.findall(stdout)
    deadline = time.monotonic() + 2.0  # a resource tracker removes what it was told of, a moment later
    while any(os.path.exists(f"/dev/shm/{n}") for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [n for n in names if os.path.exists(f"/dev/shm/{n}")]
    for name in left:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    return ["<NAME>"] * len(left)


def _seen(rc, texts, work: Path, before: set) -> Seen:
    """The observation, once the run's helpers are done: ``texts()`` reads stdout and stderr only then (a
    resource tracker prints its warnings after the main process has exited)."""
    left = _alive_after(work)
    out, err = texts()
    return Seen(rc, normalise(out, work), normalise(err, work), _files(work, before), left, _shm_left(out))


def _listing(work: Path) -> set:
    return {str(p.relative_to(work)) for p in work.rglob("*")}


# --------------------------------------------------------------------------- the three ways to run it
def python_env(method: Optional[str], *, unbuffered: bool = True) -> dict:
    """Plain python's environment: this one, stdout unbuffered as the lab's, and the lab's start-method
    switch applied by ``_site/sitecustomize.py`` when ``method`` is given."""
    env = dict(os.environ)
    env.pop("LABUTILS_START_METHOD", None)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    if method:
        env["LABUTILS_START_METHOD"] = method
        env["PARITY_STARTMETHOD_PY"] = str(STARTMETHOD_PY)
        env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), str(SITE)])
    return env


def run_python(case: Case, root: Path, method: Optional[str] = None, *, unbuffered: bool = True) -> Seen:
    script = prepare(case, root)
    work = root / case.name
    before = _listing(work)
    out_path, err_path = root / f"{case.name}.stdout", root / f"{case.name}.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:  # files, not pipes: a process the
        try:  # script leaves behind would hold a pipe open, and python's run would seem to last as long
            rc = subprocess.run([sys.executable, str(script), *case.argv], cwd=work, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, env=python_env(method, unbuffered=unbuffered),
                                timeout=case.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return _seen(rc, lambda: (out_path.read_text("utf-8", "replace"), err_path.read_text("utf-8", "replace")),
                 work, before)


def run_lab(case: Case, root: Path, launcher: str, method: Optional[str] = None, *, code: bool = False) -> Seen:
    """``run_isolated(file=...)`` (or, with ``code``, the script's text as a cell) with ``launcher``; the
    start method through the lab's own switch, as ``--lab-start-method`` gives it."""
    from labutils.runner import startmethod
    from labutils.runner.isolate import run_isolated

    script = prepare(case, root)
    work = root / case.name
    before = _listing(work)
    old = os.environ.get(startmethod.ENV)
    try:
        if method:
            os.environ[startmethod.ENV] = method
        target = {"code": script.read_text(encoding="utf-8")} if code else {"file": str(script)}
        r = run_isolated(**target, argv=case.argv, cwd=str(work), timeout=case.timeout, launcher=launcher)
    finally:
        if old is None:
            os.environ.pop(startmethod.ENV, None)
        else:
            os.environ[startmethod.ENV] = old
    rc = "timeout" if r.outcome == "timed_out" else r.returncode
    seen = _seen(rc, lambda: (r.stdout, r.stderr), work, before)
    seen.launcher = (r.launcher or {}).get("kind")  # type: ignore[attr-defined]
    return seen


def run_diagnose(case: Case, root: Path, method: Optional[str] = None) -> Seen:
    """``python -m labutils diagnose --json SCRIPT``: the run's status and texts from its report."""
    script = prepare(case, root)
    work = root / case.name
    before = _listing(work)
    env = python_env(None)
    env.pop("PYTHONUNBUFFERED", None)
    if method:
        env["LABUTILS_START_METHOD"] = method
    done = subprocess.run([sys.executable, "-m", "labutils", "diagnose", "--json", "--timeout", str(case.timeout),
                           str(script), *case.argv], cwd=work, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=case.timeout + 60)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"diagnose gave no JSON ({done.returncode}): {done.stderr.decode()[-2000:]}") from None
    rc = "timeout" if report.get("outcome") == "timed_out" else report.get("returncode")
    return _seen(rc, lambda: (report.get("stdout", ""), report.get("stderr", "")), work, before)


# --------------------------------------------------------------------------- intended differences
def _expect_unbuffered(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """The lab's stdout is unbuffered (PYTHONUNBUFFERED): text written without a newline before
    ``os._exit`` or a fatal signal is already in the file, where python's buffered stdout (a file or a pipe)
    loses it. The lab keeps it: it is evidence of how far the script got."""
    buffered = run_python(case, root, method, unbuffered=False)
    problems = differences(python, lab)
    if buffered.stdout != "" or "saved epoch 3" not in lab.stdout:
        problems.append(("buffered python loses the text, the lab keeps it", buffered.stdout, lab.stdout))
    return problems


def _expect_environment(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """A run's environment names the run (its folder, its runner: ``LABUTILS_RUN_DIR``,
    ``LABUTILS_RUNNER``) and may point the temporary folder at the run's own (``TMPDIR``, ``TEMP``,
    ``TMP``); nothing the script had is taken away."""
    import ast

    theirs, ours = set(ast.literal_eval(python.stdout)), set(ast.literal_eval(lab.stdout))
    problems = [d for d in differences(python, lab) if d[0] != "stdout"]
    added, removed = ours - theirs, theirs - ours
    if removed or not {"LABUTILS_RUN_DIR", "LABUTILS_RUNNER"} <= added <= ADDED_ENV:
        problems.append(("the variables a run adds", sorted(ADDED_ENV), sorted(added), sorted(removed)))
    return problems


#: what a run's environment has that the script's own would not
ADDED_ENV = frozenset({"LABUTILS_RUN_DIR", "LABUTILS_RUNNER", "TMPDIR", "TEMP", "TMP"})


def _expect_leftover(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """Nothing of a run is left running: python leaves the grandchild, the lab kills it."""
    problems = [d for d in differences(python, lab) if d[0] != "left"]
    if (python.left, lab.left) != (1, 0):
        problems.append(("left: python leaves 1, the lab 0", python.left, lab.left))
    return problems


def _expect_preloaded(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """A warm run's process has imported torch before the script (that is the template's point), and a
    process with torch imported ends differently: its teardown prints no ResourceWarning for a file left
    open (plain python with ``import torch`` at the top does the same). A cold run: exactly python."""
    if getattr(lab, "launcher", None) != "warm":
        return differences(python, lab)
    lost = [line for line in python.stderr.splitlines(keepends=True) if "ResourceWarning: unclosed file" in line]
    kept = "".join(line for line in python.stderr.splitlines(keepends=True) if line not in lost)
    problems = [d for d in differences(python, lab) if d[0] != "stderr"]
    if len(lost) != 1 or lab.stderr != kept:
        problems.append(("stderr: python's less its ResourceWarning line", kept, lab.stderr))
    return problems


def _expect_fatal_stack(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """A fatal error's stack (faulthandler) is the C-level walk of every frame of the thread: in the lab it
    goes on below the script's first frame into the frames of the bootstrap (and, warm, of the template)
    that run the script, and its list of extension modules has the lab's (a warm run's: torch's) too.
    Everything else is python's: the same signal, the same lines, the script's frames first."""
    def plain(text: str) -> list:
        lines = [line for line in text.splitlines() if "labutils/runner/" not in line
                 and not line.startswith("Extension modules:")]
        while lines and not lines[-1]:  # the blank line before the list of extension modules
            lines.pop()
        return lines

    problems = [d for d in differences(python, lab) if d[0] != "stderr"]
    own = [line for line in lab.stderr.splitlines() if "labutils/runner/" in line]
    if plain(python.stderr) != plain(lab.stderr) or not own:
        problems.append(("stderr, less the lab's own frames", plain(python.stderr), plain(lab.stderr)))
    return problems


INTENDED = {"fatal-stack": _expect_fatal_stack, "unbuffered": _expect_unbuffered, "environment": _expect_environment,
            "leftover": _expect_leftover, "preloaded": _expect_preloaded}


def check(case: Case, root: Path, method, python: Seen, lab: Seen) -> list:
    """The differences that are not intended (empty: the lab behaved as python)."""
    if case.intended:
        return INTENDED[case.intended](case, root, method, python, lab)
    return differences(python, lab)
