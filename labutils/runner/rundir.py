"""The run directory: its file names, and :class:`RunDir`, the one reader of what a run wrote there.

The runner, the bootstrap, the run's processes and the diagnosis read and write the directory through
these names. The bootstrap is executed by path and loads this file by path too (importing the package would
cost a run its start-up time), so it imports only the standard library. ``child.py`` is copied into the run
directory and loaded from there, so it repeats the names it writes (``STACKS``, ``CREATED_SHM``,
``CREATED_TMP``); ``tests/test_runner_rundir.py`` checks that they agree. Every file is read to a cap: a
run can write without end.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple

CONFIG = "config.json"  #: the run's settings, written by the runner before the run starts
RUNNER = "runner.json"  #: who runs it: the runner's pid and start ticks (clean-up after a dead runner)
STDOUT = "stdout.txt"
STDERR = "stderr.txt"
CELL = "lab_cell.py"  #: a cell's code, as a module file
PY = "py"  #: on the run's sys.path: the copy of child.py
CHILD_MODULE = "_labutils_child"
PROCS = "procs.jsonl"  #: each process the main process started
LOADER = "loader.jsonl"  #: DataLoader iterators, their errors and progress
EXITS = "exits.jsonl"  #: exit codes as the main process reaped them
CREATED_SHM = "created_shm.jsonl"  #: named semaphores the run's processes created, with inodes
CREATED_TMP = "created_tmp.jsonl"  #: multiprocessing's /tmp/pymp-* folders the run's processes made
EMITTED = "emitted.jsonl"  #: labutils.emit(...) records
VALUE = "value.json"  #: a func= run's return value
EXC = "exc.json"  #: the exception chain that ended the script
FINAL = "final.json"  #: exit codes of the processes the main process started
STACKS = "stacks"  #: faulthandler dumps, one file per pid
#: a notebook's kernel records (``kernel_preamble``) in this folder: its PROCS, its EXC and KERNEL_EXITS
KERNEL = "kernel"
KERNEL_EXITS = "exits.json"  #: exit codes of the processes the kernel started, by pid
#: the run's own temporary folder: TMPDIR, TEMP and TMP of the script and of every process below it
#: (multiprocessing's pymp-* folders, torchelastic's log folders, torch_shm_manager's socket folder,
#: mkstemp files), so whatever a killed process leaves there goes with the run directory
TMP = "tmp"
TMP_VARS = ("TMPDIR", "TEMP", "TMP")
#: where the run's temporary folder is when ``RUN_DIR/tmp`` would be too long: path, device, inode and
#: the token of its owner file
TMP_ELSEWHERE = "tmp_elsewhere.json"
#: AF_UNIX socket paths are at most 107 bytes; multiprocessing puts its listeners at
#: ``TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX`` (33 more) and torch's shm manager its socket 30 more deep
TMP_MAX_LEN = 70

#: the bootstrap's line when it cannot join the run's cgroup (exit code JOIN_FAILED): the run never started
JOIN_FAILED = 3
JOIN_FAILED_TEXT = "labutils: could not join the run's cgroup"


#: JSON evidence files are read to this size (a run that logs in a loop can write any amount)
JSONL_CAP = 16 * 2**20


def read_text(path: str, cap: int = JSONL_CAP) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(cap).replace("\x00", "")
    except OSError:
        return ""


def read_json(path: str, cap: int = JSONL_CAP) -> object:
    """A JSON file's value, or None where it is missing, cut or not JSON."""
    try:
        return json.loads(read_text(path, cap) or "null")
    except ValueError:
        return None


def read_jsonl(path: str, cap: int = JSONL_CAP) -> list:
    """The records of a JSON-lines file ([] where missing); a line that is not JSON is skipped."""
    return _records(read_text(path, cap).splitlines())


def _records(lines) -> list:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def read_capped(path: str, cap: int) -> tuple:
    """``(text, size, cut)``: a text file of any size read to ``cap`` bytes: whole when it fits, else its
    first and last ``cap // 2`` bytes with a line in between saying how many were cut."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= cap:
                data, cut = fh.read(cap + 1), 0
                size = len(data)
            else:
                head = fh.read(cap // 2)
                fh.seek(size - cap // 2)
                tail = fh.read(cap // 2)
                cut = size - len(head) - len(tail)
                data = (head + f"\n[... labutils: {cut} bytes cut here (output of {size} bytes, read to a cap "
                        f"of {cap}; see result.truncated) ...]\n".encode() + tail)
    except OSError:
        return "", 0, 0
    return data.decode("utf-8", "replace").replace("\x00", ""), size, cut


class Tail:
    """New complete JSON lines of a file written by the run, read incrementally."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return _records(lines)


class RunRecords(namedtuple("RunRecords", "procs created_shm created_tmp loader_events emitted final exc value")):
    """What a finished run's processes wrote, each file read once by :meth:`RunDir.read` (for the clean-up
    and the result), one field per :class:`RunDir` reader. Plain stdlib types: the bootstrap loads this
    module by path."""

    __slots__ = ()


class RunDir:
    """One run directory, read through one typed reader per file."""

    def __init__(self, path: str):
        self.path = path

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def procs(self) -> list:
        return [r for r in self._jsonl(PROCS) if isinstance(r.get("pid"), int)]

    def created_shm(self) -> dict:
        return {r["name"]: r.get("ino") for r in self._jsonl(CREATED_SHM) if isinstance(r.get("name"), str)}

    def created_tmp(self) -> list:
        return [(r["path"], r.get("ino")) for r in self._jsonl(CREATED_TMP)
                if isinstance(r.get("path"), str) and os.path.basename(r["path"]).startswith("pymp-")]

    def loader_events(self) -> list:
        return self._jsonl(LOADER)

    def emitted(self) -> dict:
        out: dict = {}
        for rec in self._jsonl(EMITTED):
            out.update(rec)
        return out

    def final(self) -> dict:
        final = read_json(self.join(FINAL))
        return final if isinstance(final, dict) else {}

    def exc(self) -> list:
        chain = read_json(self.join(EXC))
        return [e for e in chain if isinstance(e, dict)] if isinstance(chain, list) else []

    def value(self) -> object:
        return read_json(self.join(VALUE))

    def read(self) -> RunRecords:
        """Every record file, once."""
        return RunRecords(procs=self.procs(), created_shm=self.created_shm(), created_tmp=self.created_tmp(),
                          loader_events=self.loader_events(), emitted=self.emitted(), final=self.final(),
                          exc=self.exc(), value=self.value())

    def _jsonl(self, name: str) -> list:
        return [r for r in read_jsonl(self.join(name)) if isinstance(r, dict)]
