"""The process tree of a run: which process printed or raised what, at any depth; and a DataLoader in a child
process, the child's own error explained like a script of its own.

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

from ..runner import startmethod
from .causes import LOADER_CAUSES, UNKNOWN
from .decide import decide_process, fixes_of
from .evidence import _exit_words, _Facts, _short, _worker_pids_named, last_chain, printed_chains
from .messages import signal_from_word
from .model import Diagnosis, probe_lines
from .rules import _unexplained

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


def build_tree(facts: _Facts, default_method: Optional[str] = None) -> list:
    """The run's processes as :class:`ProcNode`, the main process first."""
    main = ProcNode(None, "main", exitcode=facts.returncode)
    nodes = [main]
    children = [w for w in facts.workers if w.role != "dataloader_worker"]
    by_name: dict = {}
    for w in facts.workers:
        role = "worker" if w.role == "dataloader_worker" else "child"
        node = ProcNode(w.pid, role, None, w.name or "", _method_of(w.name or "", "", default_method), w.exitcode)
        nodes.append(node)
        by_name.setdefault(node.name, node)
    for name, chain in printed_blocks(facts.stderr):
        node = by_name.get(name)
        if node is None:  # a process the runner did not record (a child of a child): known by name only
            node = ProcNode(None, "child", None, name)
            nodes.append(node)
            by_name[name] = node
        if not node.chain:
            node.chain, node.via = chain, "stderr"
            node.start_method = _method_of(name, "\n".join(e.traceback for e in chain),
                                           node.start_method or default_method)
    _from_main_chain(facts, nodes, children)
    _add_grandchildren(facts, nodes)
    return nodes


def _from_main_chain(facts: _Facts, nodes: list, children: list) -> None:
    """Children's errors the main process re-raised (torch.multiprocessing.spawn, concurrent.futures)."""
    spawned = [w for w in children if (w.name or "").startswith("SpawnProcess")] or children
    for e in facts.ended:
        if e.origin == "quoted":  # a message quoted in the next link: no link of the record of its own
            continue
        msg = e.message
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
            if len(children) == 1:
                node = next(n for n in nodes if n.pid == children[0].pid)
            else:
                node = ProcNode(None, "child", None, "a process of the pool",
                                candidates=tuple(w.pid for w in children))
                nodes.append(node)
            if not node.chain:
                node.chain, node.via = last_chain(msg), "_RemoteTraceback"  # its text, between quotes


def _child_node(nodes: list, spawned: list, index: int) -> ProcNode:
    if index < len(spawned):
        return next(n for n in nodes if n.pid == spawned[index].pid)
    node = ProcNode(None, "child", None, f"process {index}")
    nodes.append(node)
    return node


def _add_grandchildren(facts: _Facts, nodes: list) -> None:
    """Workers of a child: named in the child's chain; exit statuses from the deaths the runner saw."""
    known = {n.pid for n in nodes if n.pid is not None}
    for node in list(nodes):
        if node.role != "child" or not node.chain:
            continue
        for pid in _worker_pids_named(node.chain):
            if pid not in known:
                nodes.append(ProcNode(pid, "worker", node.pid, "", None, facts.exit_status.get(pid)))
                known.add(pid)


# =========================================================================== a loader in a child process
def _run_method(facts: _Facts) -> Optional[str]:
    """The default start method of the run's processes: the run's, the lab's, else the platform's."""
    opts = facts.options
    method = opts.get("start_method") or opts.get("lab_default_start_method")
    if not method:
        method = facts.env.get("LABUTILS_START_METHOD") or startmethod.current()
    return method


_CARRIERS = ("ProcessRaisedException", "_RemoteTraceback")


def _child_verdicts(facts: _Facts, tree: list) -> list:
    """The verdict of every child process whose own error names a DataLoader failure."""
    out = []
    for node in tree:
        if node.role != "child" or not node.chain:
            continue
        v = _process_verdict(facts, node, tree)
        if v["cause"] in LOADER_CAUSES:
            out.append(v)
    out.sort(key=lambda v: v["node"].via not in _CARRIERS)
    return out


def _process_verdict(facts: _Facts, node, tree: list) -> dict:
    """Explain one child process from its own chain, like a script of its own (its workers: the pids its
    messages name, with the exit statuses the runner saw)."""
    # under forkserver the fork server, not the child, is its workers' parent: the child sees only their death
    verdict = decide_process(
        facts, node.chain, node.exitcode, "the child that owned it saw only the generic 'exited unexpectedly'",
        {n.pid: n.exitcode for n in tree if n.role == "worker"}, memory_limit=facts.memory_limit,
        watchdog_kills=list(facts.watchdog_kills))
    if node.via == "stderr" and not node.exitcode and verdict["conf"] == "high":
        verdict["conf"] = "medium"  # printed on stderr, and no failure of that process recorded to corroborate it
    return dict(verdict, node=node)


def _child_decides(facts: _Facts, verdict: dict, main_cause: str) -> bool:
    """A child's loader failure is the run's cause when the main process carried it (re-raised its
    traceback), or when the main process itself left no error of its own (an exit code, or 0)."""
    if verdict["node"].via in _CARRIERS:
        return True
    if main_cause in ("ok", UNKNOWN):
        return True
    return not facts.ended and not facts.loader_errors


def _describe_node(node) -> str:
    who = f"child process {node.name!r}" if node.name else "a child process"
    where = [f"pid {node.pid}" if node.pid else (f"one of pids {', '.join(map(str, node.candidates))}"
                                                 if node.candidates else "pid not recorded")]
    if node.start_method:
        where.append(f"started by {node.start_method}")
    return f"{who} ({', '.join(where)})"


_VIA = {"stderr": "its traceback, printed on stderr under 'Process {name}:' by multiprocessing",
        "ProcessRaisedException": "torch.multiprocessing.spawn, which re-raised its traceback in the main process "
                                  "(ProcessRaisedException)",
        "_RemoteTraceback": "concurrent.futures, which re-raised the job's exception in the main process (its "
                            "_RemoteTraceback holds the job's traceback)"}


def _child_diagnosis(facts: _Facts, tree: list, v: dict) -> Diagnosis:
    node, cause, mine, conf = v["node"], v["cause"], v["mine"], v["conf"]
    who = _describe_node(node)
    summary = f"in {who}, not the main process: {v['summary']}"
    if facts.outcome == "ok":
        summary += "; the script exited 0 anyway (it did not pass on its child's failure)"
    status = "no exit status recorded" if node.exitcode is None else _exit_words(node.exitcode)
    evidence = [f"failing process: {who}, a child of the main process; {status}; its error reached the record "
                f"through {_VIA.get(node.via, node.via).format(name=node.name)}"]
    evidence += [f"{who}: {f.text}" for f in mine]
    evidence += [f"{who}, also seen: {f.text}" for f in v["others"] if f.text not in (m.text for m in mine)]
    evidence += [f"process tree: {_tree_line(n)}" for n in tree]
    if facts.returncode is not None:
        evidence.append(f"main process: exit code {facts.returncode}")
    evidence += probe_lines(facts)
    process = dict(node.to_dict(), depth=1, parent="main")
    loose = _unexplained(cause, facts, tree)
    if loose and conf == "high":
        conf = "medium"
    return Diagnosis(cause, summary, evidence, fixes_of(cause, mine, conf), conf, "run", False,
                     process=process, tree=[n.to_dict() for n in tree], unexplained=loose)


def _tree_line(node) -> str:
    if node.role == "main":
        return "main process" + ("" if node.exitcode is None else f" (exit status {node.exitcode})")
    up = "main" if node.role == "child" else (f"pid {node.parent}" if node.parent else "a process of the run")
    state = "" if node.exitcode is None else f", exit status {node.exitcode}"
    err = f", error {node.chain[0].type}: {_short(node.chain[0].head, 80)}" if node.chain else ""
    name = f" {node.name!r}" if node.name else ""
    return f"{node.role}{name} pid {node.pid or '?'} (parent {up}{state}{err})"
