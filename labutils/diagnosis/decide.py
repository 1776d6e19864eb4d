"""Choosing: the failure that ended the run first, its findings ranked by precedence, echoes last; and the
summary of the cause chosen."""

from __future__ import annotations

import os
import re
from typing import Optional

from ..machine import probes
from . import messages as vocab
from .causes import CATALOGUE, OTHER_SIGKILL_SENDERS, PRECEDENCE, UNKNOWN, fixes_for
from .evidence import _at, _batches, _Exc, _Facts, _Finding, _frame_kind, _short, _through_loader, workers_named
from .rules import (
    _classify,
    _main_signal_findings,
    _memory_evidence,
    _stall_findings,
    _stderr_findings,
    _worker_findings,
    stopped_inside,
    worker_line,
)


# =========================================================================== choosing
def _single_process(facts: _Facts) -> bool:
    """True when the DataLoader ran without workers (or we cannot tell and no worker was seen)."""
    counts = [it.get("num_workers") for it in facts.iters if it.get("num_workers") is not None]
    if counts:
        return all(n == 0 for n in counts)
    return not facts.workers


def _pick(findings: list, facts: _Facts) -> tuple:
    """(cause, its findings, confidence, the other findings) by precedence; echoes decide only when nothing else
    does."""
    real = [f for f in findings if not f.echo and not f.cause.startswith("_")]
    for cause in PRECEDENCE:
        mine = [f for f in real if f.cause == cause]
        if mine:
            rank = {"high": 0, "medium": 1, "low": 2}
            best = min(mine, key=lambda f: rank[f.conf])
            mine.remove(best)
            mine.insert(0, best)
            conf = best.conf
            # a low finding (a SIGTERM the loader's own shutdown may have sent) is no second piece of evidence
            # nor is one SIGTERM seen twice (PyTorch's message and the exit status): its sender stays unknown
            same_exit = cause == "worker_exit" and (all(f.detail == "code 1" for f in mine if f.conf != "low")
                                                    or all(f.variant == "sigterm" for f in mine))
            if conf == "medium" and len(mine) > 1 and cause != "oom_killed" and not same_exit:
                conf = "high"  # two independent pieces of evidence for the same cause (not one exit code twice)
            if cause == "oom_killed":
                conf = "high" if any(f.conf == "high" for f in mine) else "low"
                if conf == "low":
                    for f in mine:
                        why = _memory_evidence(facts, f.pid) if f.pid else None
                        if why:
                            mine.insert(0, _Finding("oom_killed", f"pid {f.pid}: {why}", "high", pid=f.pid))
                            conf = "high"
                            break
            if cause == "hang" and not facts.stall:
                conf = "low" if all(f.conf == "low" for f in mine) else "medium"
            return cause, mine, conf, [f for f in findings if f not in mine]
    echoes = [f for f in findings if f.cause == "_died"]
    if echoes:
        return "worker_exit", echoes, "low", [f for f in findings if f not in echoes]
    return None, [], "high", findings


def _chain_where(e: _Exc) -> str:
    base = {"ended": "exception that ended the script", "next": "exception from the DataLoader",
            "init": "exception while creating the DataLoader iterator (starting its workers)",
            "live": "the exception", "quoted": "a DataLoader message quoted in the message of the exception "
            "below (a re-raised error of a child process or a wrapper)"}[e.origin]
    if e.origin in ("next", "init") and e.ended_run:
        base += ", which ended the script"
    elif e.origin in ("next", "init"):
        base += " (caught by the script)"
    return base if e.link is None else f"its __{e.link}__"


def _loader_chain_findings(chain: list, single: bool) -> list:
    return [f for e in chain for f in _classify(e, _chain_where(e), single)]


def _library_stops(facts: _Facts, findings: list) -> list:
    """PyTorch's "killed by signal: Terminated" beside a library's own stop on stderr (GNU OpenMP after fork):
    the worker was stopped from inside, as its exit status says where the run recorded it (rules)."""
    stop = vocab.library_stop(facts.stderr)
    if stop is None:
        return findings
    return [stopped_inside(f.text, stop, "medium", f.pid) if f.variant == "sigterm" else f for f in findings]


def _episode(facts: _Facts, chain: Optional[list]) -> list:
    """Every finding of one loader failure: its chain, the workers, child tracebacks, memory, stalls."""
    single = _single_process(facts)
    findings = _library_stops(facts, _loader_chain_findings(chain or [], single))
    findings += _worker_findings(facts)
    findings += facts.live_findings
    printed = _stderr_findings(facts)
    # a child's traceback is corroborated by a death the OS or PyTorch recorded: then it is strong
    died = any(f.echo or (f.cause == "worker_exit" and f.conf == "high") for f in findings)
    capped = bool(facts.options.get("max_processes"))
    for f in printed:
        if died and f.text.startswith("stderr: a spawned child"):
            f.conf = "high"
        elif f.cause == "fork_refused" and (died or capped):
            f.conf = "high"  # the process that printed it died, or the run had a task cap: no mere chatter
    return _bus_errors(facts, findings + printed)


def _shm_short(facts: _Facts) -> Optional[str]:
    """What in the record says /dev/shm was short, or None: a private /dev/shm limit, the kernel's or torch's
    words for a full one, or (a run on this machine) little free in /dev/shm now."""
    if facts.options.get("shm_size"):
        return "the run had a private /dev/shm of its own size"
    texts = "\n".join([facts.stderr, *[e.message for c in [facts.ended, *facts.loader_errors] for e in c]])
    m = vocab.SHM_FULL.search(texts)
    if m:
        return f"the record says so: {m.group(0)!r}"
    if facts.source == "run":
        usage = probes.shm_usage()
        if usage and usage[1] < 64 * 2**20:
            return f"/dev/shm has {usage[1] / 2**20:.0f} MiB free"
    return None


def _bus_errors(facts: _Facts, findings: list) -> list:
    """A bus error is shm_exhausted only when the run's /dev/shm evidence agrees; in a run whose /dev/shm was
    not short, it is a native crash of the reader (a memory-mapped file cut short under it, a library's bad
    access). From a log's text alone it stays shm_exhausted, not high (the text cannot show /dev/shm)."""
    bus = [f for f in findings if f.cause == "shm_exhausted" and ("Bus error" in f.text or "SIGBUS" in f.text)]
    if not bus:
        return findings
    why = _shm_short(facts)
    for f in bus:
        if why:
            f.text += f" - and /dev/shm was short: {why}"
        elif facts.source == "run":
            f.cause, f.conf = "native_crash", "medium"
            f.text += (" - but /dev/shm was not short (no private limit, no 'No space left on device' in the "
                       "record, space free now): a bus error of the reader itself, as from a memory-mapped file "
                       "cut short under it")
        else:
            f.conf = "medium" if f.conf == "high" else f.conf
    return findings


def _same_chain(a: list, b: list) -> bool:
    return bool(a and b) and [(e.type, e.message) for e in a] == [(e.type, e.message) for e in b]


def _fallback_single(e: _Exc, single: bool) -> Optional[_Finding]:
    """An exception that escaped a single-process DataLoader: the Dataset raised it in the main process."""
    if _through_loader(e) and single:
        at = f" at {_at(e.user_frame)}" if e.user_frame else ""
        return _Finding("worker_exception", f"{e.type}: {_short(e.message)} escaped the DataLoader iterator "
                        f"(raised by the Dataset/collate_fn in the main process, num_workers=0){at}",
                        "high" if e.frames or e.origin in ("next", "init") else "medium",
                        detail=f"{e.type}: {_short(e.message, 120)}")
    return None


def _outside_finding(e: _Exc) -> _Finding:
    line, where = e.user_frame, ""
    if line:
        raised = "" if e.frames[-1] is line else f"; raised in {_lib_name(e.frames[-1][0])}"
        where = f" (your code: {_at(line)}{raised})"
    return _Finding("outside_loader", f"the script failed outside data loading: {e.type}: {_short(e.message)}"
                    f"{where} - no frame of torch.utils.data in its traceback", "high",
                    detail=f"{e.type}: {_short(e.message, 120)}")


def _lib_name(path: str) -> str:
    p = path.replace("\\", "/")
    m = re.search(r"/(torch/[\w/]+?)\.py$", p)
    if m:
        return m.group(1).replace("/", ".")
    m = re.search(r"/(?:site-packages|dist-packages|python\d\.\d+)/([\w/]+?)\.py$", p)
    return m.group(1).replace("/", ".") if m else os.path.basename(p)


def _decide(facts: _Facts) -> tuple:
    """(cause, findings for it, confidence, other findings, recovered)."""
    return _decide_ended(facts) if facts.ended else _decide_without_exception(facts)


def decide_process(facts: _Facts, chain: list, returncode: Optional[int], saw: str, codes: Optional[dict] = None,
                   **more) -> dict:
    """A child or a torchrun rank explained from its own ``chain`` like a script: its verdict (``cause``,
    ``mine``, ``conf``, ``others``, ``recovered``, ``summary``). Its workers are those its messages name
    (statuses from ``codes``); where it saw only an echo of a worker's death, the line the worker printed as
    it died decides (``saw`` says what the process saw)."""
    sub = _Facts(source="run", outcome="failed", returncode=returncode, options=dict(facts.options),
                 env=dict(facts.env), kernel_record=facts.kernel_record, since=facts.since, ended=chain,
                 workers=workers_named(chain, codes), **more)
    cause, mine, conf, others, recovered = _decide(sub)
    if not chain and sub.main_signal is None:
        cause, conf = UNKNOWN, "low"
    elif conf == "low" and cause in ("worker_exit", UNKNOWN):
        found = worker_line(facts.stderr, saw)
        if found is not None:
            cause, mine, conf, others = found.cause, [found], "medium", mine + others
    summary = _summary(cause, sub, mine, recovered) if cause in CATALOGUE and cause != "ok" else ""
    return {"cause": cause, "mine": mine, "conf": conf, "others": others, "recovered": recovered, "summary": summary}


def _decide_ended(facts: _Facts) -> tuple:
    """The script ended with a Python exception: did it come through the loader, and what does it say?"""
    single = _single_process(facts)
    ended = facts.ended
    others: list = []
    loader_chain = None
    # the link of the ending chain that came through the loader, if any (a user's exception raised
    # while handling a loader error has the loader error as its __context__)
    origins = [_through_loader(e) for e in ended]
    match = next((c for c in facts.loader_errors if _same_chain(ended, c)), None)
    if match is not None:
        loader_chain = match  # the same chain escaped next()/iter(): the loader raised it
        for e in match:
            e.ended_run = True
    elif any(o is True for o in origins):
        loader_chain = ended
    elif all(o is None for o in origins):
        loader_chain = ended  # no traceback to tell: judge the messages (an exception built by hand)
    if loader_chain is not None and origins[0] is False and match is None:
        # the script's own exception, raised while handling (or from) one that came through the
        # loader: the loader's error is the reason only if it names a loader failure
        linked = [e for e, o in zip(ended, origins) if o is True]
        if not [f for f in _loader_chain_findings(linked, single) if not f.cause.startswith("_")
                or f.echo]:
            loader_chain = None
    if loader_chain is None:
        # the script ended with an exception the loader did not raise: the loader is not to blame,
        # whatever it went through before (errors the script caught and survived are listed)
        for c in facts.loader_errors:
            others += _loader_chain_findings(c, single)
        head = ended[0]
        mine = [_outside_finding(head)]
        if facts.batches:
            mine.append(_Finding("outside_loader", f"the DataLoader had delivered {_batches(facts.batches)} "
                                 "before it", "high"))
        return "outside_loader", mine, "high", others, False
    findings = _episode(facts, loader_chain)
    findings += _main_signal_findings(facts)
    cause, mine, conf, rest = _pick(findings, facts)
    if cause is None:
        fb = _fallback_single(loader_chain[0], single) if loader_chain else None
        if fb is not None:
            return "worker_exception", [fb], fb.conf, findings, False
        if all(o is None for o in origins):
            return UNKNOWN, [_Finding(UNKNOWN, f"{ended[0].type}: {_short(ended[0].message)} - nothing in "
                                      "it names a DataLoader failure, and it has no traceback to say where "
                                      "it was raised", "medium")], "medium", [], False
        # through the loader but no rule names it: a Python exception of the loader's caller
        return "worker_exception", [_Finding("worker_exception", f"{ended[0].type}: "
                                             f"{_short(ended[0].message)} (raised inside the DataLoader)",
                                             "medium", detail=f"{ended[0].type}: {_short(ended[0].message, 120)}")
                                    ], "medium", findings, False
    for c in facts.loader_errors:
        if not _same_chain(c, loader_chain):
            others += [f for f in _loader_chain_findings(c, single) if f.cause != cause]
    return cause, mine, conf, rest + others, False


def _decide_without_exception(facts: _Facts) -> tuple:
    """The script ended without a Python exception: a signal, a stall or time limit, an exit code, or 0."""
    single = _single_process(facts)
    main = _main_signal_findings(facts)
    last_loader = facts.loader_errors[-1] if facts.loader_errors else None
    if main and main[0].cause == "_main_native":
        sig = int(main[0].detail)
        stack = _fatal_stack(facts.stderr)
        in_loader = ("loader" in {k for _, k in stack}) if stack else None
        if sig == 6 and facts.iters and vocab.SHM_GONE.search(facts.stderr):  # C++ terminate() on a deleted file
            f = _Finding("shm_exhausted", main[0].text + ": torch's C++ code aborted with 'could not unlink the "
                         "shared memory file' - a batch's file was deleted from /dev/shm under the loader",
                         "high", variant="removed")
            return "shm_exhausted", [f], "high", _episode(facts, last_loader), False
        if single and facts.iters and in_loader is not False:
            f = _Finding("native_crash", main[0].text + ("; its Python stack runs through torch.utils.data"
                                                          if in_loader else "; the DataLoader ran with "
                                                          "num_workers=0, so the Dataset ran in this process"),
                         "high" if in_loader else "medium", variant="main_process", detail=str(sig))
            return "native_crash", [f], f.conf, _episode(facts, last_loader), False
        findings = _episode(facts, last_loader)
        cause, mine, conf, _ = _pick(findings, facts)
        if cause is not None and cause != "worker_exit":
            return cause, mine, conf, [main[0]], False
        what = ("its Python stack shows no frame of torch.utils.data" if stack else
                "no DataLoader was iterated" if not facts.iters else
                "the DataLoader's workers did not fail")
        return "outside_loader", [_Finding("outside_loader", f"{main[0].text}; {what}", "medium" if not stack
                                           else "high")], "medium" if not stack else "high", findings, False
    if main and main[0].cause == "_main_stopped":
        sig = int(main[0].detail)
        findings = _episode(facts, last_loader)
        who = _sigterm_sender(facts) if sig == 15 else ""
        f = _Finding("outside_loader", f"{main[0].text}: the script was stopped from outside{who}", "medium")
        return "outside_loader", [f], "medium", findings, False
    if main:  # SIGKILL of the main process
        return (*_pick(_episode(facts, last_loader) + main, facts), False)
    cut = _cut_short(facts)
    if cut is not None:
        return "ok", [cut], "medium", _episode(facts, last_loader), False
    if facts.outcome == "timed_out" or facts.stall:
        # SIGTERMs of workers the runner's own kill caused, and the like, are consequences of the stop
        return (*_pick(_episode(facts, last_loader) + _stall_findings(facts), facts), False)
    if facts.outcome == "failed":
        chosen = _pick(_episode(facts, last_loader), facts) if last_loader is not None else (None,)
        if chosen[0] is not None:
            return (*chosen, False)
        findings = _episode(facts, None)
        cause, mine, conf, _ = _pick([f for f in findings if f.variant != "sigterm"], facts)
        if cause is not None:
            return cause, mine, conf, [f for f in findings if f not in mine], False
        code = facts.returncode
        return "outside_loader", [_Finding("outside_loader", f"the script exited with code {code} without a "
                                           "Python traceback, and nothing came from the DataLoader", "medium")
                                  ], "medium", findings, False
    return _decide_ended_well(facts)


#: a run whose last batch came this close to its end (s, or this share of its time limit) was still going
_STILL_GOING_S, _STILL_GOING_SHARE = 5.0, 0.1


def _cut_short(facts: _Facts) -> Optional[_Finding]:
    """A run stopped by its total time limit while its DataLoader was still delivering batches: cut short,
    not a hang (a stall limit's stop, or a limit reached after batches stopped coming, is one)."""
    if facts.outcome != "timed_out" or facts.stall or not facts.batches or facts.last_batch_t is None:
        return None
    if facts.loader_errors or any(w.exitcode not in (None, 0, -9, -15) for w in facts.workers):
        return None
    limit = facts.options.get("timeout")
    age = max(0.0, (facts.end_t or facts.last_batch_t) - facts.last_batch_t)
    if age > max(_STILL_GOING_S, _STILL_GOING_SHARE * (limit or 0)):
        return None
    at = f"the run's time limit ({limit:g} s)" if isinstance(limit, (int, float)) else "the run's time limit"
    return _Finding("ok", f"cut short by {at} while the DataLoader was still delivering batches: "
                    f"{_batches(facts.batches)}, the last one {age:.1f} s before the stop; no failure seen "
                    "(not a hang: batches kept coming)", "medium", variant="cut_short")


def _decide_ended_well(facts: _Facts) -> tuple:
    """The run exited 0: a loader error it caught and went on from, else ok."""
    single = _single_process(facts)
    others: list = []
    first = facts.loader_errors[0] if facts.loader_errors else None
    if first is not None:
        findings = _episode(facts, first)
        cause, mine, conf, rest = _pick(findings, facts)
        if cause is None:
            fb = _fallback_single(first[0], single)
            if fb is not None:
                cause, mine, conf, rest = "worker_exception", [fb], fb.conf, findings
        if cause is not None:
            for c in facts.loader_errors[1:]:
                others += [f for f in _loader_chain_findings(c, single) if f.cause != cause]
            return cause, mine, conf, rest + others, True
    # no loader error: stderr and statuses alone cannot make a healthy run a failure, except warnings
    # from torch.utils.data itself about a failed worker start (the script caught it before iter() returned)
    warned = [f for f in _stderr_findings(facts) if f.cause == "unpicklable_dataset" and "torch.utils.data" in f.text]
    if warned:
        return "unpicklable_dataset", warned, "medium", [], True
    quiet = [f for f in _worker_findings(facts) if f.variant != "sigterm"]
    # a process of the run that failed, with nothing recorded to say why: the run's own end cannot vouch
    return "ok", [], "medium" if quiet else "high", quiet, False


def _fatal_stack(stderr: str) -> list:
    """``(path, kind)`` of the frames of a faulthandler 'Fatal Python error' dump, if the script printed one."""
    i = stderr.find("Fatal Python error:")
    if i < 0:
        return []
    return [(p, _frame_kind(p)) for p in re.findall(r'File "([^"]+)", line \d+ in ', stderr[i:i + 8000])]


# =========================================================================== summaries
def fixes_of(cause: str, mine: list, conf: str) -> list:
    """The fixes of ``cause``, of the catalogue variant that fits the deciding findings ``mine``."""
    if cause == "oom_killed":  # a SIGKILL that nothing recorded ties to memory has fixes of its own
        return fixes_for(cause, "no_memory_evidence" if conf == "low" else None)
    return fixes_for(cause, next((f.variant for f in mine if f.variant not in (None, "startup")), None))


def _sigterm_sender(facts: _Facts) -> str:
    senders = probes.sigterm_senders(facts.env or os.environ)
    return f"; likely sender here: {'; '.join(senders)}" if senders else \
        "; nothing in the environment names a scheduler: a person's kill, a launcher or a service manager"


def _summary(cause: str, facts: _Facts, mine: list, recovered: bool) -> str:
    entry = CATALOGUE.get(cause)
    variant = next((f.variant for f in mine if f.variant), None)
    text = entry.summary_for(variant) if entry else "the run failed; nothing recorded says where"
    inner = next((f.detail for f in mine if f.detail), "")
    if cause == "worker_exception" and inner:
        place = "inside a worker" if not _single_process(facts) else "in the main process (num_workers=0)"
        text = f"a Python exception in the Dataset/collate_fn {place}: {inner}"
    elif cause == "native_crash" and variant != "main_process":
        m = re.search(r"killed by (SIG\w+)", " ".join(f.text for f in mine))
        if m:
            text = f"a worker was killed by {m.group(1)} in native code (a crash in C/C++, not a Python error)"
    elif cause == "oom_killed":
        strong = [f for f in mine if f.conf == "high"]
        if any("memory watchdog" in f.text for f in strong):
            text = "a process was SIGKILLed for using too much memory; here the lab's memory watchdog did it"
        elif any("kernel" in f.text for f in strong):
            text = "a process was SIGKILLed for using too much memory: the kernel's OOM killer did it"
        elif strong:
            text = "a process was SIGKILLed for using too much memory (its memory climbed to the limit)"
        else:  # what the record proves is a kill; the sender is the open question, memory its first suspect
            who = "a worker" if any("worker" in f.text for f in mine) else "a process"
            text = (f"{who} was killed by SIGKILL, sender unknown: nothing recorded says it was for memory. "
                    "Check memory first (the kernel's OOM killer sends SIGKILL: dmesg, the cgroup's memory.events), "
                    "then the other senders: " + OTHER_SIGKILL_SENDERS)
    elif cause == "worker_exit":
        startup = next((f.detail for f in mine if f.variant == "startup" and f.detail), None)
        if startup:
            text = f"a spawned worker died while starting, before loading any sample: {_short(startup, 120)}"
        elif variant == "sigterm":
            text = entry.summary_for("sigterm") + _sigterm_sender(facts)
        else:
            m = re.search(r"code (-?\d+)", inner)
            if m:
                text = (f"a worker exited with code {m.group(1)} without a Python traceback: its own exit "
                        "(sys.exit/os._exit in the Dataset or a library), not a signal")
    elif cause == "fd_limit" and variant == "user_leak" and inner:
        text += f" ({_short(inner, 100)})"
    elif cause == "cuda_in_worker" and not any("worker" in f.text for f in mine) and _single_process(facts):
        text = "CUDA was used by the data-loading code on a machine or build without CUDA"
    elif cause == "outside_loader":
        detail = next((f.detail for f in mine if f.detail), "")
        if detail:
            text = f"the script failed outside data loading ({detail}): the DataLoader is not to blame"
        elif mine:
            text = "the script failed outside data loading: " + _short(mine[0].text, 200)
    elif cause == "hang" and not facts.stall and facts.outcome == "timed_out":
        text = "no progress until the run's time limit: a worker or the main process was stuck"
    if recovered:
        t0 = next((e.t for c in facts.loader_errors for e in c if e.t is not None), None)
        later = [it for it in facts.iters if it.get("num_workers") == 0
                 and (t0 is None or (it.get("t") or 0) >= t0)]
        if later and (t0 is not None or not _single_process(facts)):
            text += " - your script recovered: it caught the error and went on with num_workers=0, then exited 0"
        else:
            text += " - your script recovered: it caught the error and exited 0"
    return text
