"""A small CNN on 28x28 images whose classifier was sized for 32x32 inputs."""

import torch
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self, n=96):
        self.images = torch.rand(n, 1, 28, 28)
        self.labels = torch.randint(0, 10, (n,))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        return self.fc(x.flatten(1))


def main():
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters())
    loader = DataLoader(Digits(), batch_size=16, num_workers=2, persistent_workers=True)
    for _epoch in range(2):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
