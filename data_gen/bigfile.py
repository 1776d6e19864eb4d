"""``make_big_array``: one large ``.npy`` for the memory-map lessons, written chunk by chunk.

The array is never held in memory: the ``.npy`` header is written first, then the data in chunks of
``CHUNK_ELEMENTS`` values, each drawn from its own generator seeded with ``(seed, chunk_index)``, so
the content depends only on the seed, the shape and the dtype. The file is written under a temporary
name and renamed into place when complete, so an interrupted run leaves no half-written array.

Size limits (checked before anything is written; ``ValueError`` when exceeded):

- at most ``DISK_SHARE`` (50%) of the free space on the target disk, so the lab never fills a disk;
- at most ``RAM_SHARE`` (50%) of the memory available now (``MemAvailable`` from ``/proc/meminfo`` on
  Linux, capped by the headroom under a cgroup v2 memory limit; free physical pages from
  ``os.sysconf`` elsewhere; the check is skipped when neither exists).
  Writing needs little memory, but the lessons compare ``np.load`` (the whole array in RAM) with
  ``np.load(..., mmap_mode="r")``, and the naive side of that comparison must not push the machine
  into the OOM killer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from ._common import atomic_write, check_dtype, check_seed, check_shape, prepare_file
from .manifest import Entry, Manifest, sidecar_path

DISK_SHARE = 0.5
"""Largest share of the free disk space one array may take."""
RAM_SHARE = 0.5
"""Largest share of the available memory one array may take."""
CHUNK_ELEMENTS = 1 << 22
"""Values per written chunk (16 MiB of float32); part of the content's definition, not a tuning knob."""


def _free_disk_bytes(directory: Path) -> int:
    """Free bytes on the disk that holds ``directory`` (or its nearest existing parent)."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _cgroup_headroom_bytes() -> int | None:
    """Memory left under this process's cgroup v2 limit (containers), or ``None`` without a limit."""
    base = Path("/sys/fs/cgroup")
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::") and (base / line[3:].lstrip("/") / "memory.max").exists():
                base = base / line[3:].lstrip("/")
                break
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _available_ram_bytes() -> int | None:
    """Memory available to new allocations, or ``None`` when this platform cannot tell.

    Linux: ``MemAvailable`` from ``/proc/meminfo``, lowered to the headroom under a cgroup v2 memory
    limit when there is one (in a container ``/proc/meminfo`` shows the host). Elsewhere: free
    physical pages from ``os.sysconf``, where it exists.
    """
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        available = None
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    headroom = _cgroup_headroom_bytes()
    return available if headroom is None else min(available, headroom)


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def check_big_array_size(path: str | Path, nbytes: int) -> None:
    """Raise ``ValueError`` when ``nbytes`` at ``path`` exceeds the safe share of free disk or memory."""
    path = Path(path)
    free_disk = _free_disk_bytes(path.parent)
    if nbytes > DISK_SHARE * free_disk:
        raise ValueError(
            f"refusing to write {_human(nbytes)} to {path}: that is more than {DISK_SHARE:.0%} of the "
            f"{_human(free_disk)} free on that disk; ask for a smaller array (at most "
            f"{_human(DISK_SHARE * free_disk)}) or write it to a disk with more free space"
        )
    available = _available_ram_bytes()
    if available is not None and nbytes > RAM_SHARE * available:
        raise ValueError(
            f"refusing to write {_human(nbytes)} to {path}: that is more than {RAM_SHARE:.0%} of the "
            f"{_human(available)} of memory available now, and the lesson loads it whole once; "
            f"ask for at most {_human(RAM_SHARE * available)} or free some memory"
        )


def _resolve_shape(nbytes: int | None, shape: Sequence[int] | None, dt: np.dtype) -> tuple[int, ...]:
    if (nbytes is None) == (shape is None):
        raise ValueError("give exactly one of nbytes and shape, e.g. nbytes=64 * 2**20 or shape=(1024, 1024)")
    if shape is not None:
        return check_shape(shape)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < dt.itemsize:
        raise ValueError(f"nbytes must be a whole number of at least {dt.itemsize} for {dt}, got {nbytes!r}")
    return (int(nbytes) // dt.itemsize,)


def _chunk(seed: int, index: int, count: int, dt: np.dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, index])
    if dt.kind == "f":
        return rng.random(count, dtype=np.float64 if dt.itemsize > 4 else np.float32).astype(dt, copy=False)
    if dt.kind == "b":
        return rng.integers(0, 2, size=count).astype(dt)
    return rng.integers(0, min(100, int(np.iinfo(dt).max)) + 1, size=count).astype(dt)


def make_big_array(
    path: str | Path,
    nbytes: int | None = None,
    shape: Sequence[int] | None = None,
    dtype: str | np.dtype = "float32",
    seed: int = 0,
    overwrite: bool = False,
    progress=None,
) -> Manifest:
    """Write a large ``.npy`` at ``path``, chunk by chunk, for ``np.load(path, mmap_mode="r")``.

    Args:
        path: the output file (``.npy`` by convention); its manifest goes to ``<path>.manifest.json``.
        nbytes: size of the data; gives a 1-D array of ``nbytes // itemsize`` values. Or:
        shape: the array's shape. Exactly one of ``nbytes`` and ``shape``.
        dtype: float (uniform in [0, 1)), integer (in [0, 100]) or bool.
        seed: the same seed, shape and dtype give a byte-identical file.
        overwrite: replace an existing file.
        progress: optional ``progress(written_bytes, total_bytes)``, called after each chunk (the CLI draws
            a bar with it; a notebook can update an ipywidgets ``IntProgress``).

    Returns:
        The saved ``Manifest``; ``params`` holds ``shape``, ``dtype`` and ``nbytes``.

    Raises:
        ValueError: bad arguments, or the size is over ``DISK_SHARE`` of the free disk or
            ``RAM_SHARE`` of the available memory (the message says how big, how much is free, and
            what to do).
    """
    seed = check_seed(seed)
    dt = check_dtype(dtype, "fiub")
    shape_t = _resolve_shape(nbytes, shape, dt)
    count = int(np.prod(shape_t))
    data_bytes = count * dt.itemsize
    path = Path(path)
    check_big_array_size(path, data_bytes)
    path = prepare_file(path, overwrite)

    with atomic_write(path) as fh:
        header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": shape_t}
        np.lib.format.write_array_header_1_0(fh, header)  # ndim <= 64 always fits version 1.0
        for index, start in enumerate(range(0, count, CHUNK_ELEMENTS)):
            n = min(CHUNK_ELEMENTS, count - start)
            fh.write(_chunk(seed, index, n, dt).data)
            if progress is not None:
                progress((start + n) * dt.itemsize, data_bytes)

    manifest = Manifest(
        generator="make_big_array",
        params={
            "shape": list(shape_t),
            "dtype": dt.str,
            "nbytes": data_bytes,
            "chunk_elements": CHUNK_ELEMENTS,
        },
        seed=seed,
        entries=[Entry(path=path.name, label=None, status="ok", kind="ok", info={"file_bytes": path.stat().st_size})],
        libs={"numpy": np.__version__},
    )
    manifest.save(sidecar_path(path))
    return manifest
