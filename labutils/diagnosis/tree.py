"""The process tree of a run: which process printed or raised what, at any depth.

The runner records the processes the run's main process started (``RunResult.workers``: pid, name, role,
exit status), every process death it saw at any depth (``RunResult.events``: pid, role, exit status), the
chain that ended the main process and its stderr. A DataLoader need not run in the main process: a launcher
starts a child (``multiprocessing.Process(target=train)``, ``torch.multiprocessing.spawn``, a
``concurrent.futures.ProcessPoolExecutor`` job) and the loader's workers are grandchildren. Their errors reach
the record in three shapes, each tied here to the child that produced it:

* ``stderr``: ``multiprocessing`` prints ``Process NAME:`` and the child's traceback when its target raises;
  NAME is the child's ``name`` in the runner's record;
* ``ProcessRaisedException`` (torch.multiprocessing.spawn): the main process re-raises the child's traceback
  text, headed ``-- Process N terminated with the following error:`` (N: the child's index);
  ``ProcessExitedException`` says a child died (``process N terminated with signal SIGSEGV``);
* ``_RemoteTraceback`` (concurrent.futures): the pool re-raises the job's exception in the main process, and
  its ``__cause__`` holds the job's traceback text.

The runner records no parent pid and no start method per process; a child's start method is read from its
name (``SpawnProcess-1``) or from the frames of its traceback (``spawn_main``, ``forkserver``), and a
grandchild's parent from the child's chain that names it (``DataLoader worker (pid N) ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .evidence import plain_text

__all__ = ["ProcNode", "build_tree"]

_HEADER = re.compile(r"^Process (.+):$")
_TB = "Traceback (most recent call last):"
_LINKS = ("The above exception was the direct cause of the following exception:",
          "During handling of the above exception, another exception occurred:")
_SPAWN_ERR = re.compile(r"^\s*-- Process (\d+) terminated with the following error:\s*$", re.M)
_SPAWN_EXIT = re.compile(r"process (\d+) terminated with (?:signal (\w+)|exit code (-?\d+))")
_SIGNUMS = {"SIGSEGV": 11, "SIGKILL": 9, "SIGBUS": 7, "SIGABRT": 6, "SIGFPE": 8, "SIGILL": 4, "SIGTERM": 15,
            "SIGINT": 2}
_METHOD_BY_NAME = (("ForkServerProcess", "forkserver"), ("SpawnProcess", "spawn"), ("ForkProcess", "fork"))


@dataclass
class ProcNode:
    """One process of the run and what it left in the record."""

    pid: Optional[int]
    role: str  # "main", "child" (started by a process of the run, not a DataLoader worker), "worker"
    parent: Optional[int] = None  # None: the main process (or not known for a worker)
    name: str = ""
    start_method: Optional[str] = None
    exitcode: Optional[int] = None
    via: str = ""  # how its error reached the record: "stderr", "ProcessRaisedException", "_RemoteTraceback"
    chain: list = field(default_factory=list)  # the error that ended it, outermost first (diagnose._Exc)
    text: str = ""  # the traceback text it printed or sent back
    candidates: tuple = ()  # a pool job: the pids of the pool's processes, one of which ran it

    def to_dict(self) -> dict:
        return {"pid": self.pid, "role": self.role, "parent": self.parent, "name": self.name,
                "start_method": self.start_method, "exitcode": self.exitcode, "via": self.via or None,
                "error": (self.chain[0].type + ": " + self.chain[0].head) if self.chain else None,
                "candidates": list(self.candidates) or None}


def _method_of(name: str, text: str, default: Optional[str] = None) -> Optional[str]:
    """A child's start method: its class's name prefix (``SpawnProcess-1``), the start-up frames of its
    traceback, else the run's default (a ``Process`` of the default context; its traceback printed by
    ``_bootstrap`` starts below the start-up frames)."""
    for prefix, method in _METHOD_BY_NAME:
        if name.startswith(prefix):
            return method
    if "forkserver.py" in text:
        return "forkserver"
    if re.search(r"spawn\.py\", line \d+, in (spawn_main|_main)", text):
        return "spawn"
    return default


def _chain_text(lines: list, start: int) -> tuple:
    """The text of the exception chain printed from ``lines[start]`` (a Traceback line) and where it ends:
    tracebacks joined by Python's link lines, each up to its exception line and the message after it."""
    i, out = start, []
    while i < len(lines):
        out.append(lines[i])
        i += 1
        while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
            out.append(lines[i])  # the frames
            i += 1
        if i < len(lines):
            out.append(lines[i])  # the exception line
            i += 1
        inner = None  # inside PyTorch's "Original Traceback" of a worker: None, "frames", "done"
        while i < len(lines):  # its message: up to a link to the next traceback or a new block
            line = lines[i]
            if line.strip() in _LINKS:
                out.append(line)
                i += 1
                while i < len(lines) and not lines[i].strip():
                    i += 1
                break
            if line.startswith(_TB) or _HEADER.match(line) or line.startswith("Exception in thread"):
                return "\n".join(out), i
            indented = line.startswith((" ", "\t")) or not line.strip()
            if line.startswith("Original Traceback"):
                inner = "frames"
            elif inner == "frames" and not indented:
                inner = "done"  # the worker's exception line ends the quoted traceback
            elif not indented:
                return "\n".join(out), i  # a line of someone else's output: the message ended above
            out.append(line)
            i += 1
        else:
            break
        if i >= len(lines) or not lines[i].startswith(_TB):
            break
    return "\n".join(out), i


def printed_blocks(stderr: str) -> list:
    """``(name, traceback text)`` of each ``Process NAME:`` block multiprocessing printed in stderr."""
    lines = (stderr or "").replace("\r", "").splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m and i + 1 < len(lines) and lines[i + 1].startswith(_TB):
            text, _ = _chain_text(lines, i + 1)
            out.append((m.group(1), text))
    return out


def _remote_text(message: str) -> str:
    text = (message or "").strip()
    if text.startswith('"""') and text.endswith('"""'):
        text = text[3:-3]
    return text.strip("\n")


def build_tree(result, parse_chain, worker_pids_named, default_method: Optional[str] = None) -> list:
    """The run's processes as :class:`ProcNode`, the main process first.

    ``parse_chain(text)`` turns a printed traceback into a chain (``diagnose._last_printed_chain``), and
    ``worker_pids_named(chain)`` lists the DataLoader worker pids its messages name."""
    main = ProcNode(None, "main", exitcode=getattr(result, "returncode", None))
    nodes = [main]
    children = [w for w in (result.workers or []) if w.role != "dataloader_worker"]
    by_name: dict = {}
    for w in result.workers or []:
        role = "worker" if w.role == "dataloader_worker" else "child"
        node = ProcNode(w.pid, role, None, w.name or "", _method_of(w.name or "", "", default_method), w.exitcode)
        nodes.append(node)
        by_name.setdefault(node.name, node)
    for name, text in printed_blocks(plain_text(result.stderr)):
        node = by_name.get(name)
        if node is None:  # a process the runner did not record (a child of a child): known by name only
            node = ProcNode(None, "child", None, name)
            nodes.append(node)
            by_name[name] = node
        if not node.chain:
            node.chain, node.text, node.via = parse_chain(text), text, "stderr"
            node.start_method = _method_of(name, text, node.start_method or default_method)
    _from_main_chain(result, nodes, children, parse_chain)
    _add_grandchildren(result, nodes, worker_pids_named)
    return nodes


def _from_main_chain(result, nodes: list, children: list, parse_chain) -> None:
    """Children's errors the main process re-raised (torch.multiprocessing.spawn, concurrent.futures)."""
    spawned = [w for w in children if (w.name or "").startswith("SpawnProcess")] or children
    for e in result.exceptions or []:
        msg = plain_text(e.message)
        m = _SPAWN_ERR.search(msg)
        if m:
            node = _child_node(nodes, spawned, int(m.group(1)))
            text = msg[m.end():].strip("\n")
            node.chain, node.text, node.via = parse_chain(text), text, "ProcessRaisedException"
            node.start_method = node.start_method or "spawn"
            continue
        m = _SPAWN_EXIT.search(msg) if e.type == "ProcessExitedException" else None
        if m:
            node = _child_node(nodes, spawned, int(m.group(1)))
            node.via = "ProcessExitedException"
            if m.group(2):
                node.exitcode = -_SIGNUMS.get(m.group(2), 0) or node.exitcode
            elif m.group(3):
                node.exitcode = int(m.group(3))
            continue
        if e.type.endswith("_RemoteTraceback"):
            text = _remote_text(msg)
            if len(children) == 1:
                node = next(n for n in nodes if n.pid == children[0].pid)
            else:
                node = ProcNode(None, "child", None, "a process of the pool",
                                candidates=tuple(w.pid for w in children))
                nodes.append(node)
            if not node.chain:
                node.chain, node.text, node.via = parse_chain(text), text, "_RemoteTraceback"


def _child_node(nodes: list, spawned: list, index: int) -> ProcNode:
    if index < len(spawned):
        return next(n for n in nodes if n.pid == spawned[index].pid)
    node = ProcNode(None, "child", None, f"process {index}")
    nodes.append(node)
    return node


def _add_grandchildren(result, nodes: list, worker_pids_named) -> None:
    """Workers of a child: named in the child's chain; exit statuses from the deaths the runner saw."""
    known = {n.pid for n in nodes if n.pid is not None}
    status = {}
    for ev in getattr(result, "events", None) or []:
        pid = ev.get("pid")
        if ev.get("signal"):
            status[pid] = -ev["signal"]
        elif ev.get("exitcode") is not None:
            status.setdefault(pid, ev["exitcode"])
    for node in list(nodes):
        if node.role != "child" or not node.chain:
            continue
        for pid in worker_pids_named(node.chain):
            if pid not in known:
                nodes.append(ProcNode(pid, "worker", node.pid, "", None, status.get(pid)))
                known.add(pid)
