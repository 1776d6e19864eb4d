"""Decode small binary records, checking each record before it reaches the native decoder."""

import ctypes

import torch
from torch.utils.data import DataLoader, Dataset

MAGIC = b"IMG0"


def make_records(n=48):
    records = [MAGIC + bytes([i % 256] * 64) for i in range(n)]
    records[29] = records[29][:2]
    return records


def decode(blob):
    if blob[:4] != MAGIC:
        ctypes.string_at(0)
    return torch.frombuffer(bytearray(blob[4:]), dtype=torch.uint8).float() / 255


class Records(Dataset):
    def __init__(self, records):
        self.records = [r for r in records if len(r) == 68 and r[:4] == MAGIC]
        self.skipped = len(records) - len(self.records)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return decode(self.records[i])


if __name__ == "__main__":
    data = Records(make_records())
    print("skipped records:", data.skipped)
    total = 0.0
    for batch in DataLoader(data, batch_size=8, num_workers=2):
        total += batch.mean().item()
    print("mean", total)
