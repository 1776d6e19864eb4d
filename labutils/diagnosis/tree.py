"""The process tree of a run: which process printed or raised what, at any depth.

A DataLoader need not run in the main process: a launcher starts a child (``multiprocessing.Process``,
``torch.multiprocessing.spawn``, a ``ProcessPoolExecutor`` job) and the loader's workers are grandchildren.
Their errors reach the record in three shapes, each tied here to the child that produced it:

* ``stderr``: ``multiprocessing`` prints ``Process NAME:`` and the child's traceback when its target raises;
* ``ProcessRaisedException`` (torch.multiprocessing.spawn): the main process re-raises the child's traceback
  under ``-- Process N terminated with the following error:``; ``ProcessExitedException`` says a child died;
* ``_RemoteTraceback`` (concurrent.futures): the job's traceback text, as the ``__cause__`` of its exception.

The runner records no parent pid and no start method per process: a child's start method is read from its
name (``SpawnProcess-1``) or its traceback's frames, a grandchild's parent from the chain of the child that
names it (``DataLoader worker (pid N) ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .evidence import _worker_pids_named, last_chain, plain_text, printed_chains
from .messages import signal_from_word

__all__ = ["ProcNode", "build_tree"]

_HEADER = re.compile(r"^Process (.+):$")
_SPAWN_ERR = re.compile(r"^\s*-- Process (\d+) terminated with the following error:\s*$", re.M)
_SPAWN_EXIT = re.compile(r"process (\d+) terminated with (?:signal (\w+)|exit code (-?\d+))")
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


def printed_blocks(stderr: str) -> list:
    """``(name, chain)`` of each ``Process NAME:`` block multiprocessing printed in stderr."""
    lines = stderr.split("\n")
    return [(m.group(1), chain) for start, chain in printed_chains(stderr, headless=False)
            if start and (m := _HEADER.match(lines[start - 1]))]


def _remote_text(message: str) -> str:
    text = (message or "").strip()
    if text.startswith('"""') and text.endswith('"""'):
        text = text[3:-3]
    return text.strip("\n")


def build_tree(result, default_method: Optional[str] = None) -> list:
    """The run's processes as :class:`ProcNode`, the main process first."""
    main = ProcNode(None, "main", exitcode=result.returncode)
    nodes = [main]
    children = [w for w in (result.workers or []) if w.role != "dataloader_worker"]
    by_name: dict = {}
    for w in result.workers or []:
        role = "worker" if w.role == "dataloader_worker" else "child"
        node = ProcNode(w.pid, role, None, w.name or "", _method_of(w.name or "", "", default_method), w.exitcode)
        nodes.append(node)
        by_name.setdefault(node.name, node)
    for name, chain in printed_blocks(plain_text(result.stderr)):
        node = by_name.get(name)
        if node is None:  # a process the runner did not record (a child of a child): known by name only
            node = ProcNode(None, "child", None, name)
            nodes.append(node)
            by_name[name] = node
        if not node.chain:
            node.chain, node.via = chain, "stderr"
            node.start_method = _method_of(name, "\n".join(e.traceback for e in chain),
                                           node.start_method or default_method)
    _from_main_chain(result, nodes, children)
    _add_grandchildren(result, nodes)
    return nodes


def _from_main_chain(result, nodes: list, children: list) -> None:
    """Children's errors the main process re-raised (torch.multiprocessing.spawn, concurrent.futures)."""
    spawned = [w for w in children if (w.name or "").startswith("SpawnProcess")] or children
    for e in result.exceptions or []:
        msg = plain_text(e.message)
        m = _SPAWN_ERR.search(msg)
        if m:
            node = _child_node(nodes, spawned, int(m.group(1)))
            node.chain, node.via = last_chain(msg[m.end():].strip("\n")), "ProcessRaisedException"
            node.start_method = node.start_method or "spawn"
            continue
        m = _SPAWN_EXIT.search(msg) if e.type == "ProcessExitedException" else None
        if m:
            node = _child_node(nodes, spawned, int(m.group(1)))
            node.via = "ProcessExitedException"
            if m.group(2):
                node.exitcode = -(signal_from_word(m.group(2)) or 0) or node.exitcode
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
                node.chain, node.via = last_chain(text), "_RemoteTraceback"


def _child_node(nodes: list, spawned: list, index: int) -> ProcNode:
    if index < len(spawned):
        return next(n for n in nodes if n.pid == spawned[index].pid)
    node = ProcNode(None, "child", None, f"process {index}")
    nodes.append(node)
    return node


def _add_grandchildren(result, nodes: list) -> None:
    """Workers of a child: named in the child's chain; exit statuses from the deaths the runner saw."""
    known = {n.pid for n in nodes if n.pid is not None}
    status = {}
    for ev in result.events:
        pid = ev.get("pid")
        if ev.get("signal"):
            status[pid] = -ev["signal"]
        elif ev.get("exitcode") is not None:
            status.setdefault(pid, ev["exitcode"])
    for node in list(nodes):
        if node.role != "child" or not node.chain:
            continue
        for pid in _worker_pids_named(node.chain):
            if pid not in known:
                nodes.append(ProcNode(pid, "worker", node.pid, "", None, status.get(pid)))
                known.add(pid)
