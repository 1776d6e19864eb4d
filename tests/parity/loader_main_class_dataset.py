# parity: torch race timeout=60
# A Dataset class defined in the script, under every start method (spawn workers import it as __mp_main__).
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor(i * i)


if __name__ == "__main__":
    print(sorted(int(x) for b in DataLoader(Squares(), batch_size=2, num_workers=2) for x in b))
