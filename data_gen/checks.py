"""Validators: does a file load, and is what it holds what the dataset promises?

The generators run these on every file they write, and the manifest records their verdict, so the
manifest is a measurement, not a wish. Notebooks and tests can use them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageFile


@dataclass(frozen=True)
class Problem:
    """Why a file is broken: a failure class and the message that shows it."""

    failure: str
    """``"load_error"``, ``"bad_values"`` or ``"bad_shape"``."""
    error: str
    """The exception as ``"Type: message"``, or the validator's finding."""
    stage: str = "load"
    """``"open"`` when ``Image.open``/the header read already fails, else ``"load"`` or ``"validate"``."""


def _describe(exc: BaseException, path: str | Path) -> str:
    """``"Type: message"``, with the file's path shortened to its name so manifests do not depend on
    where the dataset was written."""
    text = f"{type(exc).__name__}: {exc}"
    return text.replace(str(path), Path(path).name)


def check_image(path: str | Path, size: Sequence[int] | None = None, load_truncated: bool = False) -> Problem | None:
    """Open ``path`` with Pillow, decode it fully and convert it to RGB; ``None`` when that works.

    ``size`` (width, height), when given, must match, or the result is a ``"bad_shape"`` problem.
    Pillow's ``ImageFile.LOAD_TRUNCATED_IMAGES`` is set to ``load_truncated`` during the check
    (False is Pillow's default) and restored afterwards; with True, truncated files load partially.
    """
    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = load_truncated
    try:
        try:
            im = Image.open(path)
        except Exception as exc:  # any decoder error counts: that is what a Dataset would see
            return Problem("load_error", _describe(exc, path), stage="open")
        with im:
            try:
                im.load()
                rgb = im.convert("RGB")
            except Exception as exc:
                return Problem("load_error", _describe(exc, path), stage="load")
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = saved
    if size is not None and tuple(rgb.size) != tuple(size):
        return Problem("bad_shape", f"size {rgb.size} != expected {tuple(size)}", stage="validate")
    return None


def check_array(
    arr: np.ndarray, shape: Sequence[int] | None = None, dtype: str | np.dtype | None = None
) -> Problem | None:
    """Validate an array that loaded: expected ``shape`` and ``dtype`` (when given), finite values."""
    if shape is not None and tuple(arr.shape) != tuple(shape):
        return Problem("bad_shape", f"shape {tuple(arr.shape)} != expected {tuple(shape)}", stage="validate")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        return Problem("bad_shape", f"dtype {arr.dtype} != expected {np.dtype(dtype)}", stage="validate")
    if arr.dtype.kind in "fc":
        finite = np.isfinite(arr)
        if not finite.all():
            bad = int(arr.size - np.count_nonzero(finite))
            return Problem("bad_values", f"{bad} of {arr.size} values are NaN or Inf", stage="validate")
    return None


def check_npy(
    path: str | Path, shape: Sequence[int] | None = None, dtype: str | np.dtype | None = None
) -> Problem | None:
    """``np.load`` the file (no pickles) and validate it with ``check_array``; ``None`` when fine."""
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, EOFError, even tokenize errors on bad headers
        return Problem("load_error", _describe(exc, path))
    return check_array(arr, shape, dtype)
