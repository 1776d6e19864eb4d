"""A DataLoader in a child process of the script: the child's own error explained like a script of its own,
and the run named for that child (its pid, start method and place in the tree)."""

from __future__ import annotations

from typing import Optional

from ..runner import startmethod
from .causes import CATALOGUE, LOADER_CAUSES, UNKNOWN
from .decide import _summary, decide_process, fixes_of
from .evidence import _exit_words, _Facts, _short
from .model import Diagnosis, probe_lines
from .rules import _unexplained


# =========================================================================== a loader in a child process
def _run_method(facts: _Facts) -> Optional[str]:
    """The default start method of the run's processes: set for the run, the lab's default, else the
    platform's."""
    opts = facts.options or {}
    method = opts.get("start_method") or opts.get("lab_default_start_method")
    if not method:
        method = (facts.env or {}).get("LABUTILS_START_METHOD") or startmethod.current()
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
    sub, cause, mine, conf, others, recovered = decide_process(
        facts, node.chain, node.exitcode, "the child that owned it saw only the generic 'exited unexpectedly'",
        {n.pid: n.exitcode for n in tree if n.role == "worker"}, memory_limit=facts.memory_limit,
        watchdog_kills=list(facts.watchdog_kills))
    if node.via == "stderr" and not node.exitcode and conf == "high":
        conf = "medium"  # printed on stderr, and no failure of that process recorded to corroborate it
    summary = _summary(cause, sub, mine, recovered) if cause in CATALOGUE else ""
    return {"node": node, "cause": cause, "mine": mine, "conf": conf, "others": others, "sub": sub,
            "summary": summary}


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
