"""``make_npy_folder``: a folder of small labelled ``.npy`` samples, a chosen share of them corrupt.

Layout: ``<root>/sample_<index>.npy`` plus ``<root>/manifest.json`` (which holds the labels).

Corrupt kinds, all of them broken, each in its own way:

==============  ===============================================  ===============  ===================
kind            what the file is                                 failure          seen by
==============  ===============================================  ===============  ===================
``truncated``   a valid ``.npy`` cut 10-90% into its data        ``load_error``   ``np.load`` raises
``bad_header``  a span of the header dict replaced by garbage    ``load_error``   ``np.load`` raises
``nan_inf``     loads, but about 10% of the values are NaN/Inf   ``bad_values``   a validator
``wrong_shape`` loads, but with another shape than promised      ``bad_shape``    a validator
==============  ===============================================  ===============  ===================

``np.load`` on a bad header does not always raise ``ValueError``: garbage in the header dict can
surface as a tokenizer or syntax error, so a loader that catches only ``ValueError`` still crashes.
The validator is :func:`data_gen.checks.check_array`; every file is checked after it is written and
the manifest records the result.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ._common import (
    assign_kinds,
    check_dtype,
    check_fraction,
    check_kinds,
    check_n,
    check_seed,
    check_shape,
    prepare_dir,
)
from .checks import Problem, check_npy
from .manifest import MANIFEST_NAME, Entry, Manifest

NPY_KINDS = ("truncated", "bad_header", "nan_inf", "wrong_shape")
"""Every corrupt kind ``make_npy_folder`` can write; all of them are broken."""
NPY_FAILURES = {
    "truncated": "load_error",
    "bad_header": "load_error",
    "nan_inf": "bad_values",
    "wrong_shape": "bad_shape",
}
"""How each kind fails: at ``np.load``, or in the validator."""

_MAX_ELEMENTS = 10_000_000
_PRINTABLE = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789(){}[]:,'\" ", dtype=np.uint8)
_ATTEMPTS = 20


def make_npy_folder(
    root: str | Path,
    n: int = 100,
    corrupt_fraction: float = 0.1,
    shape: Sequence[int] = (3, 8, 8),
    dtype: str | np.dtype = "float32",
    seed: int = 0,
    kinds: Iterable[str] | None = None,
    n_classes: int = 4,
    overwrite: bool = False,
) -> Manifest:
    """Write ``n`` labelled arrays of ``shape`` and ``dtype`` under ``root``, some of them corrupt.

    Args:
        root: output folder; created if missing. A non-empty folder is refused unless ``overwrite``.
        n: number of files (at least 1).
        corrupt_fraction: share of corrupt files in [0, 1]; ``round(n * fraction)`` files, half up.
        shape: shape of every good sample.
        dtype: a numeric numpy dtype; good float samples are standard normal, integer ones in [0, 100).
        seed: the same seed and arguments give byte-identical files and manifest.
        kinds: corrupt kinds to use, spread evenly; default all of ``NPY_KINDS`` (without ``nan_inf``
            for integer dtypes, which cannot hold NaN).
        n_classes: labels are ``index % n_classes``.
        overwrite: allow a non-empty ``root``.

    Returns:
        The saved ``Manifest`` (``<root>/manifest.json``).
    """
    n = check_n(n)
    fraction = check_fraction(corrupt_fraction)
    seed = check_seed(seed)
    shape_t = _check_shape(shape)
    dt = check_dtype(dtype)
    allowed = NPY_KINDS if dt.kind == "f" else tuple(k for k in NPY_KINDS if k != "nan_inf")
    if kinds is not None and dt.kind != "f" and "nan_inf" in ([kinds] if isinstance(kinds, str) else kinds):
        raise ValueError(f"corrupt kind 'nan_inf' needs a floating dtype, not {dt}: use float32 or drop it")
    kinds_t = check_kinds(kinds, allowed, "npy")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes must be a whole number of at least 1, got {n_classes!r}")
    root = prepare_dir(root, overwrite)

    plan = assign_kinds(np.random.default_rng(seed), n, fraction, kinds_t)
    digits = max(5, len(str(n - 1)))
    entries = []
    for i in range(n):
        kind = plan.get(i, "ok")
        rel = f"sample_{i:0{digits}d}.npy"
        problem, info = _write(root / rel, kind, np.random.default_rng([seed, i]), shape_t, dt)
        entries.append(Entry.made(rel, i % int(n_classes), kind, problem, info))

    manifest = Manifest(
        generator="make_npy_folder",
        params={
            "n": n,
            "corrupt_fraction": fraction,
            "shape": list(shape_t),
            "dtype": dt.str,
            "kinds": list(kinds_t),
            "n_classes": int(n_classes),
        },
        seed=seed,
        entries=entries,
        libs={"numpy": np.__version__},
    )
    manifest.save(root / MANIFEST_NAME)
    return manifest


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    shape_t = check_shape(shape)
    if int(np.prod(shape_t)) > _MAX_ELEMENTS:
        raise ValueError(
            f"shape {shape_t} has more than {_MAX_ELEMENTS:,} elements per sample: use make_big_array for large arrays"
        )
    return shape_t


def _sample(rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return rng.integers(0, 100, size=shape).astype(dt)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _wrong_shape(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    candidates = [shape[:-1] + (shape[-1] + 1,), tuple(reversed(shape)), (int(np.prod(shape)),)]
    candidates.append(shape[1:] if len(shape) > 1 else (shape[0], 1))
    distinct = [c for i, c in enumerate(candidates) if c != shape and c not in candidates[:i]]
    return distinct[int(rng.integers(len(distinct)))]


def _corrupt(
    kind: str, rng: np.random.Generator, arr: np.ndarray, shape: tuple[int, ...], dt: np.dtype
) -> tuple[bytes, dict]:
    if kind == "nan_inf":
        flat = arr.reshape(-1).copy()
        count = max(1, flat.size // 10)
        where = rng.choice(flat.size, size=count, replace=False)
        flat[where] = rng.choice(np.array([np.nan, np.inf, -np.inf]), size=count)
        return _npy_bytes(flat.reshape(shape)), {"non_finite": int(count)}
    if kind == "wrong_shape":
        other = _wrong_shape(rng, shape)
        return _npy_bytes(_sample(rng, other, dt)), {"shape": list(other)}
    data = _npy_bytes(arr)
    data_start = len(data) - arr.nbytes
    if kind == "truncated":
        cut = data_start + int(rng.uniform(0.1, 0.9) * arr.nbytes)
        return data[:cut], {"cut_at": cut, "original_bytes": len(data)}
    if kind == "bad_header":
        # The header dict sits between the 10-byte preamble and the newline that ends the padding.
        dict_end = data.index(b"}", 10) + 1
        width = min(8, dict_end - 10)
        at = int(rng.integers(10, dict_end - width + 1))
        junk = _PRINTABLE[rng.integers(len(_PRINTABLE), size=width)].tobytes()
        return data[:at] + junk + data[at + width :], {"garbage_bytes": [at, at + width]}
    raise AssertionError(f"unhandled kind {kind}")


def _write(
    path: Path, kind: str, rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype
) -> tuple[Problem | None, dict]:
    """Write one sample (corrupted as ``kind`` asks), check it, and retry a corruption that did not bite."""
    arr = _sample(rng, shape, dt)
    if kind == "ok":
        path.write_bytes(_npy_bytes(arr))
        problem = check_npy(path, shape, dt)
        if problem is not None:
            raise RuntimeError(f"data_gen bug: the untouched sample {path} fails its check: {problem.error}")
        return None, {}
    for _ in range(_ATTEMPTS):
        payload, info = _corrupt(kind, rng, arr, shape, dt)
        path.write_bytes(payload)
        problem = check_npy(path, shape, dt)
        if problem is not None and problem.failure == NPY_FAILURES[kind]:
            return problem, info
    raise RuntimeError(f"data_gen bug: could not make a {kind} sample at {path} that fails as intended")
