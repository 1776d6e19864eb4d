"""Shared by the launcher scenarios: records, one of them cut short, and a decoder that trusts its input.

Each launcher scenario (``tree_*_broken.py``) runs its DataLoader in a process the script started, not in
the script's own main process: the workers are grandchildren of the script.
"""

import ctypes

import torch
from torch.utils.data import Dataset

MAGIC = b"IMG0"


def make_records(n=48, bad=29):
    records = [MAGIC + bytes([i % 256] * 64) for i in range(n)]
    if bad is not None:
        records[bad] = records[bad][:2]  # a file cut short during a copy
    return records


def decode(blob):
    """Like a native decoder that trusts its input: on a bad header it reads from a null pointer."""
    if blob[:4] != MAGIC:
        ctypes.string_at(0)
    return torch.frombuffer(bytearray(blob[4:]), dtype=torch.uint8).float() / 255


class Records(Dataset):
    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return decode(self.records[i])


class CheckedRecords(Records):
    """A Dataset that refuses a bad record with a Python error (the worker survives to report it)."""

    def __getitem__(self, i):
        blob = self.records[i]
        if blob[:4] != MAGIC:
            raise RuntimeError(f"record {i} is truncated ({len(blob)} bytes)")
        return decode(blob)
