"""python -m torchtrace demo: a short tour on scikit-learn's bundled digits (8x8 images, nothing downloaded)."""
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.func import functional_call

import torchtrace as tt
from torchtrace import nn
from torchtrace.inspect.dot import DotNotFound


def load_digits(seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Digits as (N, 1, 8, 8) float tensors scaled to [0, 1]; a fixed 1500 / 297 train / test split."""
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1500], order[1500:]
    return images[train], labels[train], images[test], labels[test]


def small_cnn() -> nn.Sequential:
    """Two conv blocks and a linear classifier: 8x8 -> 4x4 -> 2x2 -> 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 2 * 2, 10),
    )


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with tt.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


def train(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, epochs: int, batch: int = 64,
          progress: Callable = lambda iterable, **kw: iterable) -> List[float]:
    """Adam on mini-batches; returns the mean loss of each epoch (a progress bar shows it as it goes)."""
    optimizer = tt.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    means = []
    for epoch in range(epochs):
        order = torch.randperm(len(labels), generator=generator)
        steps = progress(range(0, len(labels), batch), desc=f"epoch {epoch + 1}/{epochs}", leave=True)
        total, count = 0.0, 0
        for start in steps:
            index = order[start:start + batch]
            loss = F.cross_entropy(model(images[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(index), count + len(index)
            if hasattr(steps, "set_postfix_str"):  # the bar that stays for this epoch ends with its mean loss
                steps.set_postfix_str(f"loss {total / count:.4f}", refresh=False)
        means.append(total / count)
    return means


def check_against_torch(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> object:
    """tt.check: the same loss, once with torchtrace's gradients and once under torch autograd."""
    names = [name for name, _ in model.named_parameters()]
    plain = [p.detach().as_subclass(torch.Tensor) for p in model.parameters()]

    def loss_of(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, dict(zip(names, params)), (x,)), labels)

    return tt.check(loss_of, images, *plain, rtol=1e-4, atol=1e-6)


def run(epochs: int = 6, out_dir: Optional[str] = None) -> Dict[str, float]:
    """The tour; returns the numbers it printed (used by the tests). The graph's SVG (or, without Graphviz's `dot`,
    its DOT source) goes to `out_dir`, by default a new temporary folder: the tour leaves nothing where it runs."""
    from tqdm import tqdm

    torch.manual_seed(0)
    train_x, train_y, test_x, test_y = load_digits()
    model = small_cnn()
    print(f"1. A CNN built from torchtrace.nn layers (parameters are tracers):\n{model}\n")

    print("2. One forward and backward on a batch of 32 digits: the backprop trace, and the graph with its gradients:")
    with tt.recording():  # the drawing then labels every edge with the gradient that flowed along it
        loss = F.cross_entropy(model(train_x[:32]), train_y[:32])
        loss.backward(show=True)
    drawing = tt.draw(loss, params=model)
    path = os.path.join(out_dir or tempfile.mkdtemp(prefix="torchtrace-demo-"), "torchtrace-demo-graph")
    try:
        print(f"   graph drawn to {drawing.render(path, format='svg', cleanup=True)}")
    except DotNotFound as missing:
        print(f"   {missing}")
    print(f"\n3. Gradient flow after that backward:\n{tt.flow(model)}\n")

    print(f"4. Training {epochs} epochs with tt.optim.Adam:")
    start = time.perf_counter()
    train(model, train_x, train_y, epochs, progress=tqdm)
    seconds = time.perf_counter() - start
    test_accuracy = accuracy(model, test_x, test_y)
    print(f"   {seconds:.1f} s, test accuracy {test_accuracy:.1%}\n")

    report = check_against_torch(model, test_x[:64], test_y[:64])
    print(f"5. Gradients of the trained model checked against torch autograd:\n   {report}")
    return {"accuracy": test_accuracy, "seconds": seconds, "max_abs_diff": report.max_abs_diff}
