"""Argument checks, corrupt-file selection and output preparation shared by the generators."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .manifest import MANIFEST_NAME, sidecar_path


class OutputExistsError(FileExistsError):
    """The output folder is not empty, or the output file exists, and overwriting was not allowed."""


def check_n(n: int) -> int:
    """Return ``n`` as an int, or raise ``ValueError`` when it is not a positive whole number."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a whole number of at least 1, got {n!r}: ask for 1 or more files")
    return int(n)


def check_seed(seed: int) -> int:
    """Return ``seed`` as an int, or raise ``ValueError`` when it is not a non-negative whole number."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    return int(seed)


def check_fraction(fraction: float) -> float:
    """Return ``fraction`` as a float, or raise ``ValueError`` when it is not a share in [0, 1]."""
    try:
        value = float(fraction)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"corrupt_fraction must be between 0 and 1, got {fraction!r}: "
            "pass a share such as 0.1 for 10% corrupt files"
        )
    return value


def check_kinds(kinds: Iterable[str] | None, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """Return the requested corrupt kinds (all of ``allowed`` for None), without duplicates, in order."""
    if kinds is None:
        return tuple(allowed)
    if isinstance(kinds, str):
        kinds = [kinds]
    chosen: list[str] = []
    for kind in kinds:
        if kind not in allowed:
            raise ValueError(f"unknown corrupt kind {kind!r} for {what}: choose from {', '.join(allowed)}")
        if kind not in chosen:
            chosen.append(kind)
    return tuple(chosen)


def corrupt_count(n: int, fraction: float) -> int:
    """How many of ``n`` files a ``fraction`` asks for: rounded half up, so 0.5 of 3 gives 2."""
    return min(n, int(math.floor(n * fraction + 0.5)))


def assign_kinds(rng: np.random.Generator, n: int, fraction: float, kinds: Sequence[str]) -> dict[int, str]:
    """Pick which files are corrupt and with which kind, deterministically from ``rng``.

    The kinds are spread evenly over the corrupt files (their counts differ by at most one), so
    every kind is present as soon as there are at least as many corrupt files as kinds.
    """
    k = corrupt_count(n, fraction)
    if k and not kinds:
        raise ValueError("corrupt_fraction is above 0 but no corrupt kind was allowed: pass at least one kind")
    indices = np.sort(rng.choice(n, size=k, replace=False)) if k else np.empty(0, dtype=np.int64)
    order = rng.permutation(k)
    return {int(indices[j]): kinds[int(order[j]) % len(kinds)] for j in range(k)}


def _check_parents(path: Path) -> None:
    """Raise ``NotADirectoryError`` when an existing ancestor of ``path`` is a file, not a folder."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{parent} is a file, not a folder", str(path))
            return


def prepare_dir(root: str | Path, overwrite: bool) -> Path:
    """Create the output folder, or make room in it; return it as a ``Path``.

    A folder that exists and is not empty is refused unless ``overwrite`` is true. With
    ``overwrite`` the files listed by an earlier data_gen manifest in that folder are removed
    (with the manifest and any folders left empty); files data_gen did not write are left alone.
    """
    root = Path(root)
    _check_parents(root)
    if root.exists() and not root.is_dir():
        raise OutputExistsError(f"{root} exists and is not a folder: choose a folder path for the output")
    if root.is_dir() and any(root.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"output folder {root} is not empty: choose a new folder, or overwrite (overwrite=True, CLI --force)"
            )
        _remove_previous(root)
    root.mkdir(parents=True, exist_ok=True)
    return root


def _remove_previous(root: Path) -> None:
    manifest = root / MANIFEST_NAME
    try:
        listed = [e["path"] for e in json.loads(manifest.read_text(encoding="utf-8"))["entries"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    base = root.resolve()
    folders = set()
    for rel in listed:
        target = (root / rel).resolve()
        if base not in target.parents:
            continue  # never follow a manifest outside its own folder
        target.unlink(missing_ok=True)
        folders.add(target.parent)
    manifest.unlink(missing_ok=True)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder != base and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def prepare_file(path: str | Path, overwrite: bool) -> Path:
    """Create the parent folder of an output file; refuse an existing file unless ``overwrite``."""
    path = Path(path)
    _check_parents(path)
    if path.is_dir():
        raise OutputExistsError(f"{path} is a folder: give a file path for the output")
    if path.exists() and not overwrite:
        raise OutputExistsError(
            f"output file {path} exists: choose a new path, or overwrite (overwrite=True, CLI --force)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    side = sidecar_path(path)
    if overwrite and side.exists():
        side.unlink()
    return path


def check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of whole numbers, at least one dimension, each at least 1."""
    try:
        shape_t = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a sequence of whole numbers, got {shape!r}: e.g. (3, 8, 8)") from None
    if not shape_t or min(shape_t) < 1:
        raise ValueError(f"shape needs at least one dimension, each at least 1, got {shape!r}")
    return shape_t


@contextlib.contextmanager
def atomic_write(path: Path):
    """Write ``path`` through ``path.partial``: renamed into place when the block ends, removed if it fails."""
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_dtype(dtype, kinds: str = "fiu") -> np.dtype:
    """``dtype`` as a numpy dtype of one of ``kinds`` (numpy's kind letters: f float, i/u integer, b bool)."""
    names = {"f": "float", "i": "integer", "u": "integer", "b": "bool"}
    allowed = " or ".join(dict.fromkeys(names[k] for k in kinds))
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}: use a numeric numpy dtype such as float32") from None
    if dt.kind not in kinds:
        raise ValueError(f"dtype must be a {allowed} type, got {dt}: use e.g. float32")
    return dt
