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
    """Marker returned by :class:`QuarantineDataset` in place of a sample that raised.

    Attributes:
        index: the dataset index that failed.
        error_type: the exception's type name (``"UnidentifiedImageError"``).
        message: the exception's message (at most 500 characters).
        path: the sample's file, when the dataset was given ``path_of``.
        worker_id: the DataLoader worker that hit it (None in the main process).
    """

    index: Any
    error_type: str
    message: str
    path: Optional[str] = None
    worker_id: Optional[int] = None

    def __str__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"index {self.index}{where}: {self.error_type}: {self.message}"


class QuarantinedBatch(NamedTuple):
    """What :func:`collate_skip` returns: the collated good samples and the skipped markers.

    ``data`` is None when every sample of the batch was skipped. Unpack it (``data, skipped = batch``) or
    give it to :meth:`QuarantineReport.add`, which records the skipped ones and returns ``data``.
    """

    data: Any
    skipped: list


def _worker_id() -> Optional[int]:
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return info.id if info is not None else None


class QuarantineDataset:
    """Wrap a map-style dataset so a sample that raises becomes a :class:`Skipped` marker.

    Instead of crashing the epoch (or returning zeros that silently train the model on garbage), the
    failure is recorded with its index, path and error. Use with ``collate_fn=collate_skip`` so the
    markers are dropped from the batch and travel with it to the main process, and count them with a
    :class:`QuarantineReport`. ``self.skipped`` lists the markers made in *this* process only: with
    ``num_workers > 0`` they are made in the workers, which is why they ride in the batch.

    Args:
        dataset: the dataset to protect (``__getitem__`` and ``__len__``).
        catch: exception types to quarantine; others propagate (default: ``Exception``).
        path_of: optional ``index -> path`` callable recorded with the failure (must be picklable for
            spawn/forkserver).
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
    """Collate a batch from :class:`QuarantineDataset`, dropping :class:`Skipped` markers.

    Returns ``QuarantinedBatch(data, skipped)``: ``data`` is ``collate_fn`` (default
    ``torch.utils.data.default_collate``) of the good samples, or None when all were skipped; ``skipped``
    lists the markers, so the main process learns about failures that happened in workers. Pass another
    collate with ``functools.partial(collate_skip, collate_fn=my_collate)``.
    """
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
        """Record the skipped samples of ``batch`` and return its data (None if all were skipped).

        Accepts a :class:`QuarantinedBatch`, a lone :class:`Skipped`, or anything else (returned as is).
        """
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
