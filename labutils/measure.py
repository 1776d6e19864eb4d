"""Measurements the notebooks make on a finished run or on this machine (small, tested helpers).

Results are data: these functions read a :class:`~labutils.result.RunResult`, they do not change it.
"""

from __future__ import annotations

from typing import Optional


def run_start_method(result) -> Optional[str]:
    """The start method the run's first DataLoader with workers used (``fork``/``forkserver``/``spawn``).

    Read from the iterator record the run wrote when the loader started; None if no loader with workers
    was started (for example ``num_workers=0``, or the script failed earlier).
    """
    for event in getattr(result, "loader_events", []) or []:
        if event.get("event") == "iter" and event.get("num_workers") and event.get("start_method"):
            return event["start_method"]
    return None
