"""torchrun launches: the failures listed in ChildFailedError's Root Cause block, each rank's own output,
and the first failed rank explained like a script.

torchrun starts one process per rank and, when one fails, stops the others with SIGTERM and raises
ChildFailedError, whose "Root Cause (first observed failure)" block holds the rank, its exit code and pid, an
error file and a traceback. The rank's own traceback is on the launch's stderr, each line prefixed with
``[rankN]:`` (torch >= 2.2; older releases print it without the prefix)."""

from __future__ import annotations

import re
from typing import Optional

from .causes import CATALOGUE, UNKNOWN
from .decide import decide_process, fixes_of
from .evidence import _exit_words, _Facts, _short, last_chain
from .model import Diagnosis, probe_lines

_TR_TITLE = re.compile(r"^Root Cause \(first observed failure\):\s*$")
_TR_ENTRY = re.compile(r"^\[(\d+)\]:\s*$")
_TR_FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_TR_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
_TR_EXIT = re.compile(r"^(-?\d+) \(pid: (\d+)\)\s*(?:\((SIG\w+)\))?")
_TR_RULE = re.compile(r"^(=+|-+)$")


def torchrun_failures(text: str) -> list:
    """The failures listed in torchrun's ``ChildFailedError`` text, the root cause first.

    Each is a dict: ``rank``, ``local_rank``, ``exitcode``, ``pid``, ``signal`` (e.g. ``"SIGTERM"`` or
    None), ``error_file`` (None for ``<N/A>``), ``traceback`` (the text torchrun printed: a traceback
    when the script uses ``@record``, else a hint or ``Signal N (SIG) received by PID``), ``host``,
    ``time`` and ``root`` (True for the "first observed failure"). ``[]`` when there is no such block.
    """
    out, root, cur, last = [], False, None, None
    for line in (text or "").replace("\r", "").splitlines():
        stripped = line.strip()
        if _TR_TITLE.match(stripped) or stripped == "Failures:":
            root, cur = stripped != "Failures:", None
        elif _TR_RULE.match(stripped) and len(stripped) >= 10:
            cur = last = None
        elif _TR_ENTRY.match(line):
            cur, last = dict.fromkeys(("rank", "local_rank", "exitcode", "pid", "signal", "error_file")) | {
                "traceback": "", "host": None, "time": None, "root": root}, None
            out.append(cur)
        elif cur is not None and (m := _TR_FIELD.match(line)):
            last, value = m.group(1), m.group(2).rstrip()
            if last == "rank" and (r := _TR_RANK.match(value)):
                cur["rank"], cur["local_rank"] = int(r.group(1)), int(r.group(2))
            elif last == "exitcode" and (e := _TR_EXIT.match(value)):
                cur["exitcode"], cur["pid"], cur["signal"] = int(e.group(1)), int(e.group(2)), e.group(3)
            elif last == "error_file":
                cur["error_file"] = None if value in ("<N/A>", "") else value
            elif last in ("traceback", "host", "time"):
                cur[last] = value
        elif cur is not None and last == "traceback":  # @record: the rank's traceback, indented two more spaces
            cur["traceback"] += "\n" + (line[2:] if line.startswith("  ") else line)
    return sorted((f for f in out if f["rank"] is not None), key=lambda f: not f["root"])


def rank_output(stderr: str, rank: int) -> str:
    """The lines rank ``rank`` printed on a torchrun launch's stderr, without their ``[rankN]:`` prefix."""
    prefix = f"[rank{rank}]:"
    out = []
    for line in (stderr or "").replace("\r", "").splitlines():
        if line.startswith(prefix):
            rest = line[len(prefix):]
            out.append(rest[1:] if rest.startswith(" ") else rest)
    return "\n".join(out)


# a rank that failed because another rank died: the collective's connection broke (gloo, NCCL)
_PEER_ECHO = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crash|"
                        r"Broken pipe|NCCL communicator was aborted|Watchdog caught collective operation timeout|"
                        r"recvBytes|Socket Timeout", re.I)


def _rank_verdict(facts: _Facts, failure: dict) -> dict:
    """Explain one failed rank from its own printed traceback, like a script of its own."""
    rank, code = failure["rank"], failure["exitcode"]
    own = rank_output(facts.stderr, rank)
    origin = f"rank {rank}'s own traceback on stderr ([rank{rank}]: lines)"
    chain = last_chain(own) if own else []
    if not chain and "Traceback (most recent call last):" in failure["traceback"]:
        chain, origin = last_chain(failure["traceback"]), "the traceback in torchrun's failure block"
    if not chain and not own:  # torch < 2.2 prints rank lines without a prefix: the whole stderr, less sure
        text = facts.stderr
        cut = text.rfind("ChildFailedError")
        if cut >= 0:  # leave out the launcher's own traceback
            text = text[:max(text.rfind("Traceback (most recent call last):", 0, cut), 0)]
        if "Original exception was:" in text:  # the rank's excepthook failed; Python printed the original
            text = text[text.rfind("Original exception was:"):]
        chain = last_chain(text)
        origin = "the last traceback on the launch's stderr (no [rankN]: prefixes to tell ranks apart)"
    # a worker's own line has no [rankN]: prefix: it is read in the whole stderr
    verdict = decide_process(
        facts, chain, code, "under forkserver/spawn a rank may not learn its worker's signal",
        stderr=own or facts.stderr, main_signal=-code if isinstance(code, int) and code < 0 else None)
    echo = bool(chain) and verdict["cause"] == "outside_loader" and bool(_PEER_ECHO.search(chain[0].message))
    stopped = failure["signal"] == "SIGTERM" and not chain
    return dict(verdict, failure=failure, chain=chain, origin=origin, echo=echo or stopped)


def _torchrun_diagnosis(facts: _Facts) -> Optional[Diagnosis]:
    """The diagnosis of a failed torchrun launch: the first failed rank explained as its own script.

    torchrun's root cause is the first failure it *observed*; without ``@record`` two ranks that exit
    in the same instant are ordered arbitrarily, and a peer whose collective broke because the other rank
    died can be named. Such an echo (a gloo/NCCL connection error outside data loading, or a rank stopped
    with SIGTERM) is passed over for a failed rank with a cause of its own, and the evidence says so.
    """
    text = "\n".join(e.message for e in facts.ended if e.type == "ChildFailedError")
    failures = torchrun_failures(text or facts.stderr)
    if not failures or not failures[0]["root"]:
        return None
    verdicts = [_rank_verdict(facts, f) for f in failures]
    chosen = next((v for v in verdicts if not v["echo"]), verdicts[0])
    root = chosen["failure"]
    rank, code = root["rank"], root["exitcode"]
    cause, mine, conf = chosen["cause"], chosen["mine"], chosen["conf"]
    head = f"torchrun: rank {rank} (local rank {root['local_rank']}, pid {root['pid']}) failed first " \
           f"({_exit_words(code, root['signal'])})"
    if cause in CATALOGUE and cause != "ok":
        summary = f"{head}: {chosen['summary']}"
    else:
        summary = f"{head}; its own output names no cause"
        cause = UNKNOWN if cause == "ok" else cause
    first = failures[0]
    evidence = [f"torchrun's Root Cause (first observed failure): rank {first['rank']}, local_rank "
                f"{first['local_rank']}, exitcode {first['exitcode']} (pid {first['pid']}), error_file "
                f"{first['error_file'] or '<N/A>'}"]
    if root is not first:
        evidence.append(f"rank {first['rank']}'s failure is an echo (its collective lost the peer that died: "
                        f"{_short(verdicts[0]['chain'][0].head if verdicts[0]['chain'] else 'stopped', 120)}); "
                        f"rank {rank} failed with a cause of its own. torchrun orders failures by the time it "
                        "observed them; @record (torch.distributed.elastic.multiprocessing.errors) makes each "
                        "rank write its error with its own timestamp")
    evidence += [f"rank {rank}: {f.text}" for f in mine]
    evidence += [f"rank {rank}, also seen: {f.text}" for f in chosen["others"] if f.text not in (m.text for m in mine)]
    evidence.append(f"read from {chosen['origin']}" if chosen["chain"] else f"rank {rank} printed no Python traceback")
    for v in verdicts:
        f = v["failure"]
        if f is root:
            continue
        state = _exit_words(f["exitcode"], f["signal"])
        note = " (torchrun stopped it after the first failure)" if f["signal"] == "SIGTERM" else \
            (" (an echo: its collective lost a peer)" if v["echo"] else f" ({v['cause']})")
        evidence.append(f"rank {f['rank']} (local rank {f['local_rank']}, pid {f['pid']}): {state}{note}")
    evidence.append("launcher (torchrun): " + (_exit_words(facts.returncode) if facts.returncode is not None
                                                else "no exit code recorded"))
    evidence += probe_lines(facts)
    launch = {"launcher": "torchrun", "rank": rank, "local_rank": root["local_rank"], "exitcode": code,
              "pid": root["pid"], "signal": root["signal"], "error_file": root["error_file"],
              "root_cause_rank": first["rank"], "failures": failures}
    return Diagnosis(cause, summary, evidence, fixes_of(cause, mine, conf) if cause in CATALOGUE else [], conf,
                     "run", chosen["recovered"], launch)
