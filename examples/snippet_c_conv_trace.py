"""Snippet C of the original torchtrace README: an original-style Model with construct(), printed, and the
backprop trace of its output (`out.backward(show=True)`).

The trace lists the nodes in the order gradients flow, from the loss back to the input. A Conv2d line shows
the shape of the gradient it receives and the shape of the gradient it passes on:
(3, 2, 7, 7) -> (3, 4, 9, 9) is the gradient with respect to the conv's output and input.

    python examples/snippet_c_conv_trace.py
"""
import argparse
from typing import Optional, Sequence, Tuple

import torch

from torchtrace.nn import Conv2d, Linear, Model, ReLU, Sequential


class myConv(Model):  # noqa: N801  (the original's name)
    def __init__(self):
        self.conv = Sequential(
            Conv2d(3, 8, kernel_size=8, stride=4), ReLU(),
            Conv2d(8, 4, kernel_size=4, stride=2), ReLU(),
            Conv2d(4, 2, kernel_size=3, stride=1), ReLU(),
        )
        self.fc = Linear(7 * 7 * 2, 1)
        super(myConv, self).__init__()  # original-style: attributes may be assigned before this call

    def construct(self):
        ops = [self.conv, self.fc]  # the ordered layers: what print(model) lists
        return ops

    def forward(self, x):
        x = self.conv(x)
        x = x.View(x.shape[0], -1)
        return self.fc(x)


def main(argv: Optional[Sequence[str]] = None) -> Tuple[myConv, torch.Tensor]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="accepted for uniformity: this snippet is small")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    model_trace = myConv()
    print(model_trace)
    for para in model_trace.parameters():
        para.data.fill_(0.001)
    x = torch.rand(3, 3, 84, 84).float()
    out = model_trace(x).Sum()
    out.backward(show=True)
    return model_trace, out


if __name__ == "__main__":
    main()
