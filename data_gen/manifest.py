"""The JSON manifest written next to every generated dataset, and its ``Manifest`` reader.

A folder dataset has ``<folder>/manifest.json``; a single-file dataset ``x.npy`` has
``x.npy.manifest.json`` beside it. Entry paths are relative to the manifest's folder, so a dataset
can be moved and two runs in different folders give byte-identical manifests.

Each entry says what the generator did and what a loader will see:

- ``status``: ``"ok"`` (left alone) or ``"corrupt"`` (tampered with), and ``kind`` names the tampering
  (``"ok"`` for untouched files);
- ``failure``: ``None`` when the file loads and passes the validator, else ``"load_error"`` (opening or
  decoding raises), ``"bad_values"`` (loads, but holds NaN/Inf) or ``"bad_shape"`` (loads, wrong shape);
  ``error`` holds the exception text the generator saw when it checked the file.

``broken`` means ``failure is not None``. A corrupt file can still be good: an image with the wrong
extension decodes fine, and the manifest says so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ._version import __version__

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def sidecar_path(path: str | Path) -> Path:
    """Where the manifest of the single-file dataset ``path`` lives: ``<path>.manifest.json``."""
    path = Path(path)
    return path.with_name(path.name + "." + MANIFEST_NAME)


@dataclass(frozen=True)
class Entry:
    """One generated file, as recorded in a manifest."""

    path: str
    """Path relative to the manifest's folder, with ``/`` separators."""
    label: int | None
    status: str
    """``"ok"`` or ``"corrupt"``."""
    kind: str
    """``"ok"`` or the corrupt kind (``"truncated"``, ``"nan_inf"``, ...)."""
    failure: str | None = None
    """``None``, ``"load_error"``, ``"bad_values"`` or ``"bad_shape"``."""
    error: str | None = None
    """The exception text (or validator message) seen when the generator checked the file."""
    info: dict[str, Any] = field(default_factory=dict)
    """Per-kind details: content format, real shape, where a file was cut, ..."""

    @property
    def broken(self) -> bool:
        """True when loading the file fails or its content fails validation."""
        return self.failure is not None

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def made(cls, path: str, label: int | None, kind: str, problem, info: dict[str, Any]) -> Entry:
        """The entry of a file a generator wrote as ``kind``, with the ``Problem`` its check found (or None)."""
        return cls(path=path, label=label, status="ok" if kind == "ok" else "corrupt", kind=kind,
                   failure=problem.failure if problem else None, error=problem.error if problem else None,
                   info=info)


@dataclass
class Manifest:
    """A dataset's manifest: what was generated, with which parameters, and the truth about each file."""

    generator: str
    params: dict[str, Any]
    seed: int
    entries: list[Entry]
    version: str = __version__
    libs: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    """Where the manifest file is (set by ``save`` and ``load``)."""

    @property
    def root(self) -> Path:
        """The folder the entry paths are relative to."""
        if self.path is None:
            raise ValueError("this manifest has not been saved or loaded, so it has no folder")
        return self.path.parent

    def broken(self) -> list[Entry]:
        """Entries whose file fails to load or fails validation."""
        return [e for e in self.entries if e.broken]

    def good(self) -> list[Entry]:
        """Entries whose file loads and passes validation (corrupt-but-harmless ones included)."""
        return [e for e in self.entries if not e.broken]

    def corrupt(self) -> list[Entry]:
        """Entries the generator tampered with, whether or not they still load."""
        return [e for e in self.entries if e.status == "corrupt"]

    def path_of(self, entry: Entry) -> Path:
        """The absolute path of an entry's file."""
        return self.root / entry.path

    def paths(self, entries: Iterable[Entry] | None = None) -> list[Path]:
        """Absolute paths of ``entries`` (default: all entries), in manifest order."""
        return [self.path_of(e) for e in (self.entries if entries is None else entries)]

    def summary(self) -> dict[str, Any]:
        """Counts: files, corrupt, broken, and corrupt files per kind."""
        kinds: dict[str, int] = {}
        for e in self.corrupt():
            kinds[e.kind] = kinds.get(e.kind, 0) + 1
        return {
            "files": len(self.entries),
            "corrupt": len(self.corrupt()),
            "broken": len(self.broken()),
            "kinds": dict(sorted(kinds.items())),
        }

    def to_json(self) -> str:
        """Serialize deterministically: sorted keys, one line per entry."""
        head = {
            "manifest_format": MANIFEST_FORMAT,
            "generator": self.generator,
            "data_gen_version": self.version,
            "seed": self.seed,
            "params": self.params,
            "libs": self.libs,
            "summary": self.summary(),
        }
        lines = ["{"]
        for key in sorted(head):
            lines.append(f"  {json.dumps(key)}: {json.dumps(head[key], sort_keys=True)},")
        lines.append('  "entries": [')
        body = [f"    {json.dumps(e.to_json(), sort_keys=True)}" for e in self.entries]
        lines.append(",\n".join(body))
        lines.append("  ]")
        lines.append("}")
        return "\n".join(line for line in lines if line) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the manifest to ``path`` and remember it; return the path."""
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        self.path = path
        return path

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read a manifest from its file, from a dataset folder, or from a single-file dataset's path."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        elif not path.name.endswith(MANIFEST_NAME):
            path = sidecar_path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"no data_gen manifest at {path}: generate the dataset first") from None
        except ValueError as exc:
            raise ValueError(f"{path} is not a valid data_gen manifest: {exc}") from None
        return cls(
            generator=raw["generator"],
            params=raw["params"],
            seed=raw["seed"],
            entries=[Entry(**e) for e in raw["entries"]],
            version=raw["data_gen_version"],
            libs=raw.get("libs", {}),
            path=path,
        )
