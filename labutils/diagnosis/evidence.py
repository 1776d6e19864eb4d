"""The evidence of a run, a live exception or a log, as the rules read it: exception chains (live, or as Python
printed them) with the frames that say who raised them, the processes and their exit statuses, the tracebacks
child processes printed on stderr, and PyTorch's own messages about a worker's death."""

from __future__ import annotations

import os
import re
import traceback as tb_mod
from dataclasses import dataclass, field
from typing import Any, Optional

from ..runner.result import ProcessInfo, signal_name
from . import messages as vocab
from .chain import links as _chain_links

# =========================================================================== frames: whose code raised it
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _frame_kind(path: str) -> str:
    """``loader`` (torch.utils.data), ``mp`` (multiprocessing, torch.multiprocessing), ``torch``, ``lib``
    (stdlib or an installed package), ``boot`` (the runner's bootstrap, runpy, a spawn child's ``-c``)
    or ``user`` (everything else: the script and its own modules)."""
    p = path.replace("\\", "/")
    if "/torch/utils/data/" in p:
        return "loader"
    if "/multiprocessing/" in p:
        return "mp"
    if "/torch/" in p:
        return "torch"
    if p.endswith("labutils/runner/bootstrap.py") or p.endswith("/runpy.py") or p in ("<string>", "<stdin>"):
        return "boot"
    if p.startswith("<frozen") or "/site-packages/" in p or "/dist-packages/" in p or re.search(
            r"/lib/(python\d\.\d+/|pypy)", p):
        return "lib"
    if "/IPython/" in p or "/ipykernel/" in p:
        return "boot"
    return "user"


def _frames(text: str) -> list:
    """``(path, line, function, kind, source line)`` of every frame in a traceback's text."""
    out = []
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            src = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            out.append((m.group(1), int(m.group(2)), m.group(3), _frame_kind(m.group(1)), src))
    return out


# =========================================================================== evidence model
@dataclass
class _Exc:
    type: str
    message: str
    traceback: str = ""
    link: Optional[str] = None
    origin: str = "ended"  # "ended" (ended the script), "next"/"init" (escaped the loader), "live"
    t: Optional[float] = None
    ended_run: bool = False  # escaped the loader and then ended the script
    ignored: bool = False  # a log's "Exception ignored in ...": reported by Python at exit, never what ended it

    def __post_init__(self) -> None:
        self.frames = [f for f in _frames(self.traceback) if f[3] != "boot"]

    @property
    def head(self) -> str:
        msg = (self.message or "").strip()
        return msg.splitlines()[0] if msg else ""

    @property
    def kinds(self) -> set:
        return {f[3] for f in self.frames}

    @property
    def user_frame(self) -> Optional[tuple]:
        """The innermost frame of the script's own code."""
        return next((f for f in reversed(self.frames) if f[3] == "user"), None)

    @property
    def raised_in(self) -> Optional[str]:
        return self.frames[-1][3] if self.frames else None


@dataclass
class _Finding:
    cause: str
    text: str
    conf: str = "high"  # high / medium / low
    detail: str = ""  # e.g. the inner worker error, for the summary
    echo: bool = False  # a consequence of a worker death, not its reason
    variant: Optional[str] = None  # a catalogue variant (summary and fixes) for this evidence
    pid: Optional[int] = None  # the process it is about, where known


@dataclass
class _Facts:
    """The evidence the rules read, one model for every source (``run``, ``exception``, ``log``): built from a
    RunResult or a live exception (:mod:`.gather`), a log's text (:mod:`.logread`), a child or a rank's own
    chain (:func:`.decide.decide_process`)."""

    source: str
    ended: list = field(default_factory=list)  # the chain that ended the script (or a live chain)
    loader_errors: list = field(default_factory=list)  # chains that escaped next()/iter(), in time order
    workers: list = field(default_factory=list)  # ProcessInfo, as the run recorded them
    #: when the runner saw each process end (pid -> time.time() of the monitor's tick, at or after its death)
    ended_at: dict = field(default_factory=dict)
    exit_status: dict = field(default_factory=dict)  # pid -> exit status, as the runner saw each process end
    #: DataLoader workers the monitor saw end in processes the main one started (torchrun's ranks' workers)
    other_loader_workers: int = 0
    stderr: str = ""
    outcome: Optional[str] = None
    returncode: Optional[int] = None
    main_signal: Optional[int] = None
    watchdog_kills: list = field(default_factory=list)
    iters: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    reason: Optional[str] = None
    notes: list = field(default_factory=list)
    live_dataset: Any = None
    live_findings: list = field(default_factory=list)
    memory_limit: Optional[dict] = None
    stall: Optional[dict] = None
    stacks: dict = field(default_factory=dict)
    batches: Optional[int] = None
    env: dict = field(default_factory=dict)
    kernel_record: Any = None  # callable(pids, since=) -> dict|None, read only when a SIGKILL needs it
    since: Optional[float] = None  # a run's start (time.time()): older kernel log lines are not about it
    raised: list = field(default_factory=list)  # time.time() of each loader error the bootstrap recorded
    last_batch_t: Optional[float] = None  # time.time() of the last batch the DataLoader delivered
    end_t: Optional[float] = None  # the last time.time() the run's record holds (its end, near enough)


def _exit_words(code: Optional[int], signal: Optional[str] = None) -> str:
    """``killed by SIGKILL``, ``exit code 1``."""
    if signal or (code is not None and code < 0):
        return f"killed by {signal or signal_name(-code)}"
    return f"exit code {code}"


def _at(frame: tuple) -> str:
    """``file.py:12 in func``."""
    return f"{os.path.basename(frame[0])}:{frame[1]} in {frame[2]}"


def _batches(n: int) -> str:
    return f"{n} batch" if n == 1 else f"{n} batches"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# =========================================================================== the worker-death detector
def worker_death_kind(e) -> Optional[str]:
    """What one exception (or :class:`_Exc`) says of a worker's death, by PyTorch's messages and frames:
    ``killed``, ``exitcode``, ``died`` (the generic line), ``race`` (a fetch from a worker already gone: its
    socket or fd), ``pin`` (the pin-memory thread's echo), or None."""
    if isinstance(e, BaseException):
        e = _live_exc(e, None)
    head = e.head
    if vocab.WRAPPER.match((e.message or "").strip()):
        return None  # an exception raised inside a live worker, re-raised: no death
    if vocab.KILLED.match(head):
        return "killed"
    if vocab.EXIT_CODE.match(head):
        return "exitcode"
    if vocab.DIED.match(head):
        return "died"
    if vocab.PIN_DIED.match(head):
        return "pin"
    if e.type in vocab.ECHO_TYPES and e.frames:
        funcs = {f[2] for f in e.frames}
        if funcs & vocab.ECHO_FRAMES or (
                e.kinds & {"mp"} and funcs & vocab.ECHO_DEEP_FRAMES and "loader" in e.kinds | {"torch"}):
            return "race"
    return None


def quoted(e: _Exc) -> Optional[_Exc]:
    """A DataLoader death or worker-error message quoted inside another exception's message (a harness that
    runs the loader in a child process and re-raises its error, a framework's wrapper), as an exception of
    its own with origin ``quoted``; None when there is none, or when the message is the DataLoader's own."""
    msg = e.message or ""
    if worker_death_kind(e) or vocab.WRAPPER.match(msg.strip()):
        return None
    for regex in (vocab.KILLED, vocab.EXIT_CODE, vocab.DIED):
        m = regex.search(msg)
        if m:
            return _Exc("RuntimeError", msg[m.start():].split("\n", 1)[0].strip(), "", None, "quoted")
    i = msg.find("Caught ")
    if i >= 0 and vocab.WRAPPER.match(msg[i:]):
        return _Exc("RuntimeError", msg[i:], "", None, "quoted")
    return None


def with_quoted(chain: list) -> list:
    """``chain`` with each quoted DataLoader message (:func:`quoted`) put before the exception quoting it,
    when no link of the chain is a DataLoader message of its own."""
    if any(worker_death_kind(e) or vocab.WRAPPER.match((e.message or "").strip()) for e in chain):
        return chain
    out = []
    for e in chain:
        inner = quoted(e)
        out += [inner, e] if inner is not None else [e]
    return out


def is_worker_death(exc: BaseException) -> bool:
    """True when ``exc``'s chain says a DataLoader worker died (:func:`worker_death_kind`); not for an
    exception raised *by* ``__getitem__`` ("Caught ValueError in ..."), nor the pin-memory thread's echo alone.
    The lab's one detector: :class:`labutils.kit.fixes.ResilientLoader` restarts on it."""
    for _, e in _chain_of(exc):
        if vocab.WRAPPER.match((e.message or "").strip()):
            return False
        if worker_death_kind(e) in ("killed", "exitcode", "died", "race"):
            return True
    return False


# =========================================================================== gathering
def _live_exc(exc: BaseException, link: Optional[str]) -> _Exc:
    try:
        tb = "".join(tb_mod.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    except Exception:  # noqa: BLE001 - a broken __str__ must not stop the diagnosis
        tb = ""
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = repr(exc)
    return _Exc(type(exc).__qualname__, msg, tb, link, "live")


def _chain_of(exc: BaseException) -> list:
    return [(one, _live_exc(one, link)) for one, link in _chain_links(exc)]


#: ANSI colour and style codes: Python 3.13+ colours the tracebacks it prints when FORCE_COLOR is set, and
#: ipykernel sets FORCE_COLOR=1 for everything a notebook kernel starts (a run from a notebook, its workers)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_text(text: Optional[str]) -> str:
    """``text`` without ANSI escape codes and carriage returns: what the rules read."""
    return _ANSI.sub("", (text or "").replace("\r", ""))


# =========================================================================== chains printed in a text
HEADER = "Traceback (most recent call last):"
_LINKS = {"The above exception was the direct cause of the following exception:": "cause",
          "During handling of the above exception, another exception occurred:": "context"}
#: a line that is an exception's ``Type: message`` (or a bare type), with a dotted module path allowed
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Empty)|"
                       r"[A-Za-z_][\w.]*\.[A-Z]\w*|RuntimeError|KeyError|StopIteration)(?::\s?(.*))?$")
_TYPED = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")
#: the line after a traceback's frames is its exception's, whatever the class is called (``MyBad: boom``)
_NAMED_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_PYTEST_FRAME = re.compile(r"^(\S+\.py):(\d+): in (\S+)$")


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
    m = _EXC_LINE.match(head) or (_NAMED_LINE.match(head) if traceback else None)
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
            links = [e.link for e in chain]  # each one's separator, above it as printed: the link below it now
            for n, e in enumerate(chain):
                e.link = links[n - 1] if n else None
            chain[0].ignored = _after_ignored(lines, start)
            out.append((start, chain))
        else:
            i += 1
    if headless:
        out += _headless(lines, used)
        out.sort(key=lambda pair: pair[0])
    return out


def last_chain(text: str) -> list:
    """The last exception chain printed in ``text`` with its traceback header; [] if none."""
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


# =========================================================================== origin
def _through_loader(e: _Exc) -> Optional[bool]:
    """Did this exception come out of the DataLoader (its iterator, its worker start, torch's tensor sharing, a
    re-raise)? None without a traceback (an exception built by hand: only its message is left to judge)."""
    if e.origin in ("next", "init", "quoted"):
        return True
    if not e.frames:
        return None
    if any(f[0].replace("\\", "/").endswith("torch/multiprocessing/reductions.py") for f in e.frames):
        return True  # torch's tensor sharing between processes: the IPC every DataLoader batch goes through
    return "loader" in e.kinds or worker_death_kind(e) == "race"


# =========================================================================== stderr, by who printed it
_EXC_START = re.compile(r"[A-Za-z_][\w.]*(:|$)")  # 'RuntimeError: ...', 'KeyboardInterrupt', 'mod.Error:'


def _tracebacks(text: str) -> list:
    """``(body, last_line)`` of every Python traceback printed in ``text``.

    Two processes that fail at the same moment (two spawned workers) write to one stderr, and their lines
    interleave, mostly line by line, sometimes inside a line (a source line's indent and its text are two
    writes). Two such tracebacks are mostly the same lines, so within one traceback a line already seen
    (another ``Traceback`` header, a frame, the exception line, a line of its message) is taken for the other
    process's copy and skipped."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith(HEADER):
            indent = len(lines[i]) - len(lines[i].lstrip())
            body, seen = [], {lines[i].strip()}
            j = i + 1
            while j < len(lines):
                line = lines[j].strip()
                if line and line in seen:
                    pass  # the other process's copy of a line of this traceback
                elif len(lines[j]) - len(lines[j].lstrip()) > indent or not line:
                    body.append(lines[j])
                    seen.add(line)
                else:
                    break
                j += 1
            # unbuffered stderr (the runner sets PYTHONUNBUFFERED) writes a frame's source line in pieces,
            # its indent apart from its text, so the other process's line can land between them: a piece
            # that is no exception line (the text of a `raise` line, a row of carets) is skipped, up to three
            for _ in range(3):
                if j < len(lines) and lines[j].strip() and not _EXC_START.match(lines[j].strip()):
                    body.append(lines[j])
                    j += 1
            # a multi-line message (the guard's text) continues on indented lines after the type line
            first = lines[j].strip() if j < len(lines) else ""
            last_lines = [first]
            seen.add(first)
            k = j + 1
            while k < len(lines):
                line = lines[k].strip()
                if line and line in seen:
                    pass
                elif lines[k].startswith((" ", "\t")) and not line.startswith(("File ", "Traceback")):
                    last_lines.append(line)
                    seen.add(line)
                else:
                    break
                k += 1
            out.append(("\n".join(body), " ".join(x for x in last_lines if x)))
            i = j + 1
        else:
            i += 1
    return out


#: the kind of process whose frames a printed traceback shows, first match wins (else "other")
_PRINTED_BY = (("child_start", r"multiprocessing[/\\](spawn|forkserver)\.py\", line \d+, in (_main|spawn_main|main)"),
               ("worker", r"torch[/\\]utils[/\\]data[/\\]_utils[/\\]worker\.py"),
               ("feeder", r"multiprocessing[/\\](queues|resource_sharer)\.py\", line \d+, in (_feed|_serve)"),
               ("mp_child", r"multiprocessing[/\\]process\.py\", line \d+, in _bootstrap"))


def _printed(stderr: str) -> list:
    """``(who, last line)`` of each traceback in stderr, ``who`` by :data:`_PRINTED_BY`."""
    return [(next((who for who, regex in _PRINTED_BY if re.search(regex, body)), "other"), last)
            for body, last in _tracebacks(stderr)]


def _worker_pids_named(chain: list) -> list:
    return vocab.worker_pids("\n".join(e.head for e in chain))


def workers_named(chain: list, codes: Optional[dict] = None) -> list:
    """The DataLoader workers PyTorch's messages in ``chain`` name (their exit statuses from ``codes``, where the
    record has them); one worker of unknown pid where only a worker's error quoted in it says there were some."""
    pids = _worker_pids_named(chain) or vocab.worker_pids("\n".join(e.message or "" for e in chain))
    if not pids and any("worker process" in e.head or vocab.OLD_WRAPPER.match((e.message or "").strip())
                        for e in chain):
        pids = [None]
    return [ProcessInfo(pid, role="dataloader_worker", exitcode=(codes or {}).get(pid)) for pid in pids]
