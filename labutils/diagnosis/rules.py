"""The rules: what one exception, one printed traceback, one exit status or one memory record says about
the cause, each as a finding with its confidence."""

from __future__ import annotations

import os
import re
from typing import Optional

from ..runner.result import signal_name
from . import messages as vocab
from .causes import LOADER_CAUSES, OTHER_SIGKILL_SENDERS
from .evidence import (
    _at,
    _Exc,
    _Facts,
    _Finding,
    _frame_kind,
    _frames,
    _printed,
    _short,
    _through_loader,
    _worker_pids_named,
    worker_death_kind,
)

_THREAD_FUNCS = {"start", "_start_thread", "_start_new_thread", "submit", "_adjust_thread_count", "_start"}
_FORK_FUNCS = {"_launch", "spawnv_passfds", "_Popen", "start", "_start_thread", "fork", "fork_exec"}
# Only these exception types can carry a resource or CUDA failure; a ValueError that merely mentions
# "Too many open files" is the user's own exception.
_RESOURCE_TYPES = {"RuntimeError", "OSError", "PermissionError", "BlockingIOError", "ConnectionError",
                   "FileNotFoundError", "MemoryError", "IOError"}
_CUDA_TYPES = {"AssertionError", "RuntimeError", "AcceleratorError", "CudaError", "DeferredCudaCallError",
               "OutOfMemoryError"}
_PICKLE_TYPES = {"TypeError", "PicklingError", "AttributeError", "PickleError", "NotImplementedError"}
_WHO = {"child_start": "a spawned child printed while starting", "worker": "a worker printed",
        "feeder": "a multiprocessing helper thread (queue feeder, fd sharer) printed",
        "mp_child": "a child process printed"}


def _inner_traceback(message: str) -> str:
    """The worker's traceback quoted after ``Original Traceback``."""
    _, sep, tail = (message or "").partition("Original Traceback (most recent call last):")
    return tail if sep else ""


def _inner_line(message: str) -> str:
    """The last ``Type: message`` line of that traceback."""
    lines = [line for line in (_inner_traceback(message) or message).splitlines()
             if line and not line[0].isspace() and not line.startswith("Traceback (")]
    return lines[-1].strip() if lines else (message.splitlines()[0] if message else "")


# =========================================================================== rules for one exception
def _classify(e: _Exc, where: str, single_process: bool) -> list:
    """Findings from one exception that came through the loader (or whose origin is unknown)."""
    msg, head = e.message or "", e.head
    bare = _through_loader(e) is None
    conf = "medium" if bare or e.origin == "quoted" else "high"
    said = f"{where}: {e.type}: {_short(head)}"
    m = vocab.WRAPPER.match(msg.strip())
    if m:
        return [_classify_wrapper(e, m, where, conf)]
    if vocab.TIMEOUT.match(head):
        return [_Finding("timeout", said, conf)]
    kind = worker_death_kind(e)
    if kind == "race":
        return [_Finding("_died", said + " - raised while receiving a batch from a worker that had already exited "
                         "(its end of the fd-passing socket is gone): an echo of the worker's death; its exit "
                         "status says why", "low", echo=True)]
    if kind == "killed":
        km = vocab.KILLED.match(head)
        word, pid = km.group(2).strip(), int(km.group(1))
        sig = vocab.signal_from_word(word)
        text = f"{where}: PyTorch reports worker pid {pid} killed by signal: {word}"
        cause = _cause_for_signal(sig) if sig else "worker_exit"
        if sig == 9:  # PyTorch saw a SIGKILL; whether it was for memory needs memory evidence
            return [_Finding(cause, text + " (SIGKILL: the OOM killer's signal, and also that of kill -9 and "
                             "preemptions)", "low", variant="no_memory_evidence", pid=pid)]
        if sig == 15:  # PyTorch saw a SIGTERM; who sent it (a person, a launcher, a library inside) it cannot say
            return [_Finding(cause, text, "medium" if conf == "high" else conf, "15", variant="sigterm", pid=pid)]
        return [_Finding(cause, text, conf, detail=str(sig or ""), pid=pid)]
    if kind == "exitcode":
        em = vocab.EXIT_CODE.match(head)
        return [_Finding("worker_exit", f"{where}: PyTorch reports worker pid {em.group(1)} exited with exit "
                         f"code {em.group(2)}", "medium", detail=f"code {em.group(2)}")]
    if kind in ("died", "pin"):
        return [_Finding("_died", said + (" (the generic message: an echo of the death; the reason is in the chain "
                                          "below it and in the worker exit status)" if kind == "died" else
                                          " (the pin-memory thread stopped because a worker or the loader failed "
                                          "first: an echo)"), "low", echo=True)]
    funcs = {f[2] for f in e.frames}
    spawn_frames = bool(e.kinds & {"mp"})
    resource = e.type in _RESOURCE_TYPES
    if vocab.GUARD.search(msg) and (bare or spawn_frames):
        return [_Finding("missing_main_guard", said, conf)]
    if vocab.MAIN_ATTR.search(msg) and (bare or spawn_frames) and e.raised_in != "user":
        return [_Finding("main_not_importable", said, conf)]
    if resource and vocab.FORK_REFUSED.search(msg) and (bare or (spawn_frames and funcs & _FORK_FUNCS) or (
            vocab.THREAD_REFUSED.search(msg) and funcs & _THREAD_FUNCS)):
        thread = "thread" in msg
        return [_Finding("fork_refused", said + f" - the kernel refused a new {'thread' if thread else 'process'} "
                         "for the DataLoader", conf, variant="thread" if thread else None)]
    if resource and vocab.SHM_GONE.search(msg):
        return [_Finding("shm_exhausted", said + " - the file of a batch in flight was gone from /dev/shm (deleted "
                         "under the loader, not a full /dev/shm)", conf, variant="removed")]
    if resource and vocab.SHM.search(msg):
        return [_Finding("shm_exhausted", said, conf)]
    if resource and vocab.FD.search(msg):
        line = next((f for f in reversed(e.frames) if f[3] in ("user", "lib")), None)
        if e.raised_in in ("user", "lib") and "mp" not in e.kinds:
            return [_Finding("fd_limit", said + f" - raised by the Dataset's own file opening at {_at(line)}", conf,
                             variant="user_leak", detail=f"{line[2]}: {line[4]}")]
        return [_Finding("fd_limit", said, conf)]
    if e.type in _CUDA_TYPES and vocab.CUDA.search(msg):
        return [_Finding("cuda_in_worker", said + (" (CUDA touched by the Dataset in the main process, "
                                                   "num_workers=0)" if single_process and not bare else ""), conf)]
    if e.type in _PICKLE_TYPES and vocab.PICKLE.search(msg) and (bare or (spawn_frames and e.raised_in != "user" and (
            funcs & {"dump", "dumps", "_launch", "start", "__init__", "_Popen", "reduce", "_send", "send"}))):
        return [_Finding("unpicklable_dataset", said + " (raised while sending the dataset/collate_fn/"
                         "worker_init_fn to a new worker)", conf)]
    return []


def _classify_wrapper(e: _Exc, m, where: str, conf: str) -> _Finding:
    inner_type, place = m.group(1), m.group(2)
    inner = _inner_line(e.message)
    inner_frames = [f for f in _frames(_inner_traceback(e.message)) if f[3] != "boot"]
    said = f"{where}: {e.type} 'Caught {inner_type} in {place}' - inner error: {_short(inner)}"
    if inner_type in _RESOURCE_TYPES and vocab.THREAD_REFUSED.search(inner):
        return _Finding("fork_refused", said + " (the kernel refused a thread the worker's code started)", conf,
                        variant="thread")
    if inner_type in _RESOURCE_TYPES and vocab.SHM.search(inner):
        return _Finding("shm_exhausted", said + " (a shared-memory allocation failed in the worker)", conf)
    if inner_type in _RESOURCE_TYPES and vocab.FD.search(inner):
        last = inner_frames[-1] if inner_frames else None
        if last is not None and last[3] in ("user", "lib") and not any(f[3] == "mp" for f in inner_frames):
            return _Finding("fd_limit", said + f" (raised at {_at(last)}: the Dataset's own code opening files, "
                            "not the loader's IPC)", conf,
                            variant="user_leak", detail=f"{last[2]}: {last[4]}" if last[4] else last[2])
        return _Finding("fd_limit", said + " (the worker ran out of file descriptors)", conf)
    if inner_type in _CUDA_TYPES and vocab.CUDA.search(inner):
        return _Finding("cuda_in_worker", said + " (CUDA used inside a DataLoader worker)", conf)
    return _Finding("worker_exception", said, conf, detail=_short(inner, 120))


def worker_line(text: str, saw: str) -> Optional[_Finding]:
    """The line torch's signal handler printed in a worker as it died (a segfault, a bus error), where the
    process that owned the worker saw only an echo of the death (``saw`` says which); None without one."""
    line = vocab.WORKER_LINE.search(text)
    if line is None:
        return None
    return _Finding("shm_exhausted" if line.group(1) == "bus error" else "native_crash", f"a DataLoader worker "
                    f"printed {line.group(0)!r} before it died ({saw})", "medium")


def stopped_inside(text: str, stop: tuple, conf: str, pid: Optional[int]) -> _Finding:
    """A worker's SIGTERM (``text``) that a library raised inside it, as its own ``stop`` line on stderr says."""
    return _Finding("native_crash", f"{text}, raised inside the worker by {stop[1]}: '{stop[0]}' on stderr - the "
                    "library's own stop of a process forked after its threads started, not a signal from outside",
                    conf, detail="15", pid=pid)


def _cause_for_signal(sig: Optional[int]) -> str:
    if sig == 9:
        return "oom_killed"
    if sig == 7:
        return "shm_exhausted"
    if sig in vocab.NATIVE_SIGNALS:
        return "native_crash"
    return "worker_exit"


#: messages that only Python or multiprocessing raise, in a process of a run: where two processes print
#: tracebacks at once, unbuffered stderr cuts their lines into pieces (a row of carets is written a caret at
#: a time) and a traceback's last line can be a piece of the other's, but an exception's message is one
#: write and stays whole, so these are looked for in the whole stderr
_INTACT = (("missing_main_guard", vocab.GUARD), ("main_not_importable", vocab.MAIN_ATTR),
           ("fd_limit", vocab.FD_EXACT))


def _intact(stderr: str) -> Optional[tuple]:
    for cause, regex in _INTACT:
        m = regex.search(stderr)
        if m:
            return cause, " ".join(m.group(0).split())
    return None


def _stderr_findings(facts: _Facts) -> list:
    """Findings from tracebacks that child processes printed (each says which kind of process)."""
    found, seen = [], set()
    for who, text in _printed(facts.stderr):
        if who == "other" or not text:
            continue
        cause = None
        if vocab.THREAD_REFUSED.search(text) and who in ("worker", "feeder", "mp_child", "child_start"):
            cause = "fork_refused"  # a thread the process needed: its queue feeder, the fd sharer, its own
        elif vocab.GUARD.search(text):
            cause = "missing_main_guard"
        elif (vocab.MAIN_ATTR.search(text) or vocab.STDIN_MAIN.search(text)) and who == "child_start":
            cause = "main_not_importable"
        elif vocab.FD_EXACT.search(text):  # before SHM: "unable to open shared memory object </torch_...> in
            cause = "fd_limit"  # read-write mode: Too many open files (24)" is the fd limit, not a full /dev/shm
        elif vocab.SHM.search(text):
            cause = "shm_exhausted"
        elif vocab.FD.search(text):
            cause = "fd_limit"
        elif vocab.CUDA.search(text) and who in ("worker", "child_start", "mp_child"):
            cause = "cuda_in_worker"
        elif vocab.PICKLE.search(text) and who in ("child_start", "feeder"):
            cause = "unpicklable_dataset"
        elif (whole := _intact(facts.stderr)) is not None:  # this traceback's lines were cut up by another's
            cause, text = whole
        elif who == "child_start":
            cause = "worker_exit"
        if cause is None or (cause, text) in seen:
            continue
        seen.add((cause, text))
        variant = "startup" if cause == "worker_exit" else "thread" if cause == "fork_refused" else None
        found.append(_Finding(cause, f"stderr: {_WHO[who]}: {_short(text)}" + (
            " - the kernel refused a thread the process needed" if cause == "fork_refused" else ""), "medium",
            detail=text if cause == "worker_exit" else "", variant=variant))
    for m in vocab.TORCH_WARNING.finditer(facts.stderr):
        path, category, text = m.groups()
        if re.search(r"Got pickle error when attempting to start a worker Process", text):
            found.append(_Finding("unpicklable_dataset", f"stderr: {category} from {os.path.basename(path)} "
                                  f"(torch.utils.data): {_short(text)}", "medium"))
            break
    return found


# =========================================================================== worker statuses and memory
def _watchdog_mib(kill: dict) -> str:
    return f"{(kill.get('rss') or 0) / 2**20:.0f} MiB RSS (budget {(kill.get('budget') or 0) / 2**20:.0f} MiB)"


def _memory_evidence(facts: _Facts, pid: Optional[int], main: bool = False) -> Optional[str]:
    """What says a SIGKILL of ``pid`` was for memory, or None."""
    for k in facts.watchdog_kills:
        if (main and k.get("main")) or (not main and k.get("pid") == pid):
            return f"the lab's memory watchdog SIGKILLed it at {_watchdog_mib(k)} - its stand-in for the kernel OOM " \
                "killer"
    w = next((w for w in facts.workers if w.pid == pid), None)
    if w is not None and w.killed_by_watchdog:
        return "the lab's memory watchdog SIGKILLed it (its stand-in for the kernel OOM killer)"
    ml = facts.memory_limit or {}
    rec = ml.get("kernel_record")
    if w is not None and w.killed_by_kernel_oom and not rec:
        return "the kernel's OOM killer killed it (the run's cgroup recorded the kill)"
    if isinstance(rec, dict) and (rec.get("oom_kill") or 0) > 0:
        killed, named = kernel_killed(facts)
        if (pid in killed) or main and rec.get("main_killed") or (not killed and not main):
            how = ("the kernel log names this pid" if named else
                   "the run's memory cgroup counted the kill as it died by SIGKILL; the kernel log was not "
                   "readable to name the pid")
            return (f"the kernel's OOM killer: the run's memory cgroup records oom_kill {rec.get('oom_kill')} "
                    f"({how}; limit {(ml.get('limit') or 0) / 2**20:.0f} MiB)")
    limit = ml.get("limit")
    if limit and w is not None and w.peak_rss and w.peak_rss >= 0.8 * limit:
        return (f"its memory climbed to {w.peak_rss / 2**20:.0f} MiB RSS, near the run's limit of "
                f"{limit / 2**20:.0f} MiB")
    if facts.kernel_record is not None and pid:
        try:
            rec = facts.kernel_record([pid], since=facts.since)
        except Exception:  # noqa: BLE001 - a probe never breaks a diagnosis
            rec = None
        if rec:
            return f"the kernel log names it: {_short((rec.get('lines') or [''])[0], 140)}"
    return None


def kernel_killed(facts: _Facts) -> tuple:
    """(pids the kernel's OOM killer killed, whether the kernel log named them).

    The kernel log's ``Killed process N`` lines name the pid; without them the runner guessed, from the
    order in which processes died while the cgroup's ``oom_kill`` counter rose, and that guess can land on
    a worker that the loader stopped a moment later (exit -15, or 0). The guess is kept only for pids that
    died by SIGKILL; when it names none of them, the run's SIGKILLed workers are the ones, if there are no
    more of them than the counter's kills."""
    rec = (facts.memory_limit or {}).get("kernel_record") or {}
    pids = list(rec.get("killed_pids") or [])
    if not rec:  # no record of the kernel's own: the runner's flag per process is all there is
        return {w.pid for w in facts.workers if w.killed_by_kernel_oom}, False
    if rec.get("killed_pids_from") == "dmesg":
        return set(pids), True
    codes = {w.pid: w.exitcode for w in facts.workers}
    sigkilled = {p for p, c in codes.items() if c == -9}
    kept = {p for p in pids if codes.get(p) in (-9, None) and (p in sigkilled or p not in codes)}
    if kept:
        return kept, False
    count = rec.get("oom_kill") or 0
    if sigkilled and len(sigkilled) <= count:
        return sigkilled, False
    return set(), False


_ANY_SENDER = f"the kernel OOM killer or any of {OTHER_SIGKILL_SENDERS} may have sent it"
#: what a spawned worker prints when its interpreter's exit aborts it (see :func:`after_the_failure`)
_TERMINATE = "terminate called without an active exception"


def after_the_failure(facts: _Facts, w) -> Optional[str]:
    """Why the native crash of worker ``w`` came after the loader's failure and is not its reason, or None.

    The failure (the error that ended the script, else the last one the loader raised) names other workers,
    dead. ``w`` is not among them, and the record shows it was still alive when they died: PyTorch's
    ``exited unexpectedly (pid(s) ...)``, made from every worker's ``is_alive()`` at the raise, leaves it
    out; or the runner saw it end in a later tick than each worker named, and after the error was raised
    (where the bootstrap recorded when). Such a worker died while the loader shut its workers down.

    Seen here: a spawned worker whose interpreter exit aborts (SIGABRT, ``terminate called without an active
    exception``) while its queue feeder thread, a daemon, is inside torch with the GIL released (Python 3.11
    ends such a thread with ``pthread_exit``, which cannot unwind through torch's C++ frames)."""
    chains = [facts.ended] if facts.ended else facts.loader_errors[-1:]  # the failure: what ended the script
    named = {p for c in chains for p in _worker_pids_named(c)}
    if w.pid is None or not named or w.pid in named:
        return None
    dead = [x for x in facts.workers if x.pid in named and x.exitcode not in (None, 0)]
    if not dead:
        return None
    them = ", ".join(str(x.pid) for x in dead)
    listed = [e for c in chains for e in c if vocab.DIED.match(e.head)]
    if listed:
        return (f"PyTorch's list of the workers dead when it raised, pid(s) {them}, leaves it out: it was "
                "alive then")
    seen, t = [facts.ended_at.get(x.pid) for x in dead], facts.ended_at.get(w.pid)
    if t is None or None in seen or t <= max(seen) or (facts.raised and t <= min(facts.raised)):
        return None
    return (f"the runner saw it end {t - max(seen):.2f} s after pid(s) {them}"
            + (", and after the error was raised" if facts.raised else ""))


def _after_finding(facts: _Facts, w, text: str, why: str) -> _Finding:
    said = f"{text} after the failure ({why}): it died while the DataLoader shut its workers down"
    if -w.exitcode == 6 and _TERMINATE in facts.stderr:
        said += (f" - '{_TERMINATE}' on stderr: how a spawned worker's interpreter exit aborts when its queue "
                 "feeder thread is still inside torch")
    return _Finding("_after_failure", said + "; a consequence, not the reason the run failed", "low",
                    detail=str(-w.exitcode), echo=True, pid=w.pid)


def _worker_findings(facts: _Facts) -> list:
    found = []
    for w in facts.workers:
        if w.exitcode is None or w.exitcode == 0:
            continue
        who = "DataLoader worker" if w.role == "dataloader_worker" else "child process"
        if w.exitcode < 0:
            sig = -w.exitcode
            text = f"{who} pid {w.pid}: killed by {signal_name(sig)}"
            cause = _cause_for_signal(sig)
            if sig == 9:
                why = _memory_evidence(facts, w.pid)
                if why:
                    found.append(_Finding("oom_killed", f"{text} - {why}", "high", pid=w.pid))
                else:
                    found.append(_Finding("oom_killed", f"{text}; no memory evidence recorded (no watchdog kill, no "
                                          f"kernel OOM record): {_ANY_SENDER}", "low", variant="no_memory_evidence",
                                          pid=w.pid))
            elif sig == 15 and (stop := vocab.library_stop(facts.stderr)):
                found.append(stopped_inside(text, stop, "high", w.pid))
            elif sig == 15:
                found.append(_Finding("worker_exit", f"{text} (SIGTERM: sent from outside the worker, or by the "
                                      "DataLoader's own shutdown of a worker that did not stop)", "low",
                                      variant="sigterm", detail="15"))
            elif sig in vocab.NATIVE_SIGNALS and (why := after_the_failure(facts, w)):
                found.append(_after_finding(facts, w, text, why))
            else:
                found.append(_Finding(cause, text, "high", detail=str(sig)))
        elif w.exitcode == 1:  # what Python exits with after an uncaught exception: a traceback is missing
            found.append(_Finding("worker_exit", f"{who} pid {w.pid}: exited with code 1 (no signal; 1 is also "
                                  "the status of a Python process that died of an uncaught exception, whose "
                                  "traceback would be on stderr)", "medium", detail="code 1"))
        else:
            found.append(_Finding("worker_exit", f"{who} pid {w.pid}: exited with code {w.exitcode} "
                                  "(no signal: the worker's own exit)", "high" if w.role == "dataloader_worker"
                                  else "medium", detail=f"code {w.exitcode}"))
    worker_pids = {w.pid for w in facts.workers}
    found += [_Finding("oom_killed", f"pid {k.get('pid')} SIGKILLed by the lab's memory watchdog at "
                       f"{_watchdog_mib(k)}", "high")
              for k in facts.watchdog_kills if not k.get("main") and k.get("pid") not in worker_pids]
    return found


def _main_signal_findings(facts: _Facts) -> list:
    sig = facts.main_signal
    if facts.outcome != "failed" or not sig:
        return []
    if sig == 9:
        why = _memory_evidence(facts, None, main=True)
        if why:
            return [_Finding("oom_killed", f"main process killed by SIGKILL - {why}", "high")]
        return [_Finding("oom_killed", f"main process killed by SIGKILL; no memory evidence recorded: {_ANY_SENDER}",
                         "low", variant="no_memory_evidence")]
    if sig in vocab.NATIVE_SIGNALS or sig == 7:
        return [_Finding("_main_native", f"main process killed by {signal_name(sig)} (native code crashed in the "
                         "main process)", "high", detail=str(sig))]
    return [_Finding("_main_stopped", f"main process killed by {signal_name(sig)}", "high", detail=str(sig))]


def _stall_findings(facts: _Facts) -> list:
    found = []
    if facts.stall:
        s = facts.stall
        found.append(_Finding("hang", f"no batch for {s.get('idle_s', s.get('limit', '?'))} s while workers were "
                              f"alive (stall limit {s.get('limit')} s), after {s.get('batches', '?')} batches: "
                              "the runner stopped it", "high"))
    elif facts.outcome == "timed_out":
        found.append(_Finding("hang", f"no result before the run's time limit: {facts.reason or 'timed out'}",
                              "low"))
    where = _stuck_where(facts.stderr)  # a stall or a time limit: the stacks dumped before the stop
    return found + ([_Finding("hang", where, "medium")] if where else [])


def _stuck_where(stderr: str) -> str:
    """What the faulthandler dump taken before the runner's kill says the main process was doing."""
    dump = stderr[stderr.rfind("most recent call first"):] if "most recent call first" in stderr else ""
    if not dump and re.search(r"^Thread \d+ \(\w+\): ", stderr, re.M):  # py-spy dump's format
        dump = stderr[stderr.find("Thread "):]
    if not dump:
        return ""
    if re.search(r"in (_try_get_data|_get_data|_next_data)\b|^\s+(_try_get_data|_get_data) \(", dump, re.M):
        return ("faulthandler dump: the main process was waiting for a batch from the workers "
                "(DataLoader _try_get_data), and none came")
    if re.search(r"in _launch", dump):
        return "faulthandler dump: the main process was blocked starting a worker (sending it the dataset)"
    m = re.search(r'File "([^"]+)", line (\d+) in (\w+)', dump)
    return f"faulthandler dump: the main process was in {m.group(3)} ({m.group(1)}:{m.group(2)})" if m else ""


def _stack_lines(facts: _Facts) -> list:
    """The innermost frame of each stack the runner dumped on a stall."""
    lines = []
    for pid, text in list(facts.stacks.items())[:8]:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text or "")
        if frames:
            path, line, func = frames[0]  # faulthandler prints the innermost frame first
            user = next((f for f in frames if _frame_kind(f[0]) == "user"), None)
            extra = f", called from {_at(user)}" if user and user != frames[0] else ""
            lines.append(f"stack of pid {pid}: in {func} ({os.path.basename(path)}:{line}){extra}")
    return lines


# =========================================================================== texts left unexplained
_ANY_LOADER = frozenset(LOADER_CAUSES)


def _text_causes(e: _Exc) -> Optional[frozenset]:
    """The causes that account for one DataLoader error text; None when the text is no DataLoader error."""
    head, msg = e.head, (e.message or "").strip()
    m = vocab.WRAPPER.match(msg)
    if m:
        return frozenset({_classify_wrapper(e, m, "", "high").cause})
    if vocab.THREAD_REFUSED.search(msg):
        return frozenset({"fork_refused"})
    if vocab.TIMEOUT.match(head):
        return frozenset({"timeout"})
    km = vocab.KILLED.match(head)
    if km:
        sig = vocab.signal_from_word(km.group(2))
        causes = {_cause_for_signal(sig)}
        if sig in (9, 15):  # the runner's own stop of a stuck run, or a launcher's SIGTERM
            causes |= {"hang", "timeout", "worker_exit", "oom_killed"}
        return frozenset(causes)
    if vocab.EXIT_CODE.match(head) or vocab.DIED.match(head) or vocab.PIN_DIED.match(head):
        return _ANY_LOADER  # an echo: any death of a worker or failure of the loader accounts for it
    if "bootstrapping phase" in msg:
        return frozenset({"missing_main_guard"})
    if vocab.MAIN_ATTR.search(msg):
        return frozenset({"main_not_importable", "missing_main_guard"})
    return None


def _record_texts(facts: _Facts, tree: list) -> list:
    """The DataLoader error texts the record holds where a process raised or printed them: the chain that
    ended the script, the chains that escaped the loader, each child's chain, and the last line of each
    traceback a child process printed (stderr lines that are no process's traceback are not counted)."""
    chains = [facts.ended, *facts.loader_errors, *[n.chain for n in tree if n.chain]]
    excs = [e for c in chains for e in c if _through_loader(e) is not False]  # raised where it counts
    for who, last in _printed(facts.stderr):
        if who != "other" and last:
            kind, _, rest = last.partition(": ")
            excs.append(_Exc(kind.rsplit(".", 1)[-1], rest or last, "", None, "ended"))
    out: dict = {}
    for e in excs:
        causes = _text_causes(e)
        if causes is not None:
            out.setdefault(_short(f"{e.type}: {e.head}", 160), causes)
    return list(out.items())


def _unexplained(cause: str, facts: _Facts, tree: list) -> list:
    return [t for t, causes in _record_texts(facts, tree) if cause not in causes]
