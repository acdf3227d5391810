"""A torch-style training loop: ``for batch in loader`` with two worker processes.

Trains a logistic regression written in numpy on a synthetic two-class problem, exactly as one
would write the loop for torch's ``DataLoader``: the batches are numpy arrays, fetched by two
worker processes while the model computes. If torch is installed, the same loader then feeds a
torch model (``torch.from_numpy`` shares the batch's memory, no copy).

Run: ``python examples/classic_script.py [--quick] [--no-torch]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np

from aioload import ArrayDataset, DataLoader, random_split

FEATURES = 20


def make_data(n: int) -> ArrayDataset:
    """Two Gaussian blobs, labels 0 and 1, overlapping a little."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, n)
    centres = np.where(labels[:, None] == 1, 0.15, -0.15)
    features = (centres + rng.standard_normal((n, FEATURES))).astype(np.float32)
    return ArrayDataset(features, labels.astype(np.float32))


class LogisticRegression:
    """``p(y=1 | x) = sigmoid(x @ w + b)``, trained by plain gradient descent."""

    def __init__(self, features: int, lr: float = 0.5) -> None:
        self.w = np.zeros(features, np.float32)
        self.b = 0.0
        self.lr = lr

    def predict(self, x: np.ndarray) -> np.ndarray:
        probability: np.ndarray = 1.0 / (1.0 + np.exp(-(x @ self.w + self.b)))
        return probability

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One gradient step on a batch; returns the batch's log loss before the step."""
        p = self.predict(x)
        loss = -np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7))
        error = p - y
        self.w -= self.lr * (x.T @ error) / len(y)
        self.b -= self.lr * float(error.mean())
        return float(loss)


def accuracy(predict: object, loader: DataLoader) -> float:
    right = total = 0
    for x, y in loader:
        right += int(((predict(x) > 0.5) == (y > 0.5)).sum())  # type: ignore[operator]
        total += len(y)
    return right / total


def train_numpy(train: DataLoader, test: DataLoader, epochs: int) -> None:
    model = LogisticRegression(FEATURES)
    for epoch in range(epochs):
        start = time.perf_counter()
        losses = [model.step(x, y) for x, y in train]  # the classic loop
        seconds = time.perf_counter() - start
        print(
            f"numpy model, epoch {epoch}: loss {np.mean(losses):.3f}, "
            f"test accuracy {accuracy(model.predict, test):.1%} ({seconds:.2f} s)"
        )


def train_torch(train: DataLoader, test: DataLoader, epochs: int) -> None:
    # Imported here, not at the top: worker processes re-import this script (as under
    # "spawn"), and a top-level torch import would cost every worker its import time.
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(model(torch.from_numpy(x))).squeeze(1).numpy()

    for epoch in range(epochs):
        losses = []
        for x, y in train:
            optimiser.zero_grad()
            loss = loss_fn(model(torch.from_numpy(x)).squeeze(1), torch.from_numpy(y))
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        print(
            f"torch model, epoch {epoch}: loss {np.mean(losses):.3f}, "
            f"test accuracy {accuracy(predict, test):.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and epochs")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch model")
    args = parser.parse_args()
    samples, epochs = (4_000, 2) if args.quick else (20_000, 3)

    train_set, test_set = random_split(make_data(samples), [0.8, 0.2], generator=0)
    # The arguments are torch's; persistent_workers keeps the two workers across epochs.
    train = DataLoader(
        train_set, batch_size=64, shuffle=True, generator=0, num_workers=2, persistent_workers=True
    )
    test = DataLoader(test_set, batch_size=256)
    with train:  # stops the persistent workers at the end
        train_numpy(train, test, epochs)
        if args.no_torch:
            return
        if importlib.util.find_spec("torch") is None:
            print("torch model: skipped (torch is not installed)")
        else:
            train_torch(train, test, epochs)


if __name__ == "__main__":
    main()
