"""Reading a log as people paste it: a file, standard input or a string, of any size, in the shape the rules
read (plain lines, one process's words per line).

A big log is streamed in chunks and never held whole: a chunk is searched (in C, by one regular expression)
for the words of a failure, and only the lines around each hit are kept, with the end of the log; the rest
(progress bars, training chatter) is counted, not kept. The kept lines are cleaned as a terminal would have
shown them: ANSI colours removed, a carriage-return-rewritten line (tqdm) reduced to what it ended as, and
the prefixes that launchers and wrappers put before each line (``[rank1]:``, ``[1,3]<stderr>:``,
``[default0]:``, pytest's ``E   ``, ``0: `` of ``srun --label``) taken off.

Then its evidence: the primary failure among the chains printed in it, the worker pids PyTorch names, and the
platform's words about a kill (the kernel's OOM line, Slurm's oom_kill, Kubernetes' OOMKilled, a shell's
``Killed``). A log proves less than a run; what its text cannot decide stays below ``high`` confidence.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Union

from . import messages as vocab
from .evidence import _Facts, printed_chains, quoted, with_quoted, worker_death_kind, workers_named

CHUNK = 8 << 20
BEFORE = 8 << 10  # bytes kept before a hit (the head of a traceback whose last line is the hit)
AFTER = 24 << 10  # bytes kept after a hit (the traceback a header starts, a worker's quoted traceback)
TAIL = 64 << 10  # the end of every log is kept whole
KEEP_FIRST, KEEP_LAST = 64, 512  # excerpts kept from the start and the end of a long log
MAX_EXCERPT = 1 << 20  # one excerpt's bytes at most (a log whose every line is a failure word)
MAX_KEPT = 24 << 20  # all excerpts of one stream at most: the oldest of the end's are dropped first
#: pieces of the words of a failure, one literal each: a literal is searched in C at GB/s where an
#: alternation of many words runs ten times slower. Every failure the rules read has one in its lines
#: (an exception's type, ``Traceback``, ``Killed``/``killed``, a kernel's or Slurm's ``oom_kill``, a
#: shell's ``(core dumped)``/``Aborted``, a worker's ``... fault encountered``); the lines around a hit
#: hold the rest (a traceback's frames and message, torchrun's Root Cause block)
HITS = tuple(re.compile(w) for w in (rb"rror", rb"illed", rb"Traceback", rb"oom_kill", rb"dumped", rb"Aborted",
                                     rb"fault"))
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")
#: a launcher's or wrapper's prefix before each line of a process
_PREFIX = re.compile(r"^(\[rank\d+\]:|\[default\d+\]:|\[\d+,\d+\]<std(?:err|out)>:|\d+: (?=\S)|"
                     r"rank\d+: |E   (?=\S|\s))")
_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z? ")  # a CI runner's timestamp


class LogError(Exception):
    """A log that cannot be read as text: its one-line message says why and what to do."""


@dataclass
class LogText:
    """What the reader kept of one or more logs: the lines, and what it read in all."""

    text: str = ""
    names: list = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    bytes_skipped: int = 0  # between the excerpts kept
    replaced: int = 0  # bytes that were no UTF-8, read as U+FFFD
    notes: list = field(default_factory=list)


def clean_line(line: str) -> str:
    """One line as the terminal showed it: no ANSI codes, the last rewrite of a ``\\r`` line, no prefix."""
    line = _ANSI.sub("", line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    line = _TS.sub("", line)
    for _ in range(2):  # a timestamp or rank prefix inside pytest's E lines, and the like
        m = _PREFIX.match(line)
        if not m:
            break
        line = line[m.end():]
        if line.startswith(" ") and not line.startswith("  "):
            line = line[1:]
    return line.rstrip("\x00").rstrip()


_MID_HEADER = re.compile(r"(?<=\S)(?=Traceback \(most recent call last\):)")


def clean_text(text: str) -> str:
    """Every line cleaned; a traceback header printed at the end of another line (a progress bar's) starts a
    line of its own."""
    lines = (clean_line(x) for x in text.replace("\r\n", "\n").split("\n"))
    return "\n".join(_MID_HEADER.sub("\n", line) if "Traceback (most" in line else line for line in lines)


def _is_binary(head: bytes) -> bool:
    if not head or head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False
    sample = head[:65536]
    odd = sum(1 for b in sample if b < 9 or 13 < b < 27 or b == 127)
    return odd > max(16, len(sample) // 20)


def _open(source: str):
    if source == "-":
        return sys.stdin.buffer, "standard input"
    if not os.path.exists(source):
        raise LogError(f"{source}: no such file")
    if os.path.isdir(source):
        raise LogError(f"{source}: is a directory; give a log file (or - for standard input)")
    try:
        return open(source, "rb"), source
    except OSError as exc:
        raise LogError(f"{source}: cannot read it ({exc.strerror})") from None


class _Excerpts:
    """Byte ranges kept from one stream: the first :data:`KEEP_FIRST` and the last :data:`KEEP_LAST`."""

    def __init__(self) -> None:
        self.first: list = []
        self.last: list = []
        self.kept = 0

    def add(self, start: int, data: bytes) -> None:
        pool = self.last if len(self.first) >= KEEP_FIRST else self.first
        if pool and pool[-1][0] + len(pool[-1][1]) >= start and len(pool[-1][1]) < MAX_EXCERPT:
            prev_start, prev = pool[-1]  # touches the previous one: one excerpt
            if start <= prev_start:
                pool[-1] = (start, data + prev[start + len(data) - prev_start:])
            else:
                pool[-1] = (prev_start, prev + data[prev_start + len(prev) - start:])
        else:
            pool.append((start, data))
        self.kept += len(data)
        while self.last and (len(self.last) > KEEP_LAST or self.kept > MAX_KEPT):
            self.kept -= len(self.last.pop(0)[1])

    def pieces(self) -> list:
        return self.first + self.last


def _windows(chunk: bytes) -> list:
    """``(start, end)`` byte ranges of ``chunk`` (on line boundaries) around each hit, merged."""
    hits = sorted(m.start() for regex in HITS for m in regex.finditer(chunk))
    out: list = []
    for at in hits:
        if out and at < out[-1][1] - AFTER // 2:
            continue  # inside the last window, far from its end
        a = chunk.rfind(b"\n", 0, max(0, at - BEFORE)) + 1
        b = chunk.find(b"\n", min(len(chunk), at + AFTER))
        b = len(chunk) if b < 0 else b + 1
        if out and a <= out[-1][1] and out[-1][1] - out[-1][0] < MAX_EXCERPT:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def _stream(fh, name: str, log: LogText) -> str:
    """Read ``fh`` chunk by chunk and keep the lines around each hit and the last :data:`TAIL` bytes: the text
    kept, with a line where bytes were left out."""
    head = fh.read(65536)
    if _is_binary(head):
        raise LogError(f"{name}: a binary file, not a log (give the text the job printed: its stdout/stderr)")
    decoder = None
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # PowerShell's `>` writes UTF-16
        decoder = codecs.getincrementaldecoder("utf-16")()
    excerpts, offset, carry, tail, data = _Excerpts(), 0, b"", b"", head
    while data or carry:
        if decoder is not None:
            data = decoder.decode(data).encode("utf-8")
        log.bytes_read += len(data)
        block = carry + data
        cut = block.rfind(b"\n") + 1 if data else len(block)  # at the end, the last line even without its \n
        if cut == 0 and len(block) < CHUNK:
            carry = block
        else:
            whole, carry = block[:cut or len(block)], block[cut or len(block):]
            log.lines_read += whole.count(b"\n") + (not data)
            for a, b in _windows(whole):
                excerpts.add(offset + a, whole[a:b])
            tail = (tail + whole)[-TAIL:]
            offset += len(whole)
        data = fh.read(CHUNK) if data else b""
    if tail:
        excerpts.add(max(0, offset - len(tail)), tail)
    pieces, end = [], 0
    for start, data in excerpts.pieces():
        if start > end:
            log.bytes_skipped += start - end
            if pieces:
                pieces.append(f"[... {start - end} bytes of {name} not kept: no failure words in them ...]")
        text = data[max(0, end - start):].decode("utf-8", errors="replace")
        log.replaced += text.count("\ufffd") - data.count("\ufffd".encode())
        pieces.append(clean_text(text))
        end = max(end, start + len(data))
    if not pieces and log.bytes_read == 0:
        log.notes.append(f"{name}: empty")
    log.names.append(name)
    return "\n".join(pieces)


def read_logs(sources: Iterable[Union[str, bytes]], *, texts: Iterable[str] = ()) -> LogText:
    """Read each path (``-``: standard input) and each string of ``texts`` into one :class:`LogText`.

    Raises :class:`LogError` (a one-line message) for a missing file, a directory or a binary file, and when
    there is no text at all."""
    log = LogText()
    parts: list = []
    for text in texts:
        log.names.append("text")
        log.bytes_read += len(text)
        log.lines_read += text.count("\n") + 1
        parts.append(clean_text(text))
    for source in sources:
        fh, name = _open(source)
        try:
            parts.append(_stream(fh, name, log))
        except OSError as exc:
            raise LogError(f"{name}: cannot read it ({exc.strerror or exc})") from None
        finally:
            if source != "-":
                fh.close()
    log.text = "\n".join(p for p in parts if p)
    if log.replaced:
        log.notes.append(f"{log.replaced} bytes were not UTF-8 and were read as U+FFFD")
    if not log.text.strip():
        which = ", ".join(log.names) or "the input"
        raise LogError(f"{which}: empty: nothing to diagnose (give the text the job printed)")
    return log


def read_text(text: str) -> LogText:
    """A pasted string, cleaned as :func:`read_logs` cleans a file."""
    if not isinstance(text, str):
        raise TypeError(f"read_text() takes a str, not {type(text).__name__}")
    if len(text) > CHUNK:  # a huge string: read it as a stream of its own bytes, with the same excerpts as a file
        log = LogText()
        log.text = _stream(io.BytesIO(text.encode("utf-8", errors="replace")), "text", log)
        return log
    return read_logs((), texts=[text]) if text.strip() else LogText(names=["text"])


# =========================================================================== the evidence of a log's text
# the platform's words
KERNEL_OOM = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]*)\)")
KERNEL_OOM_TASK = re.compile(r"oom-kill:.*?task=([^,\s]+),pid=(\d+)")
SLURM_OOM = re.compile(r"slurmstepd(?:-[\w.-]+)?: error: Detected (\d+) oom[-_]kill events?")
K8S_OOM = re.compile(r"\bOOMKilled\b")
K8S_137 = re.compile(r"Exit Code:\s*137\b|exit code:? 137\b|exited with code 137\b", re.I)
SHELL_SIGNAL = re.compile(r"^(?:.*: line \d+: +\d+ |\[\d+\]\+? +)?(Killed|Segmentation fault|Bus error|Aborted|"
                          r"Floating point exception|Illegal instruction|Terminated)(?: \(core dumped\))?"
                          r"(?:\s+\S.*)?$", re.M)


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
