"""A healthy run whose own log quotes the errors it guards against."""

import logging
import sys

import torch
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(stream=sys.stderr, level=logging.INFO)
log = logging.getLogger("trainer")


class Clips(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def main():
    log.warning("if you see 'RuntimeError: DataLoader worker (pid(s) 1234) exited unexpectedly' or "
                "'is killed by signal: Killed.', lower num_workers")
    log.warning("ERROR: Unexpected segmentation fault encountered in worker. <- not this time")
    print("Too many open files? received 0 items of ancdata? not here.", file=sys.stderr)
    total = 0.0
    for batch in DataLoader(Clips(), batch_size=8, num_workers=2):
        total += batch.sum().item()
    try:
        raise RuntimeError("DataLoader worker (pid 99) is killed by signal: Killed. (a drill)")
    except RuntimeError as exc:
        log.info("drill caught: %s", exc)
    print("sum", total)


if __name__ == "__main__":
    main()
