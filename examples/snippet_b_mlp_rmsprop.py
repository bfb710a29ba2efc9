"""Snippet B of the original torchtrace README: an 8-256-128-64-4 ReLU MLP trained 10 steps with RMSprop.

As in a DQN update, the network outputs one value per action; `out.Gather(action)` picks, for every row i,
out[i, action[i]] (shape (16, 1)), and the MSE between those values and a target is minimised. The gradient
flows back only into the picked entries. (The original README had a typo, `mse(loss, target)`; it is
`mse(out, target)`.)

    python examples/snippet_b_mlp_rmsprop.py
"""
import argparse
from typing import List, Optional, Sequence

import torch

import torchtrace.nn as nn
import torchtrace.optim as optim
from torchtrace.nn import Linear, ReLU


def main(argv: Optional[Sequence[str]] = None) -> List[float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="accepted for uniformity: this snippet is small")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    model = nn.Sequential(
        Linear(8, 256),
        ReLU(),
        Linear(256, 128),
        ReLU(),
        Linear(128, 64),
        ReLU(),
        Linear(64, 4),
    )
    print(model)
    optimizer = optim.RMSprop(model.parameters(), lr=5e-4)
    mse = nn.MSE()

    x = torch.rand(16, 8).float()
    target = torch.rand(16, 1)

    losses = []
    for _ in range(args.steps):
        out = model(x)
        _, action = out.max(1)  # the greedy action of every row (integer indices: not recorded)
        out = out.Gather(action)  # out[i, action[i]], shape (16, 1)
        loss = mse(out, target)
        print(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main()
