"""Decode small binary records. The decoder stands in for a C image library with a bug."""

import ctypes

import torch
from torch.utils.data import DataLoader, Dataset

MAGIC = b"IMG0"


def make_records(n=48):
    records = [MAGIC + bytes([i % 256] * 64) for i in range(n)]
    records[29] = records[29][:2]  # a file cut short during a copy
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


if __name__ == "__main__":
    total = 0.0
    for batch in DataLoader(Records(make_records()), batch_size=8, num_workers=2):
        total += batch.mean().item()
    print("mean", total)
