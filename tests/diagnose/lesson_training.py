"""The training loop of the lesson "Debugging gradients" (its `train`), for the tests of its learning-rate checker."""
from typing import List, Tuple

import torch
import torch.nn.functional as F

import torchtrace as tt


def train_watched(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
                  steps: int) -> Tuple[object, List[float]]:
    """`steps` SGD steps of model's cross entropy on (x, y) under tt.diagnose.training: (the doctor, the losses)."""
    optimizer = tt.optim.SGD(model.parameters(), lr=lr)
    losses = []
    with tt.diagnose.training(model, optimizer) as doctor:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return doctor, losses
