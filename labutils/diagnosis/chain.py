"""An exception's chain, as Python prints it: the exception, then each ``__cause__`` (``raise ... from``)
or, unless suppressed, ``__context__`` (raised while handling), first to last, each once.

One home for the walk, used in the kernel (:mod:`labutils.kit.inkernel`), by the diagnosis of a live
exception (:mod:`labutils.diagnosis.evidence`) and, loaded by path, by the isolated run's bootstrap and the
notebook kernel's preamble (``runner/bootstrap.py``, ``runner/kernel_preamble.py``), which run before
labutils can be assumed importable: so this module imports only the standard library.
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


def loader_iter(excs):
    """The DataLoader iterator object in the traceback of any exception of ``excs``, if any."""
    for exc in excs:
        tb = exc.__traceback__
        while tb is not None:
            obj = tb.tb_frame.f_locals.get("self")
            if obj is not None and type(obj).__name__.endswith("DataLoaderIter"):
                return obj
            tb = tb.tb_next
    return None


def records(exc):
    """The chain as JSON-able records: type, module, message, link and the last 6000 characters of each
    exception's own traceback (the format of the run directory's ``exc.json`` and ``loader.jsonl``)."""
    out = []
    for one, link in links(exc):
        tb = "".join(traceback.format_exception(type(one), one, one.__traceback__, chain=False))
        out.append({"type": type(one).__qualname__, "module": type(one).__module__, "message": str(one),
                    "link": link, "traceback": tb[-6000:]})
    return out
