"""Reading the workers' own memory reports of notebook 04's runs, in MiB: each batch carries the USS, PSS and
RSS of the worker that made it, now and at its birth (:func:`labutils.kit.measure.collate_with_memory`), emitted
as ``run.values[key]["reports"]`` by :func:`labutils.kit.measure.run_batches` (or ``run.values["reports"]``).
"""

from __future__ import annotations

from statistics import mean

MiB = 2**20


def reports(run, key: str = "mem") -> list:
    """The workers' memory reports of a run, one dict per batch, in the order the batches arrived."""
    values = run.values.get(key) if key else None
    return list(values["reports"] if isinstance(values, dict) else run.values.get("reports", []))


def last_reports(run, key: str = "mem") -> list:
    """Each worker's last report, ordered by worker id."""
    last = {}
    for r in reports(run, key):
        last[r["worker"]] = r
    return [last[w] for w in sorted(last)]


def growth_per_worker(run, key: str = "mem") -> float:
    """Mean over workers of (USS at its last report - USS at its birth), in MiB: what each worker copied."""
    return mean(r["uss"] - r["birth_uss"] for r in last_reports(run, key)) / MiB


def birth_uss(run, key: str = "mem") -> float:
    """Mean over workers of their USS before their first sample, in MiB."""
    return mean(r["birth_uss"] for r in last_reports(run, key)) / MiB


def total_extra(run, key: str = "mem") -> list:
    """For each batch: the sum over workers of (latest USS - USS at birth), in MiB."""
    latest, totals = {}, []
    for r in reports(run, key):
        latest[r["worker"]] = r["uss"] - r["birth_uss"]
        totals.append(sum(latest.values()) / MiB)
    return totals


def workers_pss(run, key: str = "mem") -> float:
    """The workers' PSS summed at their last report, in MiB (PSS adds up across processes)."""
    return sum(r["pss"] for r in last_reports(run, key)) / MiB
