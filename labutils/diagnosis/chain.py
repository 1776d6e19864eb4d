"""An exception's chain, as Python prints it: the exception, then each ``__cause__`` (``raise ... from``)
or, unless suppressed, ``__context__`` (raised while handling), first to last, each once.

One home for the walk, used in the kernel (:mod:`labutils.kit.inkernel`), by the diagnosis of a live
exception (:mod:`labutils.diagnosis.evidence`) and, as source text, by the notebook kernel's preamble
(:mod:`labutils.runner.notebook`), which runs before labutils can be assumed importable there: so
this module imports only the standard library. The isolated run's bootstrap keeps its own copy for the
same reason (it is run by path, see ``runner/bootstrap.py``).
"""

import traceback


def links(exc):
    """``[(exception, link)]``: ``link`` is None for the first, then ``"cause"`` or ``"context"``."""
    out, seen, link = [], set(), None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append((exc, link))
        if exc.__cause__ is not None:
            exc, link = exc.__cause__, "cause"
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc, link = exc.__context__, "context"
        else:
            exc = None
    return out


def records(exc):
    """The chain as JSON-able records: type, module, message, link and the last 6000 characters of each
    exception's own traceback (the format of the run directory's ``exc.json`` and ``loader.jsonl``)."""
    out = []
    for one, link in links(exc):
        tb = "".join(traceback.format_exception(type(one), one, one.__traceback__, chain=False))
        out.append({"type": type(one).__qualname__, "module": type(one).__module__, "message": str(one),
                    "link": link, "traceback": tb[-6000:]})
    return out
