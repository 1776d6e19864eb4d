# The article's "production-grade" recipe, re-typed; comments translated, the one change marked "# lab:"
import logging
import os
import signal

import numpy as np
import torch
import torch.multiprocessing as mp
from PIL import Image
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
logger = logging.getLogger(__name__)


class ProductionDataset(Dataset):
    """Production-grade Dataset: full error handling, lazy loading and resource management."""
    def __init__(self, data_list, transform=None, cache_mode="no_cache"):
        self.transform, self.cache_mode = transform, cache_mode  # "no_cache", "memory" or "disk"
        self._cache = {}  # in-memory cache
        self.data_list = [f for f in data_list if os.path.exists(f)]  # keep the files that exist
        logger.info(f"Dataset ready, {len(self.data_list)} samples")

    def __len__(self):
        return len(self.data_list)

    def __getitem__(self, idx):
        if self.cache_mode == "memory" and idx in self._cache:
            return self._cache[idx]
        try:
            data = self._load_data(idx)
            if self.transform:
                data = self.transform(data)
            if self.cache_mode == "memory":
                self._cache[idx] = data
            return data
        except Exception as e:
            logger.error(f"failed to load sample {idx}: {e}")
            return torch.zeros(3, 224, 224)  # a zero tensor instead

    def _load_data(self, idx):
        file_path = self.data_list[idx]
        if file_path.endswith(".npy"):
            return torch.from_numpy(np.load(file_path)).float()
        elif file_path.endswith((".png", ".jpg", ".jpeg")):
            arr = np.array(Image.open(file_path).convert("RGB"), dtype=np.float32) / 255.0
            return torch.from_numpy(arr).permute(2, 0, 1)
        elif file_path.endswith(".pt"):
            return torch.load(file_path, map_location="cpu")
        raise ValueError(f"unsupported file type: {file_path}")


class WorkerInit:
    """Worker initialisation, called in every worker process when it starts."""

    @staticmethod
    def init_worker(worker_id):
        worker_seed = torch.initial_seed() % 2**32  # a different seed in every worker
        np.random.seed(worker_seed)

        def handler(signum, frame):  # signal handling: exit gracefully
            logger.info(f"worker {worker_id} got signal {signum}, exiting...")
            exit(0)

        signal.signal(signal.SIGTERM, handler)
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # ignore SIGPIPE
        except AttributeError:
            pass  # Windows has no SIGPIPE
        logger.info(f"worker {worker_id} initialised, seed {worker_seed}")


def create_production_dataloader(dataset, batch_size=32, num_workers=4, shuffle=True, pin_memory=True,
                                 drop_last=False):
    """A production-grade DataLoader."""
    try:
        torch.multiprocessing.set_sharing_strategy("file_system")
    except RuntimeError:
        pass  # may be set already
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle=shuffle,
        pin_memory=pin_memory,
        drop_last=drop_last,
        persistent_workers=True if num_workers > 0 else False,  # keep workers between epochs
        prefetch_factor=4 if num_workers > 0 else None,
        worker_init_fn=WorkerInit.init_worker,
        timeout=60 if num_workers > 0 else 0,  # seconds
    )


def safe_train_loop(dataloader, model, optimizer, criterion, device, epochs=10):
    """A training loop that recovers from DataLoader errors."""
    model = model.to(device)
    for epoch in range(epochs):
        logger.info(f"Epoch {epoch + 1}/{epochs}")
        data_iter, batch_idx, consecutive_errors, max_consecutive_errors = iter(dataloader), 0, 0, 5
        while batch_idx < len(dataloader):
            try:
                batch = next(data_iter)
                if batch is None:
                    logger.warning(f"batch {batch_idx} is None, skipped")
                    batch_idx += 1
                    continue
                data, target = batch
                data, target = data.to(device), target.to(device)
                optimizer.zero_grad()
                loss = criterion(model(data), target)
                loss.backward()
                optimizer.step()
                if batch_idx % 100 == 0:
                    logger.info(f"  batch {batch_idx}/{len(dataloader)}, loss: {loss.item():.4f}")
                consecutive_errors = 0
                batch_idx += 1
            except StopIteration:
                break
            except RuntimeError as e:
                if "exited unexpectedly" in str(e):
                    consecutive_errors += 1
                    logger.error(f"worker crashed ({consecutive_errors} in a row): {e}")
                    if consecutive_errors >= max_consecutive_errors:
                        logger.error("too many errors in a row, retrying with fewer workers")
                        dataloader = DataLoader(dataloader.dataset, batch_size=dataloader.batch_size,
                                                num_workers=0, shuffle=True)  # fall back to one process
                        data_iter, consecutive_errors = iter(dataloader), 0
                    continue
                raise e
        logger.info(f"Epoch {epoch + 1} done")


if __name__ == "__main__":
    try:
        mp.set_start_method("spawn", force=True)
    except RuntimeError:
        pass
    import sys  # lab: a data_gen folder of (3, 224, 224) float32 samples
    from pathlib import Path

    file_list = sorted(str(p) for p in Path(sys.argv[1]).glob("*.npy"))
    dataset = ProductionDataset(file_list)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 224 * 224, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class LabeledDataset(Dataset):  # simulated labels; the article defines this class here
        def __init__(self, base_dataset, num_classes=10):
            self.base, self.num_classes = base_dataset, num_classes

        def __len__(self):
            return len(self.base)

        def __getitem__(self, idx):
            return self.base[idx], idx % self.num_classes

    labeled_dataloader = create_production_dataloader(LabeledDataset(dataset), batch_size=16, num_workers=4)
    safe_train_loop(labeled_dataloader, model, optimizer, criterion, device, epochs=3)
    logger.info("training finished")
