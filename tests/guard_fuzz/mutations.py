"""Changes made between calls of a fuzzer program, each applied to both copies alike.

Each mutation takes (compiled-side program, eager-side program, rng, call inputs) and returns the inputs of
the next call (most leave them as they are).
"""
import random
from typing import Callable, Dict

import torch

import torchtrace as tt

from .programs import CONFIG, SHIFT, Program


def _both(fn: Callable[[Program], None]) -> Callable:
    def apply(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
        fn(a)
        fn(b)
        return x
    return apply


def _replace_parameter(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    layer = rng.choice(["first", "second"])
    new = torch.randn_like(getattr(a, layer).weight.detach().as_subclass(torch.Tensor))
    for m in (a, b):
        getattr(m, layer).weight = tt.nn.Parameter(tt.as_tracer(new.clone()))
    return x


def _update_parameter(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    delta = rng.uniform(-0.5, 0.5)
    for m in (a, b):
        with torch.no_grad():
            m.first.bias.as_subclass(torch.Tensor).add_(delta)  # as an optimizer step would
    return x


def _set(name: str, choose: Callable[[random.Random, Program], object]) -> Callable:
    def apply(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
        value = choose(rng, a)
        setattr(a, name, value)
        setattr(b, name, value)
        return x
    return apply


def _dropout_p(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    p = rng.choice([0.0, 0.2, 0.5])
    for m in (a, b):
        if isinstance(m.drop, torch.nn.Dropout):
            m.drop.p = p
    return x


def _hook(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    for m in (a, b):
        hooks = m.first._forward_hooks
        if hooks:
            hooks.clear()
        else:
            m.first.register_forward_hook(lambda module, inputs, out: out * 0.5)
    return x


def _activation(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    kind = rng.choice([tt.nn.Tanh, tt.nn.ReLU, tt.nn.Sigmoid])
    a.activation, b.activation = kind(), kind()
    return x


def _like(x: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """`data` as a leaf that requires grad if x did."""
    return tt.as_tracer(data, requires_grad=True) if getattr(x, "requires_grad", False) else data


def _dtype(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    dtype = torch.float32 if x.dtype == torch.float64 else torch.float64
    for m in (a, b):
        m.to(dtype)
    return _like(x, x.detach().as_subclass(torch.Tensor).to(dtype))


def _closure(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    value = rng.choice([0.25, 1.0, -2.0])
    a.closure_value(value)
    b.closure_value(value)
    return x


def _global(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    SHIFT["value"] = rng.choice([0.5, -3.0, 0.0])
    return x


def _data(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    new = torch.randn_like(a.second.weight.detach().as_subclass(torch.Tensor))
    for m in (a, b):
        m.second.weight.data = new.clone()
    return x


def _anomaly(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    torch.set_anomaly_enabled(not torch.is_anomaly_enabled())
    return x


def _class_attribute(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    Program.factor = rng.choice([1.0, -0.5, 2.0])
    return x


def _config(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    CONFIG.SCALE = rng.choice([1.0, -2.0, 0.25])
    return x


def _slice(a: Program, b: Program, rng: random.Random, x: torch.Tensor) -> torch.Tensor:
    end = rng.randint(1, x.shape[1])
    columns = slice(rng.randint(0, end - 1), end)
    a.columns, b.columns = columns, columns
    return x


MUTATIONS: Dict[str, Callable] = {
    "weight.data assigned": _data,
    "anomaly mode toggled": _anomaly,
    "class attribute (property)": _class_attribute,
    "config object": _config,
    "slice": _slice,
    "replace parameter": _replace_parameter,
    "update parameter in place": _update_parameter,
    "attribute scale": _set("scale", lambda rng, m: rng.choice([1.0, 2.0, -1.5, 0.5])),
    "attribute flip (branch)": _set("flip", lambda rng, m: not m.flip),
    "train/eval": lambda a, b, rng, x: (a.train(not a.training), b.train(not b.training), x)[-1],
    "dropout p": _dropout_p,
    "hook added/removed": _hook,
    "tensor hook inside": _set("watch", lambda rng, m: not m.watch),
    "submodule swapped": _activation,
    "dtype": _dtype,
    "closure cell": _closure,
    "global": _global,
    "branch data flipped": lambda a, b, rng, x: _like(x, -x.detach().as_subclass(torch.Tensor)),
    "shape": lambda a, b, rng, x: _like(x, torch.randn(rng.choice([3, 4, 6]), x.shape[1], dtype=x.dtype)),
    "requires_grad": lambda a, b, rng, x: (tt.as_tracer(x.detach().as_subclass(torch.Tensor), requires_grad=True)
                                           if not getattr(x, "requires_grad", False) else
                                           x.detach().as_subclass(torch.Tensor)),
    "nothing": lambda a, b, rng, x: x,
}
