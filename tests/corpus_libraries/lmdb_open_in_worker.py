# Modelled on https://github.com/jnwatson/py-lmdb/issues/266 (the maintainer's advice: open the environment inside)
"""The environment is opened inside each worker (worker_init_fn), never in the main process."""

import shutil
import tempfile

import lmdb
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Lookups(Dataset):
    def __init__(self, root):
        self.root, self.env = root, None

    def __len__(self):
        return 64

    def __getitem__(self, i):
        with self.env.begin() as txn:
            return torch.tensor(int(txn.get(b"%d" % i)))


def open_env(worker_id):
    dataset = get_worker_info().dataset
    dataset.env = lmdb.open(dataset.root, readonly=True)


if __name__ == "__main__":
    root = tempfile.mkdtemp()
    try:
        with lmdb.open(root, map_size=1 << 22) as env, env.begin(write=True) as txn:
            for i in range(64):
                txn.put(b"%d" % i, b"%d" % (i * i))
        total = sum(int(b.sum()) for b in DataLoader(Lookups(root), batch_size=8, num_workers=2,
                                                     worker_init_fn=open_env))
        assert total == sum(i * i for i in range(64)), total
        print("sum of squares", total)
    finally:
        shutil.rmtree(root)
