"""Random programs for the replay fuzzer: a small model whose forward reads Python state in every way we know.

A program is a module (linear layers, an activation, optional dropout and batch norm, three unnamed heads in a
list) whose forward reads its own plain attributes (`scale`, `flip`), a class attribute through a property that
reads a global, a config object, a closure cell, a generator, a mutable default argument, torch's anomaly flag and
a slice, fills a log list and prints, applies one of `floats.FLOAT_OPS` (floats drawn anew on each call that reach
a rule's backward, `.T`, `Function.apply`), and takes a branch on a value read from tensor data through one of several
APIs (after a dropout draw: a divergence mid-call); it may hook a value it reads again. Two copies are built from
one seed: one is called compiled, the other eagerly, and every mutation is applied to both.
"""
import itertools
import random
import types
from typing import Callable, List, Tuple

import torch

import torchtrace as tt

from .floats import FLOAT_OPS

SHIFT = {"value": 0.5}  # a global the programs read (mutations change it)
CONFIG = types.SimpleNamespace(SCALE=1.0)  # a config object (mutations change it)
_READS: List[Callable[[torch.Tensor], bool]] = [
    lambda h: bool(h.sum() > 0),
    lambda h: h.sum().item() > 0,
    lambda h: torch.equal(h > 0, torch.ones_like(h, dtype=torch.bool)),
    lambda h: torch.allclose(h.abs(), h),
    lambda h: float(h.mean()) > 0,
    lambda h: "True" in repr(h.sum() > 0),
    lambda h: len(torch.where(h > 0)[0]) > h.numel() // 2,
    lambda h: h.max().tolist() > 0,
]
READ_NAMES = ["bool", "item", "torch.equal", "allclose", "float", "repr", "len(where)", "tolist"]


class Program(tt.nn.Module):
    """features -> hidden -> branch on a read -> hidden -> 1, with attributes, a global and a closure."""

    factor = 1.0  # a class attribute (mutations change it on the class)

    @property
    def gain(self) -> float:  # a property reading the class attribute and a global
        return self.factor * (1.0 + SHIFT["value"])

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.first = tt.nn.Linear(width, width)
        self.second = tt.nn.Linear(width, 1)
        self.activation = rng.choice([tt.nn.Tanh(), tt.nn.ReLU(), tt.nn.Sigmoid()])
        self.drop = tt.nn.Dropout(rng.choice([0.0, 0.3])) if rng.random() < 0.5 else tt.nn.Identity()
        self.norm = tt.port(torch.nn.BatchNorm1d(width)) if rng.random() < 0.4 else tt.nn.Identity()
        self.scale = rng.choice([1.0, 2.0, -1.5])
        self.flip = rng.random() < 0.5
        self.read = rng.randrange(len(_READS))
        self.closure_value, self.closure = _cell(rng.choice([0.25, 1.0]))
        self.holder = torch.nn.ModuleList([tt.nn.Linear(width, 1) for _ in range(3)])  # registers the parameters
        self.heads = list(self.holder)  # same class, called from a plain list
        self.counter = itertools.count(1)  # a generator the forward steps
        self.columns = slice(0, width)
        self.log: List[float] = []
        self.watch = rng.random() < 0.3  # a tensor hook and retain_grad on a value read again inside
        self.float_op = rng.randrange(len(FLOAT_OPS))  # floats drawn anew on each call reach a rule's backward
        self.floats = random.Random(rng.random())

    def forward(self, x: torch.Tensor, seen: list = []) -> torch.Tensor:  # noqa: B006 (a default list, on purpose)
        seen.append(1)
        h = self.activation(self.norm(self.first(x))) * self.scale + SHIFT["value"] * self.closure()
        h = (-h if self.flip else h) * self.gain * CONFIG.SCALE + next(self.counter) % 3 * 0.1
        h = FLOAT_OPS[self.float_op](h, self.floats)
        if self.watch and h.requires_grad:
            h.register_hook(lambda g: g * 0.5)  # changes what flows on: every parameter before it sees it
            h.retain_grad()
        if torch.is_anomaly_enabled():
            h = h * 0.5
        h = self.drop(h)  # a random draw before the branch: a divergence mid-call draws once, as eager
        if _READS[self.read](h):
            h = h * 2 + h[:, self.columns].sum(dim=1, keepdim=True)
        else:
            h = h.tanh().exp() - 1  # bounded: a diverging step would amplify rounding into the comparison
        out = self.second(h) + sum(head(h) for head in self.heads) * 0.1
        self.log.append(float(out.sum()))
        print(len(self.log))
        return out


def _cell(value: float) -> Tuple[Callable[[float], None], Callable[[], float]]:
    """A closure cell and its setter: the program reads it through a function's closure."""
    def get() -> float:
        return value

    def set_value(new: float) -> None:
        nonlocal value
        value = new

    return set_value, get


def build(seed: int) -> Tuple[Program, Program, int]:
    """Two identical programs (same weights, same choices) and their width."""
    rng = random.Random(seed)
    width = rng.choice([2, 3, 5])
    torch.manual_seed(seed)
    a = Program(random.Random(seed + 1), width).double()
    b = Program(random.Random(seed + 1), width).double()
    b.load_state_dict(a.state_dict())
    return a, b, width
