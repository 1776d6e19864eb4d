"""Quarantine for bad samples: :class:`QuarantineDataset`, :func:`collate_skip`, :class:`QuarantineReport`.

A sample that fails to load is recorded (index, path, error) and dropped from its batch instead of
crashing the epoch or being silently replaced by zeros. The records travel inside the batch, because a
worker's memory never reaches the main process. Also importable from :mod:`labutils.kit.fixes`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence

__all__ = ["Skipped", "QuarantinedBatch", "QuarantineDataset", "collate_skip", "QuarantineReport"]


@dataclass(frozen=True)
class Skipped:
    """Marker returned by :class:`QuarantineDataset` in place of a sample that raised: its index, the
    exception's type name and message (at most 500 characters), its file (with ``path_of``) and the worker
    that hit it (None in the main process)."""

    index: Any
    error_type: str
    message: str
    path: Optional[str] = None
    worker_id: Optional[int] = None

    def __str__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"index {self.index}{where}: {self.error_type}: {self.message}"


class QuarantinedBatch(NamedTuple):
    """What :func:`collate_skip` returns: the collated good samples (None when all were skipped) and the
    skipped markers; unpack it, or give it to :meth:`QuarantineReport.add`."""

    data: Any
    skipped: list


def _worker_id() -> Optional[int]:
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return info.id if info is not None else None


class QuarantineDataset:
    """Wrap a map-style dataset so a sample that raises becomes a :class:`Skipped` marker.

    Use with ``collate_fn=collate_skip`` so the markers leave the batch and travel with it to the main
    process, and count them with a :class:`QuarantineReport` (``self.skipped`` holds only the markers made
    in *this* process). ``catch``: the exception types to quarantine (others propagate); ``path_of``: an
    optional picklable ``index -> path`` recorded with the failure.
    """

    def __init__(
        self,
        dataset: Any,
        catch: type | tuple = (Exception,),
        path_of: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        self.dataset = dataset
        self.catch = catch if isinstance(catch, tuple) else (catch,)
        self.path_of = path_of
        self.skipped: list = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            n = len(self.dataset)
            if not -n <= index < n:  # keep the IndexError that ends plain iteration
                raise IndexError(f"index {index} out of range for a dataset of {n}")
        try:
            return self.dataset[index]
        except self.catch as exc:
            path = None
            if self.path_of is not None:
                try:
                    path = str(self.path_of(index))
                except Exception as path_exc:  # noqa: BLE001 - the path is extra information only
                    path = f"<path_of failed: {type(path_exc).__name__}>"
            marker = Skipped(index, type(exc).__name__, str(exc)[:500], path, _worker_id())
            self.skipped.append(marker)
            return marker


def collate_skip(batch: Sequence[Any], collate_fn: Optional[Callable[[list], Any]] = None) -> QuarantinedBatch:
    """Collate a batch from :class:`QuarantineDataset` into a :class:`QuarantinedBatch`, the markers apart;
    ``collate_fn`` (default ``default_collate``, or ``functools.partial(collate_skip, collate_fn=mine)``)."""
    if isinstance(batch, Skipped):  # batch_size=None: one sample per "batch"
        return QuarantinedBatch(None, [batch])
    good = [x for x in batch if not isinstance(x, Skipped)]
    skipped = [x for x in batch if isinstance(x, Skipped)]
    if not good:
        return QuarantinedBatch(None, skipped)
    if collate_fn is None:
        from torch.utils.data import default_collate

        collate_fn = default_collate
    return QuarantinedBatch(collate_fn(good), skipped)


class QuarantineReport:
    """Accumulate skipped samples across an epoch from :func:`collate_skip` batches.

    ::

        report = QuarantineReport()
        for batch in loader:
            data = report.add(batch)
            if data is None:
                continue        # every sample of this batch was bad
            ...
        print(report)           # "2 samples skipped (OSError: 1, ValueError: 1)" and one line each
    """

    def __init__(self) -> None:
        self.records: list = []
        self.batches = 0
        self.empty_batches = 0

    def add(self, batch: Any) -> Any:
        """Record the skipped samples of a :class:`QuarantinedBatch` (or a lone :class:`Skipped`) and return
        its data (None if all were skipped); anything else is returned as is."""
        self.batches += 1
        if isinstance(batch, Skipped):
            self.records.append(batch)
            self.empty_batches += 1
            return None
        if isinstance(batch, QuarantinedBatch):
            self.records.extend(batch.skipped)
            if batch.data is None:
                self.empty_batches += 1
            return batch.data
        return batch

    @property
    def count(self) -> int:
        """How many samples were skipped."""
        return len(self.records)

    @property
    def by_kind(self) -> dict:
        """Skipped samples per exception type name, most frequent first."""
        return dict(Counter(r.error_type for r in self.records).most_common())

    @property
    def indices(self) -> list:
        return [r.index for r in self.records]

    def __len__(self) -> int:
        return self.count

    def __str__(self) -> str:
        if not self.records:
            return f"no samples skipped ({self.batches} batches)"
        kinds = ", ".join(f"{k}: {n}" for k, n in self.by_kind.items())
        noun = "sample" if self.count == 1 else "samples"
        lines = [f"{self.count} {noun} skipped in {self.batches} batches ({kinds})"]
        try:
            records = sorted(self.records, key=lambda r: r.index)
        except TypeError:  # indices of mixed types: keep arrival order
            records = self.records
        for r in records:
            path = f"  {r.path}" if r.path else ""
            lines.append(f"  index {r.index}{path}  {r.error_type}: {r.message}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<QuarantineReport count={self.count} by_kind={self.by_kind}>"
