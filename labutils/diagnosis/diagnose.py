"""Name the cause of a DataLoader failure: ``explain(obj)`` of a RunResult, a live exception or a log's text
gives a :class:`Diagnosis`. Its evidence is gathered (:mod:`.gather`, :mod:`.logread`), read by the rules
(:mod:`.rules`), chosen among (:mod:`.decide`), and placed in the run's process tree (:mod:`.tree`,
:mod:`.torchrun`). A message counts only where it was raised (the bootstrap records what escaped
``iter()``/``next()``, a traceback's frames say whose code raised it); stderr counts only where a child
process printed it and a failure of the run corroborates it.
"""

from __future__ import annotations

import re
from typing import Optional

from ..runner.result import RunResult
from . import messages as vocab
from .causes import CATALOGUE, CAUSES, PRECEDENCE, UNKNOWN, UNSUPPORTED, Fix, fixes_for
from .decide import _decide, _summary, fixes_of
from .evidence import _batches, _exit_words, _Facts, _Finding, _short, is_worker_death, with_quoted, worker_death_kind
from .gather import facts_from_exception, facts_from_result
from .logread import LogText, cut_before_its_error, facts_from_text, memory_words, read_text, reruns_main
from .model import GENERIC_DEATH, SCRIPT, Diagnosis, open_question, probe_lines
from .pickling import find_unpicklable
from .rules import _classify, _stack_lines, _stuck_where, _unexplained, after_the_failure, kernel_killed, worker_line
from .torchrun import _torchrun_diagnosis, rank_output, torchrun_failures
from .tree import _child_decides, _child_diagnosis, _child_verdicts, _describe_node, _run_method, build_tree

__all__ = ["CAUSES", "PRECEDENCE", "Diagnosis", "Fix", "explain", "explain_log", "is_worker_death", "kernel_killed",
           "rank_output", "torchrun_failures", "worker_death_kind"]


# =========================================================================== explain
def explain(obj) -> Diagnosis:
    """The :class:`Diagnosis` of a :class:`~labutils.runner.result.RunResult`, a live exception (``except
    Exception as e: labutils.explain(e)``) or a log's text (a ``str``: what a job printed, pasted)."""
    if isinstance(obj, str):
        return explain_log(read_text(obj))
    if isinstance(obj, BaseException):
        facts = facts_from_exception(obj)
    elif isinstance(obj, RunResult):
        if obj.outcome == "unsupported":
            return Diagnosis(UNSUPPORTED, f"the run could not start here: {obj.reason}",
                             [f"runner: {obj.reason}"], [], "high", "run")
        facts = facts_from_result(obj)
        launch = _torchrun_diagnosis(facts) if facts.outcome == "failed" else None
        if launch is not None:
            return launch
    else:
        raise TypeError(f"explain() takes a RunResult, an exception or a log's text (str), not "
                        f"{type(obj).__name__}")

    tree = build_tree(facts, _run_method(facts)) if facts.source == "run" else []
    cause, mine, conf, others, recovered = _decide(facts)
    verdicts = _child_verdicts(facts, tree)
    chosen = next((v for v in verdicts if _child_decides(facts, v, cause)), None)
    if chosen is not None:
        return _child_diagnosis(facts, tree, chosen)
    others = others + [_Finding(v["cause"], f"{_describe_node(v['node'])}: {v['summary']}", "medium")
                       for v in verdicts]
    evidence = [f.text for f in mine]
    for f in others:
        if f.text in evidence:
            continue
        label = "echo of the failure above" if f.echo else "also seen"
        evidence.append(f"{label}: {f.text}")
    if facts.batches is not None and cause not in ("ok", "outside_loader"):
        evidence.append(f"the DataLoader delivered {_batches(facts.batches)} before it stopped")
    evidence.extend(_status_lines(facts))
    if facts.stall or facts.outcome == "timed_out":
        evidence.extend(_stack_lines(facts))
    ml = facts.memory_limit
    if isinstance(ml, dict) and ml.get("limit"):
        evidence.append(f"memory limit of the run: {ml['limit'] / 2**20:.0f} MiB, enforced by "
                        f"{ml.get('enforced_by', '?')} ({ml.get('mechanism', '')})".rstrip(" ()"))
    evidence.extend(facts.notes)
    evidence += probe_lines(facts)
    if cause == "unpicklable_dataset" and facts.live_dataset is not None:
        evidence.extend(_blockers(facts.live_dataset))

    if cause == "ok" and mine and mine[0].variant == "cut_short":
        summary = mine[0].text
    elif cause == "ok":
        summary = _ok_summary(facts)
    else:
        summary = _summary(cause, facts, mine, recovered)
    loose = _unexplained(cause, facts, tree) if facts.source == "run" else []
    if loose and conf == "high":
        conf = "medium"  # a DataLoader error in the record that this cause does not account for
    process = _failing_process(tree, mine) if tree and cause not in ("ok", "outside_loader") else None
    if process is not None and process["role"] == "worker":
        evidence.insert(len(mine), f"failing process: DataLoader worker pid {process['pid']} of the main process"
                        + (f" ({process['name']})" if process["name"] else "")
                        + (f", started by {process['start_method']}" if process["start_method"] else ""))
    d = Diagnosis(cause, summary, evidence, fixes_of(cause, mine, conf), conf, facts.source, recovered,
                  process=process, tree=[n.to_dict() for n in tree], unexplained=loose)
    return _with_open_question(d, mine)


def _with_open_question(d: Diagnosis, mine: list) -> Diagnosis:
    """Fill what the deciding evidence proves, what it cannot, and the command that decides it."""
    d.proves = [f.text for f in mine[:3]]
    if d.cause not in ("ok", UNKNOWN) or d.source == "log":
        d.cannot_prove, d.decide_with = open_question(d.cause, d.confidence)
    return d


# =========================================================================== a log's text
def explain_log(log: LogText) -> Diagnosis:
    """The diagnosis of the primary failure printed in a log (:func:`.logread.read_logs`), with the platform's
    words as evidence."""
    facts, others, words = facts_from_text(log.text)
    memory = memory_words(words)
    stuck = _stuck_where(log.text) if not facts.ended and facts.main_signal is None else ""
    if stuck:  # a stack dump (faulthandler, py-spy) taken while the job made no progress
        mine = [_Finding("hang", stuck.replace("faulthandler dump", "a stack dump in the text"), "medium")]
        d = Diagnosis("hang", "a stack dump in the text shows the main process waiting for a batch that did not "
                      "come: a hang (the text cannot show for how long nothing came)", [mine[0].text],
                      fixes_for("hang"), "medium", "log")
        return _log_caps(_with_open_question(d, mine), mine, [], log, [])
    if not facts.ended and facts.main_signal is None:
        d = Diagnosis(UNKNOWN, "no DataLoader failure in this text: no Python traceback, no PyTorch message "
                      "about a worker and no kill by the platform", [*_read_lines(log)], [], "medium", "log")
        d.cannot_prove, d.decide_with = ("whether the job failed at all (give the whole output: its stderr, "
                                         "and dmesg or the scheduler's report)", SCRIPT)
        return d
    launch = _torchrun_diagnosis(facts) if "Root Cause (first observed failure)" in log.text else None
    if launch is not None:
        launch.source = "log"
        return _log_caps(launch, [], memory, log, [])
    cause, mine, conf, more, recovered = _decide(facts)
    if cause is None:
        cause, conf = UNKNOWN, "low"
    if reruns_main(facts.ended) and cause != "missing_main_guard":
        mine = [_Finding("missing_main_guard", "the traceback shows a spawned child running the script's top level "
                         "again (multiprocessing's _fixup_main_from_path, then <module>): code there that starts "
                         "DataLoader workers needs an if __name__ == '__main__': guard", "medium")] + mine
        cause, conf = "missing_main_guard", "medium"
    found = worker_line(log.text, "the main process saw only an echo of the death") if (
        cause in ("worker_exit", UNKNOWN) and conf == "low" or cause == "outside_loader") else None
    if found is not None:
        cause, mine, conf = found.cause, [found, *mine], "medium"
    if cause == "oom_killed" and conf == "low" and memory:
        mine.insert(0, _Finding("oom_killed", "the platform says the kill was for memory: " + "; ".join(memory),
                                "high"))
        conf = "high"
    summary = _summary(cause, facts, mine, recovered) if cause in CATALOGUE and cause != "ok" else \
        "the text names a failure, but nothing in it says where it came from"
    evidence = [f.text for f in mine] + [f"also seen: {f.text}" for f in more if f.text not in
                                          {m.text for m in mine}]
    loose = []
    for chain in others:
        found = [f for e in with_quoted(chain) for f in _classify(e, "another traceback in the text", False)
                 if not f.cause.startswith("_") and not f.echo and f.cause != cause]
        loose += [f"{f.cause}: {f.text}" for f in found]
    d = Diagnosis(cause, summary, evidence, fixes_of(cause, mine, conf), conf, "log", recovered,
                  unexplained=loose[:8])
    d = _log_caps(_with_open_question(d, mine), mine, memory, log, loose)
    if cut_before_its_error(facts.ended) and cause != "missing_main_guard":
        d.confidence = "low"
        d.cannot_prove = "the error itself: the traceback in the text stops before its exception line"
        d.decide_with = SCRIPT + "  (or paste the whole traceback, to its last line)"
    return d


def _log_caps(d: Diagnosis, mine: list, memory: list, log: LogText, loose: list) -> Diagnosis:
    """A log decides with ``high`` only what its text alone decides."""
    texts = " ".join(f.text for f in mine)
    signal_only = d.cause == "shm_exhausted" and not vocab.SHM.search(texts) and not vocab.SHM_GONE.search(texts)
    if d.confidence == "high" and (signal_only or loose or d.cause in ("worker_exit", "hang")):
        d.confidence = "medium"
    if d.cause == "oom_killed" and d.confidence == "high" and not memory and not any(
            "memory" in f.text for f in mine if f.conf == "high"):
        d.confidence = "low"
    if d.confidence != "high":
        d.cannot_prove, d.decide_with = open_question(d.cause, d.confidence)
        generic = vocab.DIED.search(log.text) or any(f.echo for f in mine)  # no exit status in either
        if d.cause == "worker_exit" and generic and not (
                vocab.KILLED.search(log.text) or vocab.EXIT_CODE.search(log.text)):
            d.cannot_prove, d.decide_with = GENERIC_DEATH
    d.evidence = d.evidence + _read_lines(log)
    return d


def _read_lines(log: LogText) -> list:
    lines = [f"read: {', '.join(log.names)} ({log.bytes_read} bytes, {log.lines_read} lines)"]
    if log.bytes_skipped:
        lines.append(f"{log.bytes_skipped} bytes between the excerpts kept held no failure words (not read "
                     "as evidence)")
    return lines + list(log.notes)


def _ok_summary(facts) -> str:
    if facts.source != "run" or facts.iters:
        return CATALOGUE["ok"].summary
    n = facts.other_loader_workers  # a launcher (torchrun) makes no loader itself: its ranks did
    return (f"the script finished; its DataLoaders ran in processes it started ({n} DataLoader workers seen)"
            if n else "the script finished; it created no DataLoader iterator")


def _failing_process(tree: list, mine: list) -> Optional[dict]:
    """The process the deciding evidence is about: a worker it names (by pid, or whose own printed error it
    is), else the main process, where the loader ran."""
    texts = " ".join(f.text for f in mine)
    pids = [f.pid for f in mine if f.pid] + [int(p) for p in re.findall(r"\bpid (\d+)", texts)]
    node = next((n for n in tree if n.role == "worker" and n.chain and _short(n.chain[-1].head) in texts), None)
    if node is None:
        node = next((n for pid in pids for n in tree if n.pid == pid), None)
    if node is None:
        node = tree[0]
    return dict(node.to_dict(), depth=0 if node.role == "main" else 1,
                parent=None if node.role == "main" else "main")


def _status_lines(facts: _Facts) -> list:
    lines = []
    if facts.source == "run":
        if facts.stall:
            lines.append("main process: stopped by the runner after the stall limit")
        elif facts.outcome == "timed_out":
            lines.append("main process: killed by the runner after the time limit")
        elif facts.returncode is not None:
            lines.append(f"main process: {_exit_words(facts.returncode)}")
    oom, named = kernel_killed(facts) if facts.source == "run" else (set(), False)
    for w in facts.workers:
        killed = w.exitcode is not None and w.exitcode < 0
        state = _exit_words(w.exitcode) if w.exitcode is not None else "still running or not joined" \
            if facts.source != "run" else "exit status not recorded (the run was killed before it could be read)"
        if killed and w.pid in oom:
            state += " (by: kernel_oom" + (", named in the kernel log)" if named else ")")
        elif killed and w.killed_by_watchdog:
            state += " (by: the lab's memory watchdog)"
        elif killed and -w.exitcode in vocab.NATIVE_SIGNALS and after_the_failure(facts, w):
            state += " (after the failure: while the DataLoader shut its workers down)"
        role = "worker" if w.role == "dataloader_worker" else "child process"
        lines.append(f"{role} pid {w.pid}: {state}")
    return lines


def _blockers(dataset) -> list:
    try:
        found = find_unpicklable(dataset, "dataset")
    except Exception as exc:  # noqa: BLE001
        return [f"find_unpicklable failed: {exc!r}"]
    return [f"cannot pickle: {b.path} ({b.type_name})" for b in found[:5]]
