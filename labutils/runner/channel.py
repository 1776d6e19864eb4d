"""Send values from inside an isolated run back to the notebook: ``labutils.emit(batches=12)``.

Inside a run started by :func:`labutils.run_isolated`, each call appends one JSON line to the run's
directory (workers may call it too); the values appear in ``result.values``. Outside a run it does
nothing but return the values, so the same script also runs unchanged with plain ``python``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .rundir import EMITTED


def emit(**values: Any) -> dict:
    """Record JSON-able ``values`` for the notebook that started this run (later keys win)."""
    run_dir = os.environ.get("LABUTILS_RUN_DIR")
    if run_dir and os.path.isdir(run_dir):
        line = json.dumps(values, default=_jsonable) + "\n"
        fd = os.open(os.path.join(run_dir, EMITTED), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    return values


def _jsonable(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        return tolist()
    return repr(obj)
