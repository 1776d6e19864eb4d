"""Tokenise sentences with a vocabulary that a background thread downloads while training starts.

The loader gives up on a batch that takes longer than 2 s.
"""

import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

WORDS = "the a cat dog sat ran on under mat tree".split()
VOCAB = {}
VOCAB_LOCK = threading.Lock()


def load_vocabulary(started):
    with VOCAB_LOCK:
        started.set()
        time.sleep(1)  # a slow download
        VOCAB.update({w: i for i, w in enumerate(WORDS)})


class Sentences(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        sentence = [WORDS[(i + k) % len(WORDS)] for k in range(5)]
        with VOCAB_LOCK:
            return torch.tensor([VOCAB.get(w, 0) for w in sentence])


# A lock held by a thread at fork time is a fork-only trap: forkserver and spawn workers start from a
# clean process and never inherit it, so the loader pins fork (the lesson of this script).
if __name__ == "__main__":
    started = threading.Event()
    threading.Thread(target=load_vocabulary, args=(started,), daemon=True).start()
    started.wait()
    for batch in DataLoader(Sentences(), batch_size=8, num_workers=1, timeout=2,
                            multiprocessing_context="fork"):
        print("batch", tuple(batch.shape))
