"""Snippet A of the original torchtrace README: a tracer, its sum, and the gradient of the sum.

    python examples/snippet_a_tracer_sum.py
    # tensor([1., 1., 1., 1.])

b = a_1 + a_2 + a_3 + a_4, so db/da_i = 1 for every i: the gradient is a vector of ones.
"""
import argparse
from typing import Optional, Sequence

import torch

import torchtrace


def main(argv: Optional[Sequence[str]] = None) -> torch.Tensor:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="accepted for uniformity: this snippet is tiny")
    parser.parse_args(argv)

    a = torchtrace.tracer([1, 2, 3, 4])  # a list of ints gives float32, like the legacy torch.Tensor([...])
    a.requires_grad_()
    b = a.Sum()  # the original's alias of a.sum(), recorded as a Sum node
    b.backward()
    print(a.grad)
    return a.grad


if __name__ == "__main__":
    main()
