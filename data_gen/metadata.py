"""``make_metadata``: millions of small Python objects (file paths, or ``{"path", "label"}`` dicts).

This is the data of the copy-on-read lesson (pytorch/pytorch#13246): a Dataset that keeps such a list
makes every forked worker touch the objects' reference counts and slowly copy the whole list. The
two representations it compares both come from one file:

- :func:`load_metadata` returns the naive form, a ``list`` of ``str`` or of ``dict``;
- :func:`load_metadata_packed` returns the fix, one ``uint8`` buffer plus ``int64`` offsets, where
  item ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (UTF-8 text for ``"str"``, compact JSON for
  ``"dict"``); :func:`packed_item` decodes one item.

File format (compact, and fast to read): three ``.npy`` records written one after another, read back
with three ``np.load`` calls on one open file: a 0-d string array holding a JSON header
(``{"format": "data_gen.metadata", "format_version": 1, "kind": ..., "n": ...}``), the offsets, and
the buffer. No pickles, no zip timestamps, so the same seed gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

import numpy as np

from ._common import atomic_write, check_n, check_seed, prepare_file
from .manifest import Entry, Manifest, sidecar_path

METADATA_KINDS = ("str", "dict")
_FORMAT = "data_gen.metadata"
_FORMAT_VERSION = 1

Item = Union[str, dict]


_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _number(out: np.ndarray, col: int, values: np.ndarray, width: int, base: int, pad: bytes) -> None:
    """Write ``values`` in ``base`` into ``out[:, col:col + width]``, left-padded with ``pad``."""
    rest = values.astype(np.uint64)
    for k in range(width - 1, -1, -1):
        out[:, col + k] = _DIGITS[rest % np.uint64(base)]
        rest = rest // np.uint64(base)
    if pad != b"0":
        leading = np.ones(len(values), dtype=bool)
        for k in range(width - 1):
            leading &= out[:, col + k] == ord("0")
            out[leading, col + k] = pad[0]


def _items(n: int, kind: str, seed: int, n_classes: int) -> np.ndarray:
    """All items as one ``(n, width)`` uint8 matrix of ASCII, built with numpy (1M rows in well under 1 s).

    Items have a fixed width: ``train/class_<label>/<index>_<tag>.jpg`` with zero-padded numbers
    and a random 8-hex-digit tag; a dict item is ``{"path":"<path>","label":<label>}`` with the label
    right-aligned by spaces, which JSON allows.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=n)
    tags = rng.integers(0, 1 << 32, size=n, dtype=np.uint64)
    class_w = max(4, len(str(n_classes - 1)))
    index_w = max(8, len(str(n - 1)))
    pieces: list = [b"train/class_", (labels, class_w, 10, b"0"), b"/", (np.arange(n), index_w, 10, b"0")]
    pieces += [b"_", (tags, 8, 16, b"0"), b".jpg"]
    if kind == "dict":
        pieces = [b'{"path":"', *pieces, b'","label":', (labels, len(str(n_classes - 1)), 10, b" "), b"}"]
    width = sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
    out = np.empty((n, width), dtype=np.uint8)
    col = 0
    for piece in pieces:
        if isinstance(piece, bytes):
            out[:, col : col + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            col += len(piece)
        else:
            _number(out, col, *piece)
            col += piece[1]
    return out


def make_metadata(
    path: str | Path,
    n: int = 1_000_000,
    kind: str = "str",
    seed: int = 0,
    n_classes: int = 1000,
    overwrite: bool = False,
) -> Manifest:
    """Write ``n`` metadata items to ``path``; its manifest goes to ``<path>.manifest.json``.

    Args:
        path: the output file.
        n: number of items (at least 1); a million take about a second to write.
        kind: ``"str"`` for paths like ``"train/class_0042/00001234_9f3a07c1.jpg"``, or ``"dict"``
            for ``{"path": <such a path>, "label": <int>}``.
        seed: the same seed and arguments give a byte-identical file.
        n_classes: labels are drawn from ``range(n_classes)`` (the path's class folder).
        overwrite: replace an existing file.
    """
    n = check_n(n)
    seed = check_seed(seed)
    if kind not in METADATA_KINDS:
        raise ValueError(f"unknown metadata kind {kind!r}: choose from {', '.join(METADATA_KINDS)}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes must be a whole number of at least 1, got {n_classes!r}")
    path = prepare_file(path, overwrite)

    items = _items(n, kind, seed, int(n_classes))
    offsets = np.arange(n + 1, dtype=np.int64) * items.shape[1]
    data = items.reshape(-1)
    header = {"format": _FORMAT, "format_version": _FORMAT_VERSION, "kind": kind, "n": n}

    with atomic_write(path) as fh:
        np.save(fh, np.array(json.dumps(header, sort_keys=True)), allow_pickle=False)
        np.save(fh, offsets, allow_pickle=False)
        np.save(fh, data, allow_pickle=False)

    manifest = Manifest(
        generator="make_metadata",
        params={"n": n, "kind": kind, "n_classes": int(n_classes)},
        seed=seed,
        entries=[Entry(path=path.name, label=None, status="ok", kind="ok", info={"file_bytes": path.stat().st_size})],
        libs={"numpy": np.__version__},
    )
    manifest.save(sidecar_path(path))
    return manifest


def _read(path: str | Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            header = json.loads(str(np.load(fh, allow_pickle=False)))
            if not isinstance(header, dict) or header.get("format") != _FORMAT:
                raise ValueError("wrong header")
            offsets = np.load(fh, allow_pickle=False)
            data = np.load(fh, allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{path} is not a data_gen metadata file ({exc}): write it with make_metadata") from None
    return header, data, offsets


def load_metadata(path: str | Path) -> list[Item]:
    """The naive representation: a Python ``list`` of ``str`` or of ``{"path", "label"}`` dicts."""
    header, data, offsets = _read(path)
    is_dict = header["kind"] == "dict"
    n = len(offsets) - 1
    width = int(offsets[1] - offsets[0]) if n else 0
    fixed = n > 0 and width > 0 and bool(np.all(np.diff(offsets) == width)) and int(data.max()) < 128
    if fixed:  # every item ASCII and equally wide (what make_metadata writes): let numpy cut them
        rows = data[int(offsets[0]) : int(offsets[-1])].reshape(n, width)
        if not is_dict:
            text = rows.tobytes().decode("ascii")
            return [text[at : at + width] for at in range(0, n * width, width)]
        with_commas = np.empty((n, width + 1), dtype=np.uint8)
        with_commas[:, :width] = rows
        with_commas[:, width] = ord(",")
        return json.loads("[" + with_commas.tobytes()[:-1].decode("ascii") + "]")
    raw = data.tobytes()
    bounds = offsets.tolist()
    items = [raw[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:])]
    if is_dict:
        return json.loads("[" + ",".join(items) + "]")
    return items


def load_metadata_packed(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The copy-on-read fix: ``(data, offsets)``, a ``uint8`` buffer and ``n + 1`` ``int64`` offsets."""
    _, data, offsets = _read(path)
    return data, offsets


def packed_item(data: np.ndarray, offsets: np.ndarray, index: int, kind: str = "str") -> Item:
    """Decode item ``index`` of a packed buffer: a ``str``, or a ``dict`` when ``kind == "dict"``."""
    text = data[int(offsets[index]) : int(offsets[index + 1])].tobytes().decode("utf-8")
    return json.loads(text) if kind == "dict" else text
