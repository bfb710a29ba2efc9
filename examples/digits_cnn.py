"""A LeNet-style CNN on scikit-learn's digits, trained twice from the same seed: by torchtrace and by torch autograd.

The data set ships with scikit-learn (1797 grey-scale 8x8 images of the digits 0-9; nothing is downloaded).
The model is written once, as a function of an `nn` namespace: `lenet(torch.nn)` is the reference,
`lenet(tt.nn)` the same network whose parameters are tracers, so every gradient comes from torchtrace's
hand-written rules. Both start from the same initial weights (same seed), see the same batches in the same
order and use the same optimizer update, so their per-epoch losses agree to float32 rounding.

    python examples/digits_cnn.py             # 15 epochs: ~98% test accuracy, the two loss curves, the time ratio
    python examples/digits_cnn.py --smoke     # 3 epochs (what CI runs)
"""
import argparse
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import torchtrace as tt

Data = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_data(limit: Optional[int] = None) -> Data:
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1], shape (N, 1, 8, 8); a stratified 75/25 split."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    if limit is not None:
        x_train, y_train = x_train[:limit], y_train[:limit]

    def images(a: Any) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32).unsqueeze(1) / 16.0

    return images(x_train), torch.tensor(y_train), images(x_test), torch.tensor(y_test)


def lenet(nn: Any) -> torch.nn.Module:
    """conv 3x3 -> ReLU -> max-pool -> conv 3x3 -> ReLU -> max-pool -> two linear layers.

    `nn` is torch.nn or tt.nn: the same code builds both twins (and draws the same weights from the seed).
    Shapes: (N, 1, 8, 8) -> (N, 16, 4, 4) -> (N, 32, 2, 2) -> (N, 128) -> (N, 64) -> (N, 10).
    """
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def train(model: torch.nn.Module, optimizer: Any, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor,
          epochs: int, batch_size: int, seed: int, label: str, progress: bool = True) -> Tuple[List[float], float]:
    """Mini-batch training; returns (mean training loss of each epoch, seconds spent)."""
    order = torch.Generator().manual_seed(seed)  # both twins see the same batches in the same order
    losses = []
    start = time.perf_counter()
    for epoch in range(epochs):
        permutation = torch.randperm(len(x), generator=order)
        batches = range(0, len(x), batch_size)
        bar = tqdm(batches, desc=f"{label:>10} epoch {epoch + 1}/{epochs}", disable=not progress, leave=False)
        total = 0.0
        for first in bar:
            index = permutation[first:first + batch_size]
            loss = loss_fn(model(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(index)
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        losses.append(total / len(x))
    return losses, time.perf_counter() - start


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():  # torchtrace stops recording under torch.no_grad() too
        return (model(x).argmax(dim=1) == y).float().mean().item()


def run(nn: Any, optim: Any, data: Data, epochs: int, batch_size: int, lr: float, seed: int, label: str,
        progress: bool) -> Dict[str, Any]:
    """Build lenet(nn) from `seed`, train it with optim.Adam, and measure it."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(seed)
    model = lenet(nn)
    optimizer = optim.Adam(model.parameters(), lr=lr)
    losses, seconds = train(model, optimizer, nn.CrossEntropyLoss(), x_train, y_train, epochs, batch_size, seed,
                            label, progress)
    return {"model": model, "losses": losses, "seconds": seconds, "test_accuracy": accuracy(model, x_test, y_test)}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks run fastest on one)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first LIMIT training images")
    parser.add_argument("--smoke", action="store_true", help="3 epochs (for CI)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(epochs=3)
        args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    data = load_data(args.limit)
    print(f"digits: {len(data[0])} training and {len(data[2])} test images of 8x8 pixels, 10 classes")
    settings = dict(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    progress=not args.no_progress)
    ours = run(tt.nn, tt.optim, data, label="torchtrace", **settings)
    print(ours["model"])
    reference = run(torch.nn, torch.optim, data, label="torch", **settings)

    print(f"{'epoch':>5} {'torchtrace loss':>16} {'torch loss':>12} {'|difference|':>13}")
    differences = [abs(a - b) for a, b in zip(ours["losses"], reference["losses"])]
    for epoch, (a, b, d) in enumerate(zip(ours["losses"], reference["losses"], differences), 1):
        print(f"{epoch:>5} {a:>16.6f} {b:>12.6f} {d:>13.2e}")
    ratio = ours["seconds"] / reference["seconds"]
    print(f"test accuracy: torchtrace {ours['test_accuracy']:.2%}, torch {reference['test_accuracy']:.2%}")
    print(f"largest per-epoch loss difference: {max(differences):.2e}")
    print(f"training time: torchtrace {ours['seconds']:.2f} s, torch {reference['seconds']:.2f} s "
          f"(ratio {ratio:.2f}x)")
    return {
        "losses": ours["losses"],
        "torch_losses": reference["losses"],
        "max_loss_difference": max(differences),
        "test_accuracy": ours["test_accuracy"],
        "torch_test_accuracy": reference["test_accuracy"],
        "seconds": ours["seconds"],
        "torch_seconds": reference["seconds"],
        "time_ratio": ratio,
    }


if __name__ == "__main__":
    main()
