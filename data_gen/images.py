"""``make_image_folder``: a folder of small labelled images, a chosen share of them corrupt.

Layout: ``<root>/class_<label>/<index>.<png|jpg>`` (the layout torchvision's ``ImageFolder`` reads),
plus ``<root>/manifest.json``.

Corrupt kinds, and what ``Image.open(p).convert("RGB")`` does with them under Pillow's defaults:

====================  ======================================================  =======  ============
kind                  what the file is                                        broken?  fails at
====================  ======================================================  =======  ============
``truncated``         a valid PNG/JPEG cut 20-80% into its pixel data         yes      ``.load()``
``zero_byte``         an empty file                                           yes      ``open``
``random_bytes``      random bytes, as long as a real image, under its name   yes      ``open``
``wrong_extension``   PNG data named ``.jpg`` / JPEG data named ``.png``      **no**   decodes fine
``broken_body``       valid header, pixel data replaced by garbage            yes      ``.load()``
====================  ======================================================  =======  ============

Pillow identifies images by content, not by name, so ``wrong_extension`` files load; they are
recorded as corrupt but not broken. With ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True`` both
``truncated`` and ``broken_body`` files load without error (Pillow then ignores decoder errors and
keeps whatever pixels it got): that setting hides the bug rather than fixing it.
A JPEG with random entropy-coded data usually decodes (libjpeg only warns), so ``broken_body`` JPEGs
also carry a second SOI marker inside the scan, which libjpeg rejects as an error.
Every file is checked with :func:`data_gen.checks.check_image` after it is written; the manifest
records that result, and generation stops with ``RuntimeError`` if a file does not behave as intended.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import PIL
from PIL import Image

from ._common import assign_kinds, check_fraction, check_kinds, check_n, check_seed, prepare_dir
from .checks import Problem, check_image
from .manifest import MANIFEST_NAME, Entry, Manifest

IMAGE_KINDS = ("truncated", "zero_byte", "random_bytes", "wrong_extension", "broken_body")
"""Every corrupt kind ``make_image_folder`` can write."""
BROKEN_IMAGE_KINDS = ("truncated", "zero_byte", "random_bytes", "broken_body")
"""The kinds that fail ``Image.open(p).convert("RGB")``; ``wrong_extension`` still decodes."""

_FORMATS = {"png": ("PNG", "png"), "jpeg": ("JPEG", "jpg"), "jpg": ("JPEG", "jpg")}
_OTHER_EXT = {"PNG": "jpg", "JPEG": "png"}
_MAX_SIDE = 4096
_ATTEMPTS = 20


def make_image_folder(
    root: str | Path,
    n: int = 100,
    corrupt_fraction: float = 0.1,
    size: Sequence[int] = (32, 32),
    formats: Iterable[str] = ("png", "jpeg"),
    seed: int = 0,
    kinds: Iterable[str] | None = None,
    n_classes: int = 4,
    overwrite: bool = False,
) -> Manifest:
    """Write ``n`` labelled RGB images under ``root``, ``corrupt_fraction`` of them corrupt.

    Args:
        root: output folder; created if missing. A non-empty folder is refused unless ``overwrite``
            (then only the files of an earlier data_gen manifest there are removed first).
        n: number of files (at least 1).
        corrupt_fraction: share of corrupt files in [0, 1]; ``round(n * fraction)`` files, half up.
        size: (width, height) of every good image.
        formats: encodings to draw from, per file: ``"png"``, ``"jpeg"`` (``"jpg"`` is an alias).
        seed: the same seed and arguments give byte-identical files and manifest.
        kinds: corrupt kinds to use, spread evenly over the corrupt files; default all of
            ``IMAGE_KINDS``.
        n_classes: labels are ``index % n_classes``; a class's images share a tint.
        overwrite: allow a non-empty ``root``.

    Returns:
        The saved ``Manifest`` (``<root>/manifest.json``).
    """
    n = check_n(n)
    fraction = check_fraction(corrupt_fraction)
    kinds_t = check_kinds(kinds, IMAGE_KINDS, "images")
    seed = check_seed(seed)
    width, height = _check_size(size)
    fmt_list = _check_formats(formats)
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes must be a whole number of at least 1, got {n_classes!r}")
    root = prepare_dir(root, overwrite)

    rng = np.random.default_rng(seed)
    plan = assign_kinds(rng, n, fraction, kinds_t)
    fmt_index = rng.integers(len(fmt_list), size=n)
    digits = max(5, len(str(n - 1)))
    entries = []
    for i in range(n):
        label = i % int(n_classes)
        pil_format, ext = _FORMATS[fmt_list[int(fmt_index[i])]]
        kind = plan.get(i, "ok")
        file_rng = np.random.default_rng([seed, i])
        data = _encode(_picture(file_rng, label, width, height), pil_format)
        if kind == "wrong_extension":
            ext = _OTHER_EXT[pil_format]
        rel = f"class_{label}/{i:0{digits}d}.{ext}"
        path = root / rel
        path.parent.mkdir(exist_ok=True)
        problem, info = _write(path, data, pil_format, kind, file_rng, (width, height))
        entries.append(Entry.made(rel, label, kind, problem, info))

    manifest = Manifest(
        generator="make_image_folder",
        params={
            "n": n,
            "corrupt_fraction": fraction,
            "size": [width, height],
            "formats": fmt_list,
            "kinds": list(kinds_t),
            "n_classes": int(n_classes),
        },
        seed=seed,
        entries=entries,
        libs={"numpy": np.__version__, "pillow": PIL.__version__},
    )
    manifest.save(root / MANIFEST_NAME)
    return manifest


def _check_size(size: Sequence[int]) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be (width, height), got {size!r}: for example (32, 32)") from None
    if not (1 <= width <= _MAX_SIDE and 1 <= height <= _MAX_SIDE):
        raise ValueError(f"size must be between 1 and {_MAX_SIDE} pixels a side, got {size!r}")
    return width, height


def _check_formats(formats: Iterable[str]) -> list[str]:
    if isinstance(formats, str):
        formats = [formats]
    chosen: list[str] = []
    for name in formats:
        key = str(name).lower()
        if key not in _FORMATS:
            raise ValueError(f"unknown image format {name!r}: choose from png, jpeg")
        key = "jpeg" if key == "jpg" else key
        if key not in chosen:
            chosen.append(key)
    if not chosen:
        raise ValueError("formats is empty: pass at least one of png, jpeg")
    return chosen


def _class_tint(label: int) -> np.ndarray:
    """A stable colour per class, independent of the seed."""
    return np.random.default_rng([7919, label]).integers(40, 216, size=3)


def _picture(rng: np.random.Generator, label: int, width: int, height: int) -> np.ndarray:
    """A class-tinted noisy picture with a bright rectangle somewhere: cheap, yet not trivial to encode."""
    img = _class_tint(label) + rng.integers(-30, 31, size=(height, width, 3))
    x0, x1 = np.sort(rng.integers(0, width + 1, size=2))
    y0, y1 = np.sort(rng.integers(0, height + 1, size=2))
    img[y0:y1, x0:x1] += 60
    return np.clip(img, 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, pil_format: str) -> bytes:
    buf = io.BytesIO()
    image = Image.fromarray(pixels)
    if pil_format == "JPEG":
        image.save(buf, "JPEG", quality=90)
    else:
        image.save(buf, "PNG")
    return buf.getvalue()


def _pixel_data_span(data: bytes, pil_format: str) -> tuple[int, int]:
    """Byte range of the first chunk of pixel data: PNG's first IDAT payload, JPEG's first scan."""
    if pil_format == "PNG":
        at = data.index(b"IDAT")
        length = int.from_bytes(data[at - 4 : at], "big")
        return at + 4, at + 4 + length
    at = 2  # walk the JPEG marker segments after SOI up to SOS (start of scan)
    while data[at : at + 2] != b"\xff\xda":
        if at + 4 > len(data):
            raise AssertionError("the encoded JPEG has no start-of-scan marker")
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    start = at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return start, len(data) - 2  # up to the EOI marker


def _corrupt(data: bytes, pil_format: str, kind: str, rng: np.random.Generator) -> tuple[bytes, dict]:
    if kind == "zero_byte":
        return b"", {}
    if kind == "random_bytes":
        return rng.integers(0, 256, size=len(data), dtype=np.uint8).tobytes(), {}
    if kind == "truncated":
        start, stop = _pixel_data_span(data, pil_format)
        cut = start + int(rng.uniform(0.2, 0.8) * (stop - start))
        return data[:cut], {"cut_at": cut, "original_bytes": len(data)}
    if kind == "broken_body":
        start, stop = _pixel_data_span(data, pil_format)
        garbage = bytearray(rng.integers(0, 256, size=stop - start, dtype=np.uint8).tobytes())
        if pil_format == "JPEG":
            garbage = bytearray(garbage.replace(b"\xff", b"\x00"))  # no accidental markers...
            at = int(rng.integers(0, max(1, len(garbage) // 4)))
            garbage[at : at + 2] = b"\xff\xd8"  # ...but one SOI inside the scan: a hard libjpeg error
        return data[:start] + bytes(garbage) + data[stop:], {"garbage_bytes": [start, stop]}
    raise AssertionError(f"unhandled kind {kind}")


def _write(
    path: Path, data: bytes, pil_format: str, kind: str, rng: np.random.Generator, size: tuple[int, int]
) -> tuple[Problem | None, dict]:
    """Write one file (corrupted as ``kind`` asks), check it, and retry a corruption that did not bite."""
    info = {"format": pil_format} if kind not in ("zero_byte", "random_bytes") else {}
    if kind in ("ok", "wrong_extension"):
        path.write_bytes(data)
        problem = check_image(path, size)
        if problem is not None:
            raise RuntimeError(f"data_gen bug: the untouched image {path} does not load: {problem.error}")
        return None, info
    for _ in range(_ATTEMPTS):
        payload, extra = _corrupt(data, pil_format, kind, rng)
        path.write_bytes(payload)
        problem = check_image(path, size)
        header_intact = kind in ("truncated", "broken_body")  # these must open, then fail to decode
        if problem is not None and (problem.stage == "load" or not header_intact):
            info.update(extra)
            info["fails_at"] = problem.stage
            return problem, info
    raise RuntimeError(f"data_gen bug: could not make a {kind} file at {path} that fails to load")
