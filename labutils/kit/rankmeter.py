"""Notebook 12's /dev/shm bookkeeping: meter a torchrun launch until no other program moved the meter.

:class:`labutils.kit.shmwatch.PeakMeter` reads the whole ``/dev/shm``, which other programs use too. A launch
whose peak is above what one rank's loader can hold (``limit``), or whose meter did not end where it started
(someone else's files came or went), is launched again, up to ``tries`` launches in all.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["quiet_peak"]


def quiet_peak(launch: Callable[[], Any], limit: float, tries: int = 4, interval: float = 0.002) -> tuple:
    """``(last result, [meter of each launch])``: ``launch()`` under a PeakMeter, again while the meter was
    disturbed or read more than ``limit`` bytes, at most ``tries`` times."""
    from .shmwatch import PeakMeter

    if not callable(launch):
        raise ValueError(f"launch must be a function that starts one launch, not {launch!r}")
    if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
        raise ValueError(f"tries must be a whole number of at least 1, not {tries!r}")
    if not limit > 0:
        raise ValueError(f"limit must be a number of bytes above 0, not {limit!r}")
    meters: list = []
    result = None
    while not meters or (len(meters) < tries and (meters[-1].peak > limit or meters[-1].disturbed())):
        with PeakMeter(interval=interval) as meter:
            result = launch()
        meters.append(meter)
    return result, meters
