"""Command line: ``python -m data_gen {images,npy,bigarray,metadata} --out ... [options]``.

Prints one summary line on success. Any input the user can get wrong (unknown subcommand or option,
bad number, unknown corrupt kind, refused size, non-empty output without ``--force``, unwritable
path) gives one line on stderr that says what to do, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

import numpy as np

from ._common import OutputExistsError
from .arrays import NPY_KINDS, make_npy_folder
from .bigfile import make_big_array
from .images import IMAGE_KINDS, make_image_folder
from .manifest import Manifest
from .metadata import METADATA_KINDS, make_metadata

PROG = "python -m data_gen"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def _int_list(text: str) -> list[int]:
    parts = [p for p in re.split(r"[x,\s]+", text.strip().lower()) if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 3,8,8, got {text!r}") from None


def _size(text: str) -> list[int]:
    values = _int_list(text)
    if len(values) == 1:
        values = values * 2
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 32x32, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", text.strip()) if p]


def _nbytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 64M, 1.5G or 4096, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Write synthetic and corrupt datasets for the DataLoader Crash Lab.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser, out_help: str, n_default: int | None, n_help: str) -> None:
        p.add_argument("--out", required=True, help=out_help)
        p.add_argument("--n", type=int, default=n_default, help=n_help)
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same bytes")
        p.add_argument("--force", action="store_true", help="write over an existing output")

    images = sub.add_parser("images", help="a folder of labelled PNG/JPEG images, some corrupt")
    common(images, "output folder (must be empty or new)", 100, "number of files (default 100)")
    images.add_argument("--corrupt-fraction", type=float, default=0.1, help="share of corrupt files (0.1)")
    images.add_argument("--size", type=_size, default=[32, 32], help="WIDTHxHEIGHT (default 32x32)")
    images.add_argument("--formats", type=_names, default=["png", "jpeg"], help="png,jpeg (default both)")
    images.add_argument(
        "--kinds",
        type=_names,
        default=None,
        help=f"comma-separated corrupt kinds, default all: {', '.join(IMAGE_KINDS)}",
    )
    images.add_argument("--classes", type=int, default=4, help="number of labels (default 4)")

    npy = sub.add_parser("npy", help="a folder of labelled .npy samples, some corrupt")
    common(npy, "output folder (must be empty or new)", 100, "number of files (default 100)")
    npy.add_argument("--corrupt-fraction", type=float, default=0.1, help="share of corrupt files (0.1)")
    npy.add_argument("--shape", type=_int_list, default=[3, 8, 8], help="sample shape (default 3,8,8)")
    npy.add_argument("--dtype", default="float32", help="numpy dtype (default float32)")
    npy.add_argument(
        "--kinds", type=_names, default=None, help=f"comma-separated corrupt kinds, default all: {', '.join(NPY_KINDS)}"
    )
    npy.add_argument("--classes", type=int, default=4, help="number of labels (default 4)")

    big = sub.add_parser("bigarray", help="one large .npy, written in chunks, for np.load(mmap_mode='r')")
    common(big, "output .npy file", None, "number of elements (1-D array); or --nbytes, or --shape")
    big.add_argument("--nbytes", type=_nbytes, default=None, help="data size, e.g. 256M or 2G (binary units)")
    big.add_argument("--shape", type=_int_list, default=None, help="array shape, e.g. 4096,4096")
    big.add_argument("--dtype", default="float32", help="numpy dtype (default float32)")

    meta = sub.add_parser("metadata", help="millions of paths or {path,label} dicts (copy-on-read lesson)")
    common(meta, "output file", 1_000_000, "number of items (default 1000000)")
    meta.add_argument("--kind", choices=METADATA_KINDS, default="str", help="str or dict (default str)")
    meta.add_argument("--classes", type=int, default=1000, help="number of labels (default 1000)")
    return parser


class _ByteProgress:
    """A progress bar on stderr for big writes: redrawn in place on a terminal, every 10% otherwise."""

    def __init__(self, stream=None, min_bytes: int = 64 * 2**20):
        self.stream, self.min_bytes, self.last = stream or sys.stderr, min_bytes, -1

    def __call__(self, done: int, total: int) -> None:
        if total < self.min_bytes:
            return
        pct = int(100 * done / max(total, 1))
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        if pct == self.last or (not tty and pct // 10 == self.last // 10 and done < total):
            return
        self.last = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        end = "\n" if done >= total or not tty else ""
        start = "\r" if tty else ""
        self.stream.write(f"{start}[{bar}] {pct:3d}% {done / 2**20:.0f}/{total / 2**20:.0f} MiB{end}")
        self.stream.flush()


def _check_counts(args: argparse.Namespace) -> None:
    """Catch the most common slips with the flag's own name in the message."""
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}: ask for 1 or more")
    fraction = getattr(args, "corrupt_fraction", 0.0)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--corrupt-fraction must be between 0 and 1, got {fraction}: e.g. 0.1 for 10%")


def _run(args: argparse.Namespace) -> str:
    _check_counts(args)
    if args.command in ("images", "npy"):
        common = dict(n=args.n, corrupt_fraction=args.corrupt_fraction, seed=args.seed, kinds=args.kinds,
                      n_classes=args.classes, overwrite=args.force)
        if args.command == "images":
            m = make_image_folder(args.out, size=args.size, formats=args.formats, **common)
            return _folder_summary(m, "images")
        m = make_npy_folder(args.out, shape=args.shape, dtype=args.dtype, **common)
        return _folder_summary(m, ".npy files")
    if args.command == "bigarray":
        given = [x is not None for x in (args.n, args.nbytes, args.shape)]
        if sum(given) != 1:
            raise ValueError("give exactly one of --n (elements), --nbytes and --shape, e.g. --nbytes 256M")
        shape = [args.n] if args.n is not None else args.shape
        m = make_big_array(
            args.out, nbytes=args.nbytes, shape=shape, dtype=args.dtype, seed=args.seed, overwrite=args.force,
            progress=_ByteProgress(),
        )
        p = m.params
        size = f"{p['nbytes'] / 2**20:.1f} MiB"
        return (
            f"wrote a {tuple(p['shape'])} {np.dtype(p['dtype']).name} array ({size}) to {m.path_of(m.entries[0])}; "
            f"manifest: {m.path}"
        )
    m = make_metadata(args.out, n=args.n, kind=args.kind, seed=args.seed, n_classes=args.classes, overwrite=args.force)
    size = f"{m.entries[0].info['file_bytes'] / 2**20:.1f} MiB"
    where = m.path_of(m.entries[0])
    return f"wrote {m.params['n']} {m.params['kind']} items ({size}) to {where}; manifest: {m.path}"


def _folder_summary(m: Manifest, what: str) -> str:
    s = m.summary()
    kinds = ", ".join(f"{count} {kind}" for kind, count in s["kinds"].items())
    detail = f"{s['corrupt']} corrupt" + (f": {kinds}" if kinds else "") + f"; {s['broken']} broken"
    return f"wrote {s['files']} {what} to {m.root} ({detail}); manifest: {m.path}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0, or 2 for bad input)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    prog = f"{PROG} {args.command}"
    try:
        print(_run(args))
    except OutputExistsError as exc:
        return _fail(prog, f"{exc}")
    except ValueError as exc:
        return _fail(prog, str(exc))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = exc.filename or args.out
        return _fail(prog, f"cannot write {where}: {reason}; choose an --out path you can write to")
    return 0


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
