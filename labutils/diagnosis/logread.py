"""Reading a log as people paste it: a file, standard input or a string, of any size, in the shape the rules
read (plain lines, one process's words per line).

A big log is streamed in chunks and never held whole: a chunk is searched (in C, by one regular expression)
for the words of a failure, and only the lines around each hit are kept, with the end of the log; the rest
(progress bars, training chatter) is counted, not kept. The kept lines are cleaned as a terminal would have
shown them: ANSI colours removed, a carriage-return-rewritten line (tqdm) reduced to what it ended as, and
the prefixes that launchers and wrappers put before each line (``[rank1]:``, ``[1,3]<stderr>:``,
``[default0]:``, pytest's ``E   ``, ``0: `` of ``srun --label``) taken off.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Union

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
