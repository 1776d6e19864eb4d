"""A DataLoader error that a lesson's script caught itself (:func:`chain`, emitted), given to
:func:`labutils.kit.deaths.check_death` by :func:`caught` with the run's workers and loader records.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from ..diagnosis.chain import links

__all__ = ["caught", "chain"]


def chain(exc: Optional[BaseException]) -> list:
    """``[{"type", "message"}, ...]`` for ``exc`` and each ``__cause__``/``__context__`` below it, outermost
    first (JSON-able, for :func:`labutils.emit`); ``[]`` for None."""
    return [{"type": type(one).__name__, "message": str(one)} for one, _ in links(exc)]


def caught(run: Any, records: Optional[list]) -> SimpleNamespace:
    """What ``check_death(..)`` needs, for a chain ``records`` (from :func:`chain`) caught inside ``run``."""
    if records is not None and not (isinstance(records, list) and all(
            isinstance(r, dict) and {"type", "message"} <= set(r) for r in records)):
        raise ValueError(f"records must be the list labutils.kit.caught.chain() returns, not {records!r}")
    return SimpleNamespace(
        exceptions=[SimpleNamespace(type=r["type"], message=r["message"]) for r in records or []],
        dataloader_workers=list(getattr(run, "dataloader_workers", []) or []),
        loader_events=list(getattr(run, "loader_events", []) or []),
    )
