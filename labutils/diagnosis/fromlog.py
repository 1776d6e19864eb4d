"""The evidence of a log's text: every exception chain printed in it (the primary failure against its
echoes), the worker pids PyTorch's messages name, and the platform's own words about a kill (the kernel's OOM
line, Slurm's oom_kill event, Kubernetes' OOMKilled and exit code 137, a shell's ``Killed``).

A log proves less than a run: no exit status of a worker, no watchdog, no /dev/shm reading. The rules are the
run's (:mod:`.decide`); what the text cannot decide keeps its confidence below ``high`` and says which
command on the job's machine would decide it (:mod:`.model`).
"""

from __future__ import annotations

import re

from . import messages as vocab
from .evidence import _Exc, _Facts, quoted, with_quoted, worker_death_kind, workers_named

HEADER = "Traceback (most recent call last):"
_LINKS = {"The above exception was the direct cause of the following exception:": "cause",
          "During handling of the above exception, another exception occurred:": "context"}
#: a line that is an exception's ``Type: message`` (or a bare type), with a dotted module path allowed
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Empty)|"
                       r"[A-Za-z_][\w.]*\.[A-Z]\w*|RuntimeError|KeyError|StopIteration)(?::\s?(.*))?$")
_TYPED = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in \S+')
_PYTEST_FRAME = re.compile(r"^(\S+\.py):(\d+): in (\S+)$")

# the platform's words
KERNEL_OOM = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]*)\)")
KERNEL_OOM_TASK = re.compile(r"oom-kill:.*?task=([^,\s]+),pid=(\d+)")
SLURM_OOM = re.compile(r"slurmstepd(?:-[\w.-]+)?: error: Detected (\d+) oom[-_]kill events?")
K8S_OOM = re.compile(r"\bOOMKilled\b")
K8S_137 = re.compile(r"Exit Code:\s*137\b|exit code:? 137\b|exited with code 137\b", re.I)
SHELL_SIGNAL = re.compile(r"^(?:.*: line \d+: +\d+ |\[\d+\]\+? +)?(Killed|Segmentation fault|Bus error|Aborted|"
                          r"Floating point exception|Illegal instruction|Terminated)(?: \(core dumped\))?"
                          r"(?:\s+\S.*)?$", re.M)


# =========================================================================== chains printed in a text
def _segment(lines: list, i: int) -> tuple:
    """One traceback from its header at ``lines[i]``: ``(frames, message lines, index after it)``."""
    frames, j = [], i + 1
    while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
        if not lines[j].strip() and j + 1 < len(lines) and not lines[j + 1].startswith((" ", "\t")):
            break
        frames.append(lines[j])
        j += 1
    if j >= len(lines):
        return frames, [], j
    message, j = [lines[j]], j + 1
    original = False
    while j < len(lines):
        line = lines[j]
        if line.startswith(vocab.ORIGINAL) or (line.startswith(HEADER) and message[-1].endswith(":")
                                               and len(message) == 1 and not frames):
            original = True
        elif line.startswith((" ", "\t")) and line.strip():
            pass  # an indented line of a multi-line message, or the frames of a quoted worker traceback
        elif original and _EXC_LINE.match(line.strip()):
            message.append(line)
            original = False
            j += 1
            continue
        else:
            break
        message.append(line)
        j += 1
    return frames, message, j


def _exc(frames: list, message: list, traceback: bool = True) -> _Exc:
    """The exception a traceback's frames and message lines print (with ``traceback`` False: its message only)."""
    head = message[0].strip() if message else ""
    m = _EXC_LINE.match(head)
    if m:
        kind, first = m.group(1).rsplit(".", 1)[-1], (m.group(2) or "")
    else:
        kind, first = "?", head
    text = "\n".join([first, *message[1:]]).strip()
    return _Exc(kind, text, "\n".join([HEADER, *frames, *message]) if traceback else "", None, "ended")


def printed_chains(text: str, headless: bool = True) -> list:
    """Every exception chain printed in ``text`` as ``(line index, [_Exc, ...] outermost first)``, in order.

    A chain is one or more tracebacks joined by Python's "The above exception ..." lines. With ``headless``, a
    traceback whose top was cut off (frames, then the exception line, with no header) and a lone ``Type:
    message`` line of a DataLoader message (pytest's ``E`` lines, a chat paste) count as one-link chains."""
    lines = text.split("\n")
    out, i, used = [], 0, set()
    while i < len(lines):
        if lines[i].strip() == HEADER:
            start, chain, link = i, [], None
            while i < len(lines) and lines[i].strip() == HEADER:
                frames, message, i = _segment(lines, i)
                e = _exc(frames, message)
                e.link = link
                chain.append(e)
                used.update(range(start, i))
                k = i
                while k < len(lines) and not lines[k].strip():
                    k += 1
                if k < len(lines) and lines[k].strip() in _LINKS:
                    link = _LINKS[lines[k].strip()]
                    i = k + 1
                    while i < len(lines) and not lines[i].strip():
                        i += 1
                else:
                    break
            chain.reverse()  # printed oldest first: the one that ended the process first here
            for n, e in enumerate(chain):
                e.link = None if n == 0 else (chain[n - 1].link or "cause")
            chain[0].link = None
            chain[0].ignored = _after_ignored(lines, start)
            out.append((start, chain))
        else:
            i += 1
    if headless:
        out += _headless(lines, used)
        out.sort(key=lambda pair: pair[0])
    return out


def last_chain(text: str) -> list:
    """The last exception chain printed in ``text`` with its traceback header, outermost first; [] if none."""
    chains = printed_chains(text, headless=False)
    return chains[-1][1] if chains else []


def _after_ignored(lines: list, start: int) -> bool:
    """Is the traceback at ``lines[start]`` one Python reports as ignored (an exit handler's, a ``__del__``'s):
    printed after the script's own end, for an exception that ended nothing?"""
    k = start - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    return k >= 0 and lines[k].lstrip().startswith("Exception ignored in")


def _headless(lines: list, used: set) -> list:
    """One-link chains from exception lines outside any traceback: a cut top, pytest's E lines, a paste."""
    out = []
    for i, line in enumerate(lines):
        if i in used or line.startswith((" ", "\t")):
            continue
        if not _loaderish(line):
            continue
        typed = _TYPED.search(line)  # "Error : RuntimeError: ...": the exception line after a logger's words
        if typed and typed.start():
            line = line[typed.start():]
        m = _EXC_LINE.match(line.strip())
        if not m:
            continue
        k, frames = i - 1, []
        while k >= 0 and k not in used and (lines[k].startswith((" ", "\t")) or _PYTEST_FRAME.match(lines[k])):
            p = _PYTEST_FRAME.match(lines[k])
            frames.insert(0, f'  File "{p.group(1)}", line {p.group(2)}, in {p.group(3)}' if p else lines[k])
            k -= 1
        frames_seen = [f for f in frames if _FRAME.match(f)]
        message = [line]
        j = i + 1
        while j < len(lines) and j not in used and (lines[j].startswith((" ", "\t", vocab.ORIGINAL))
                                                    or (message[-1].startswith((" ", "\t"))
                                                        and _EXC_LINE.match(lines[j].strip()))):
            message.append(lines[j])
            j += 1
        used.update(range(k + 1, j))
        out.append((i, [_exc(frames, message, bool(frames_seen))]))
    return out


def _loaderish(text: str) -> bool:
    """Does this line carry a DataLoader or resource message the rules read (PyTorch's name the DataLoader)?"""
    return "DataLoader" in text or any(regex.search(text) for regex in (vocab.PIN_DIED, vocab.SHM, vocab.FD_EXACT,
                                                                        vocab.GUARD, vocab.MAIN_ATTR))


# =========================================================================== ranking: the primary failure
def _score(chain: list) -> int:
    """2: a DataLoader failure of its own (a worker's error, a death with its reason, a resource message);
    1: an echo of a death or frames of the DataLoader; 0: nothing of the loader."""
    best = 0
    own = "\n".join(e.traceback.split(vocab.ORIGINAL)[0] for e in chain)  # not a quoted worker traceback
    if re.search(r", in (_main|spawn_main|_worker_loop|_bootstrap)$", own, re.M):
        return 0  # a child printed it (a spawn child starting, a worker): evidence beside the failure, not it
    for e in chain:
        inner = quoted(e) or e
        kind = worker_death_kind(inner)
        if kind in ("killed", "exitcode") or vocab.WRAPPER.match((inner.message or "").strip()) \
                or vocab.OLD_WRAPPER.match((inner.message or "").strip()) or vocab.TIMEOUT.match(inner.head):
            return 2
        if vocab.SHM.search(inner.message or "") or vocab.FD_EXACT.search(inner.message or "") \
                or vocab.GUARD.search(inner.message or "") or vocab.MAIN_ATTR.search(inner.message or ""):
            return 2
        if kind or "loader" in e.kinds:
            best = 1
    return best


def primary(chains: list) -> tuple:
    """``(the primary chain, the others)``: the last chain with the most to say about the DataLoader, of those
    not reported as ignored (at exit, multiprocessing's handler stops the workers still alive, and PyTorch's
    SIGCHLD handler can raise inside it: "Exception ignored in atexit callback", a kill by SIGTERM that the
    exiting main process sent itself, after the failure)."""
    if not chains:
        return [], []
    ranked = max(range(len(chains)), key=lambda n: (not chains[n][1][0].ignored, _score(chains[n][1]), n))
    return chains[ranked][1], [c for n, (_, c) in enumerate(chains) if n != ranked]


# =========================================================================== platform words
def platform(text: str) -> dict:
    """The platform's own words about kills in ``text``: kernel OOM lines (pid -> line), Slurm's oom_kill
    events, Kubernetes' OOMKilled / exit code 137, and the signal a shell printed for the main process."""
    kernel = {}
    for m in KERNEL_OOM.finditer(text):
        kernel.setdefault(int(m.group(1)), m.group(0))
    for m in KERNEL_OOM_TASK.finditer(text):
        kernel.setdefault(int(m.group(2)), m.group(0))
    slurm = SLURM_OOM.search(text)
    shell = SHELL_SIGNAL.search(text)
    return {"kernel": kernel, "slurm": slurm.group(0) if slurm else None,
            "k8s_oom": bool(K8S_OOM.search(text)), "k8s_137": bool(K8S_137.search(text)),
            "shell": shell.group(1) if shell else None, "shell_line": shell.group(0).strip() if shell else None}


def memory_words(words: dict) -> list:
    """Lines of the platform that say a kill was for memory."""
    out = [f"the kernel log in the text: {line}" for line in words["kernel"].values()]
    if words["slurm"]:
        out.append(f"Slurm: {words['slurm']}")
    if words["k8s_oom"]:
        out.append("Kubernetes: the container's last state is OOMKilled")
    return out


def cut_before_its_error(chain: list) -> bool:
    """The traceback stops before its exception line (pasted cut at the bottom): its error is not in the text."""
    return bool(chain) and chain[0].type == "?" and not (chain[0].message or "").strip()


def reruns_main(chain: list) -> bool:
    """A spawned child's traceback that runs the script's top level again (multiprocessing's
    ``_fixup_main_from_path``, then the script's ``<module>``): what a script without a main guard does."""
    text = "\n".join(e.traceback for e in chain)
    i = text.find("in _fixup_main_from_path")
    return i >= 0 and ", in <module>" in text[i:]


def facts_from_text(text: str) -> tuple:
    """``(_Facts, the other chains, platform words)`` of a cleaned log text."""
    chains = printed_chains(text)
    main, others = primary(chains)
    words = platform(text)
    facts = _Facts(source="log", outcome="failed" if main else None, stderr=text)
    facts.ended = with_quoted(main)
    facts.workers = workers_named(facts.ended)

    def kernel_record(pids, since=None):
        lines = [words["kernel"][p] for p in pids if p in words["kernel"]]
        return {"lines": lines} if lines else None

    facts.kernel_record = kernel_record
    if not main:
        signal_word = words["shell"] or ("Killed" if words["k8s_oom"] or words["k8s_137"] else None)
        sig = vocab.signal_from_word(signal_word) if signal_word else None
        if sig:
            facts.outcome, facts.main_signal, facts.returncode = "failed", sig, -sig
    return facts, others, words
