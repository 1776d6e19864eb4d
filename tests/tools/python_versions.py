"""Run every notebook and solution under other Pythons' venvs and print one table of the results.

    python tests/tools/python_versions.py --venv /work/venv313 --venv /work/venv312
    python tests/tools/python_versions.py --venv /work/venv313 --start-method fork,spawn notebooks/08_*.ipynb
    python tests/tools/python_versions.py --venv /work/venv312 --wrap /work/tools/cpuslot --log-dir /tmp/pyver

Each notebook is tested exactly as plain ``pytest`` tests it (pyproject's addopts: nbval-lax, the lab's
pytest plugin, its leak check), in a pytest of its own started by the venv's Python, serially (``-n 0``),
under one default start method (``--lab-start-method M --lab-also-start-method none``), with this
checkout first on ``PYTHONPATH`` so that the venv imports this tree's labutils whatever it has installed.
``--wrap CMD`` puts a command in front of each of those pytests (``/work/tools/cpuslot`` on a shared
machine: the CPU lock is then taken per notebook and others get their turn in between).

The table: notebook, Python (the venv's version), start method, passed/failed, the first failing cell
(nbval's code-cell number, then its index in ``nb["cells"]``), the first line of that cell's error, and
the seconds pytest itself took for the notebook (time spent waiting in ``--wrap`` is not counted; say
"loaded machine" beside these figures when others were running). ``--markdown`` prints it as a Markdown
table. Exit status: 0 when every notebook passed under every venv and method, 1 when any failed, 2 for a
bad option or a missing venv (one line saying which).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("fork", "forkserver", "spawn")
# a colour code, raw or as pytest's JUnit XML escapes the ESC character ("#x1B[31m")
_ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;?]*[A-Za-z]")
# the line where a Python exception's message starts, as a traceback ends: "AssertionError: ...", "x.y.Error"
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout))\b(?::.*)?$")


_HEAD = re.compile(r"^([A-Za-z_][\w.]*)\s{2,}Traceback \(most recent call last\)")
# IPython's marker of the line that raised: "----> 28 assert ..." (older IPython), "---> 28 ..." (newer), any length
_ARROW = re.compile(r"^-+>\s*(\S.*)$")


class UsageError(Exception):
    """A bad option: printed as one line, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Venv:
    path: Path
    python: Path
    version: str  # "3.13.0"


@dataclasses.dataclass
class Result:
    notebook: str  # relative to ROOT where possible
    python: str
    method: str
    passed: bool
    cell: str = ""  # "Cell 9 (cells[17])"
    error: str = ""  # first line of the failing cell's error
    seconds: float = 0.0
    log: str = ""  # where the pytest output was kept, if --log-dir


def default_notebooks(root: Path = ROOT) -> list:
    folder = root / "notebooks"
    return sorted(folder.glob("[0-9][0-9]*_*.ipynb")) + sorted((folder / "solutions").glob("*.ipynb"))


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python tests/tools/python_versions.py", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files or globs (default: every notebook and solution)")
    parser.add_argument("--venv", action="append", default=[], metavar="DIR", help="a venv to test (repeatable)")
    parser.add_argument("--start-method", action="append", default=[], metavar="M",
                        help="fork, forkserver or spawn; repeatable or comma-separated (default: fork)")
    parser.add_argument("--wrap", default="", metavar="CMD", help="a command put in front of each notebook's pytest")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds per notebook (900)")
    parser.add_argument("--log-dir", default="", metavar="DIR", help="keep each notebook's pytest output here")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--root", default=str(ROOT), metavar="DIR", help=argparse.SUPPRESS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed its own line already
        raise UsageError("") from exc
    return _validate(args)


def _validate(args: argparse.Namespace) -> argparse.Namespace:
    if not args.venv:
        raise UsageError("--venv: give at least one venv folder (e.g. --venv /work/venv313)")
    methods = []
    for value in args.start_method or ["fork"]:
        for item in value.split(","):
            item = item.strip()
            if item not in METHODS:
                raise UsageError(f"--start-method {item!r}: use one of {', '.join(METHODS)}")
            if item not in methods:
                methods.append(item)
    args.start_method = methods
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: give a number of seconds above 0")
    args.wrap = shlex.split(args.wrap)
    if args.wrap and not _is_command(args.wrap[0]):
        raise UsageError(f"--wrap {args.wrap[0]!r}: no such command")
    args.root = Path(args.root).resolve()
    args.notebooks = _notebooks(args.notebooks, args.root)
    args.venv = [find_venv(v) for v in args.venv]
    return args


def _is_command(name: str) -> bool:
    from shutil import which

    return which(name) is not None


def _notebooks(given: list, root: Path) -> list:
    if not given:
        found = default_notebooks(root)
        if not found:
            raise UsageError(f"no notebooks under {root / 'notebooks'}")
        return found
    out = []
    for pattern in given:
        matches = sorted(glob.glob(pattern)) or sorted(glob.glob(str(root / pattern)))
        matches = [Path(m).resolve() for m in matches if m.endswith(".ipynb")]
        if not matches:
            raise UsageError(f"{pattern}: no notebook (.ipynb) matches")
        out.extend(m for m in matches if m not in out)
    return out


def find_venv(path: str) -> Venv:
    """The venv at ``path`` and its Python's version; UsageError when it is not a working venv."""
    folder = Path(path).expanduser()
    python = folder / "bin" / "python"
    if not folder.is_dir():
        raise UsageError(f"--venv {path}: no such folder (make it with: PYTHON -m venv {path})")
    if not python.exists():
        raise UsageError(f"--venv {path}: not a venv (no bin/python in it)")
    try:
        proc = subprocess.run([str(python), "-c", "import platform, pytest, nbval; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--venv {path}: its Python does not start ({exc})") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--venv {path}: cannot import pytest and nbval ({last}); "
                         f"install the requirements: {python} -m pip install -r requirements.txt")
    return Venv(folder, python, proc.stdout.strip())


def pytest_command(venv: Venv, notebook: Path, method: str, junit: Path, root: Path) -> list:
    """The pytest that plain ``pytest`` would run for this one notebook, serially, under ``method``."""
    return [str(venv.python), "-m", "pytest", "-c", str(root / "pyproject.toml"), "--rootdir", str(root),
            "-p", "labsuite.pytest_plugin", "-n", "0", "--lab-start-method", method, "--lab-also-start-method", "none",
            f"--junitxml={junit}", "-q", "-rN", str(notebook)]


def child_env(root: Path, venv: Venv) -> dict:
    env = dict(os.environ)
    tests = root / "tests"  # labsuite, the suite's plugin: a notebook outside notebooks/ has no conftest to load it
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(tests), *[p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p and Path(p).resolve() not in (root, tests)]])
    env["PATH"] = os.pathsep.join([str(venv.path / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv.path)
    env.pop("LABUTILS_START_METHOD", None)  # --lab-start-method sets it
    return env


def run_one(venv: Venv, notebook: Path, method: str, args: argparse.Namespace) -> Result:
    rel = _rel(notebook, args.root)
    with tempfile.TemporaryDirectory(prefix="pyver-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [*args.wrap, *pytest_command(venv, notebook, method, junit, args.root)]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=args.root, env=child_env(args.root, venv), capture_output=True,
                                  text=True, timeout=args.timeout, start_new_session=True)
            output, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + _text(exc.stderr)
            rc = None
        wall = time.monotonic() - started
        report = junit.read_text() if junit.exists() else ""
        if args.log_dir and report:
            _log_path(args, venv, method, notebook).with_suffix(".xml").write_text(report)
    result = from_junit(report, rel, venv.version, method, rc, output, wall, root=args.root)
    if rc is None:
        result.passed, result.error = False, f"no result within --timeout {args.timeout:g} s"
    if args.log_dir:
        log = _log_path(args, venv, method, notebook)
        log.write_text(" ".join(shlex.quote(c) for c in cmd) + f"\n# exit status {rc}\n" + output)
        result.log = str(log)
    return result


def _log_path(args: argparse.Namespace, venv: Venv, method: str, notebook: Path) -> Path:
    folder = Path(args.log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{venv.version}-{method}-{notebook.stem}.log"


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)


def from_junit(report: str, notebook: str, python: str, method: str, rc, output: str, wall: float,
               root: Path = ROOT) -> Result:
    """One notebook's result from pytest's JUnit XML (``report``), its exit status and its output."""
    result = Result(notebook, python, method, passed=(rc == 0), seconds=wall)
    if not report:
        if rc != 0:
            result.error = _last_line(output) or f"pytest exit status {rc}, no report"
        return result
    tree = ET.fromstring(report)
    suite = tree if tree.tag == "testsuite" else tree.find("testsuite")
    if suite is not None and suite.get("time"):
        result.seconds = float(suite.get("time"))
    for case in tree.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            continue
        result.passed = False
        result.cell = _cell_label(case.get("name", ""), notebook, root)
        result.error = error_line((bad.text or "") + "\n" + (bad.get("message") or ""))
        return result
    if rc not in (0, None) and not result.error:  # every cell passed, the session failed (e.g. its leak check)
        result.passed = False
        result.error = _session_failure(output, rc)
    return result


def error_line(text: str) -> str:
    """The first line of the exception a failing cell's traceback ends with (ANSI colour codes removed)."""
    lines = [line.rstrip() for line in _ANSI.sub("", text).splitlines()]
    # IPython heads each exception of a chain with "NAME   Traceback (most recent call last)": the last one was
    # raised, and its message starts at the first "NAME: ..." after that head (a message may quote other errors)
    heads = [(at, m.group(1)) for at, m in ((i, _HEAD.match(x.strip())) for i, x in enumerate(lines)) if m]
    if heads:
        start, name = heads[-1]
        for at in range(start + 1, len(lines)):
            line = lines[at].strip()
            if line == name or line.startswith(name + ":"):
                lines = lines[:at + 1]  # the search below ends here
                break
    for at, line in reversed(list(enumerate(lines))):
        match = _EXC_LINE.match(line.strip())
        if match:
            if line.strip().rstrip(":") == match.group(1):  # no message (a bare assert): name the line instead
                arrow = [m.group(1).strip() for m in (_ARROW.match(x.strip()) for x in lines[:at]) if m]
                return (line.strip().rstrip(":") + (f" at {arrow[-1]}" if arrow else ""))[:200]
            return line.strip()[:200]
    for line in lines:  # nbval's own reason ("Timeout of 240 seconds exceeded executing cell", ...)
        if line.strip().startswith(("Cell ", "Timeout", "Notebook cell execution failed")) and ":" in line:
            return line.strip()[:200]
    return (next((line.strip() for line in lines if line.strip()), "") or "no message")[:200]


def _cell_label(name: str, notebook: str, root: Path = ROOT) -> str:
    """nbval's "Cell N" (N counts code cells only) with the cell's index in ``nb["cells"]``."""
    match = re.fullmatch(r"Cell (\d+)", name)
    if not match:
        return name
    index = code_cell_index(notebook, int(match.group(1)), root)
    return f"{name} (cells[{index}])" if index is not None else name


def code_cell_index(notebook: str, n: int, root: Path = ROOT):
    path = Path(notebook) if Path(notebook).is_absolute() else root / notebook
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    code = [i for i, cell in enumerate(cells) if cell.get("cell_type") == "code"]
    return code[n] if n < len(code) else None


def _session_failure(output: str, rc) -> str:
    text = _ANSI.sub("", output)
    for line in text.splitlines():
        if line.startswith("labutils:") and "/dev/shm" in line:
            return line.strip()[:200]
    return f"pytest exit status {rc}: {_last_line(output)}"[:200]


def _last_line(output: str) -> str:
    lines = [line.strip() for line in _ANSI.sub("", output).splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


COLUMNS = ("notebook", "Python", "start method", "result", "first failing cell", "error", "seconds")


def rows(results: list) -> list:
    return [(r.notebook, r.python, r.method, "passed" if r.passed else "FAILED", r.cell or "-", r.error or "-",
             f"{r.seconds:.1f}") for r in results]


def table(results: list, markdown: bool = False) -> str:
    body = rows(results)
    if markdown:
        def line(cells):
            return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

        return "\n".join([line(COLUMNS), line(["---"] * len(COLUMNS)), *map(line, body)])
    widths = [max(len(str(row[i])) for row in [COLUMNS, *body]) for i in range(len(COLUMNS))]
    widths[5] = min(widths[5], 100)
    out = []
    for row in [COLUMNS, *body]:
        cells = [str(c)[:widths[i]].ljust(widths[i]) for i, c in enumerate(row)]
        cells[-1] = str(row[-1]).rjust(widths[-1])
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def summary(results: list) -> str:
    failed = [r for r in results if not r.passed]
    by_python = {}
    for r in results:
        by_python.setdefault(r.python, [0, 0])[0 if r.passed else 1] += 1
    parts = [f"Python {py}: {ok} passed, {bad} failed" for py, (ok, bad) in by_python.items()]
    return f"{len(results)} runs, {len(failed)} failed ({'; '.join(parts)})"


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        if str(exc):
            print(f"python_versions: {exc}", file=sys.stderr)
        return 2
    results = []
    for venv in args.venv:
        for method in args.start_method:
            for notebook in args.notebooks:
                result = run_one(venv, notebook, method, args)
                results.append(result)
                state = "passed" if result.passed else f"FAILED {result.cell} {result.error}"
                print(f"[{venv.version} {method}] {result.notebook}: {state} ({result.seconds:.1f} s)", flush=True)
    print()
    print(table(results, markdown=args.markdown))
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
