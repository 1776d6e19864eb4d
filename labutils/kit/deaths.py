"""How PyTorch reported a DataLoader worker's death: every shape it has, in one place.

PyTorch has two independent ways of noticing that a worker died, and which one wins is a race:

* the **SIGCHLD handler** (``_error_if_any_worker_fails``, C++): it runs on *any* SIGCHLD the main process
  gets, asks each of its own worker children whether it died, and raises
  ``DataLoader worker (pid N) is killed by signal: Killed.`` or
  ``DataLoader worker (pid N) exited unexpectedly with exit code C.``. It can only see its own children,
  so under ``forkserver`` (workers are the fork server's children) it never says anything;
* the **status check** in ``_try_get_data``: when fetching a batch fails or times out, it asks every worker
  ``is_alive()`` and raises the generic ``DataLoader worker (pid(s) N, M) exited unexpectedly`` *from*
  whatever the fetch raised (the handler's message, a socket error, ``queue.Empty``).

So one death reaches the learner in one of the shapes of :data:`SHAPES`: ``handler`` where the handler fired
between two fetches, ``handler_inside`` where it fired during one. In the ``socket`` shape the fetch
failed while ``is_alive()`` still said yes (the worker was not reaped yet), so the status check re-raised the
error as it was. Measured here: 8 of 10 staged kills under forkserver (notebook 01), 1 of 8 OOM kills under
forkserver (04), and under fork in notebook 10b's SIGKILL of a worker sending a batch.

A new shape is one entry in :data:`SHAPES` and one branch in :func:`classify`; :func:`check_death` checks a
death against the start method and the workers that really died.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..diagnosis import messages as vocab
from .measure import run_start_method

# id -> (what it looks like, the start methods under which PyTorch can produce it)
SHAPES: dict = {
    "handler": ("'DataLoader worker (pid N) is killed by signal: X' or '... exited unexpectedly with exit "
                "code C', alone", ("fork", "spawn")),
    "handler_inside": ("the generic 'DataLoader worker (pid(s) N) exited unexpectedly', caused by the "
                       "handler's message", ("fork", "spawn")),
    "status_check": ("the generic 'DataLoader worker (pid(s) N) exited unexpectedly', not caused by the "
                     "handler's message", ("fork", "spawn", "forkserver")),
    "socket": ("a bare socket or EOF error from receiving a dead worker's batch, no DataLoader text",
               ("fork", "spawn", "forkserver")),
}

#: the errors of receiving a dead worker's batch (the ``socket`` shape): the diagnosis's echo types
SOCKET_TYPES = vocab.ECHO_TYPES


@dataclass
class Death:
    """One worker death as PyTorch reported it."""

    shape: str
    pids: tuple = ()  # the worker pids PyTorch's messages named (none for ``socket``)
    signal_word: Optional[str] = None  # the handler's signal word ("Killed"), when it spoke
    exitcode: Optional[int] = None  # the handler's exit code, when it spoke
    messages: list = field(default_factory=list)  # "Type: message" of every link that decided

    def __str__(self) -> str:
        named = f" naming pid(s) {', '.join(map(str, self.pids))}" if self.pids else ""
        return f"{self.shape}{named}: {SHAPES[self.shape][0]}"


def _chain(run) -> list:
    """(type, message) of every link of the run's exception chain, outermost first."""
    return [(getattr(e, "type", type(e).__name__), str(getattr(e, "message", e)).strip())
            for e in (getattr(run, "exceptions", None) or [])]


def classify(run) -> Optional[Death]:
    """The shape in which ``run``'s exception chain reports a worker's death, or None if it reports none.

    ``run`` is a :class:`labutils.RunResult` (or anything with an ``exceptions`` list of records with
    ``type`` and ``message``, outermost first).
    """
    chain = _chain(run)
    handler = []
    for etype, msg in chain:
        for m in vocab.KILLED.finditer(msg):
            handler.append((int(m.group(1)), m.group(2).strip(), None, f"{etype}: {m.group(0)}"))
        for m in vocab.EXIT_CODE.finditer(msg):
            handler.append((int(m.group(1)), None, int(m.group(2)), f"{etype}: {m.group(0)}"))
    generic = [(etype, msg, m) for etype, msg in chain for m in [vocab.DIED.search(msg)] if m]
    if generic:
        pids = tuple(int(p) for p in generic[0][2].group(1).replace(" ", "").split(",") if p)
        messages = [f"{generic[0][0]}: {generic[0][1]}"]
        if handler:
            pid, word, code, text = handler[0]
            return Death("handler_inside", pids, word, code, messages + [text])
        return Death("status_check", pids, messages=messages)
    if handler:
        pid, word, code, text = handler[0]
        return Death("handler", (pid,), word, code, [text])
    if chain and chain[0][0] in SOCKET_TYPES:
        return Death("socket", messages=[f"{chain[0][0]}: {chain[0][1]}"])
    return None


def check_death(run, *, signal: Optional[int] = None, exitcode: Optional[int] = None,
                start_method: Optional[str] = None) -> Death:
    """Assert that PyTorch reported a dead worker of ``run`` in a shape its start method allows.

    Checks, and raises AssertionError with the evidence where one fails:

    * the chain reports a death in one of :data:`SHAPES`, and that shape is possible under the start
      method the run's DataLoader used (``start_method`` overrides what the run recorded);
    * some DataLoader worker of the run really died that way: killed by ``signal`` or exited with
      ``exitcode`` (its exit status as the runner reaped it, not a message);
    * every pid PyTorch named is one of the run's DataLoader workers, and at least one of them is a dead
      worker of that kind; where the handler spoke, its signal word or exit code matches.

    Returns the :class:`Death`, so that a lesson can print which shape this run took.
    """
    method = start_method or run_start_method(run)
    death = classify(run)
    chain = _chain(run)
    assert death is not None, f"no worker death in the exception chain: {chain}"
    allowed = SHAPES[death.shape][1]
    assert method in allowed, f"shape {death.shape!r} is not possible under {method}: {chain}"
    workers = list(getattr(run, "dataloader_workers", []) or [])
    if signal is not None:
        dead = [w for w in workers if w.signal == signal]
    elif exitcode is not None:
        dead = [w for w in workers if w.exitcode == exitcode]
    else:
        dead = [w for w in workers if w.exitcode not in (None, 0)]
    assert dead, f"no worker died with signal={signal} exitcode={exitcode}: {[w.status for w in workers]}"
    if death.pids:
        known = {w.pid for w in workers}
        assert set(death.pids) <= known, f"PyTorch named pids {death.pids}, the run's workers are {sorted(known)}"
        assert set(death.pids) & {w.pid for w in dead}, \
            f"PyTorch named pids {death.pids}, the workers that died so are {[w.pid for w in dead]}"
    if death.signal_word is not None and signal is not None:
        assert vocab.signal_from_word(death.signal_word) == signal, \
            f"handler said {death.signal_word!r}, expected signal {signal}"
    if death.exitcode is not None and exitcode is not None:
        assert death.exitcode == exitcode, f"handler said exit code {death.exitcode}, expected {exitcode}"
    return death
