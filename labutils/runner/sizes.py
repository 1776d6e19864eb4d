"""Parse and format byte sizes ("512M", "8MiB", "1.5G") for options such as shm_size and batch_bytes.

Units are binary (1024-based) whether or not the user writes the "i": ``64k`` = ``64KiB`` = 65536,
``100MB`` = ``100MiB`` = 104857600. This matches what ``mount -o size=64m`` and ``docker --shm-size=64m``
mean, which is where most sizes in this lab come from.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_size", "format_size"]

_UNITS = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}

_SIZE_RE = re.compile(
    r"""^\s*
    (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)   # 12, 1.5, .5, 1e3
    \s*
    (?P<unit>[KMGTP]?)(?:I?B)?                           # k, K, KB, KiB, M, MiB, B
    \s*$""",
    re.IGNORECASE | re.VERBOSE,
)


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string such as ``"512M"`` (a bare number is bytes; a fraction is rounded
    down); ValueError, with the accepted forms, for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: expected a number of bytes or a string like '512M'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: a size cannot be negative")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"invalid size {value!r}: expected a finite, non-negative number of bytes")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(
            f"invalid size {value!r} of type {type(value).__name__}: "
            "expected an int or a string like '512M', '8MiB', '1.5G', '64k'"
        )
    m = _SIZE_RE.match(value)
    if m is None:
        raise ValueError(
            f"invalid size {value!r}: expected a number with an optional unit "
            "B, K, M, G, T (binary, 1024-based; 'KiB'/'KB' also accepted), e.g. '512M', '8MiB', '1.5G'"
        )
    number = float(m.group("num"))
    if not math.isfinite(number):
        raise ValueError(f"invalid size {value!r}: the number is too large")
    return int(number * 1024 ** _UNITS[m.group("unit").upper()])


def format_size(n: int | float) -> str:
    """A byte count with a binary unit and one decimal: ``format_size(8 * 2**20) == "8.0 MiB"``, ``"512 B"``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if round(n, 1) < 1024:
            return f"{sign}{n:.1f} {unit}"
    return f"{sign}{n / 1024:.1f} PiB"
