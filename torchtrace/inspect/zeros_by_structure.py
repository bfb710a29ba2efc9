"""Gradients that are zero by construction, decided from a model's modules (no graph needed: after an ordinary
backward the graph is freed, and tt.flow(model) still tells them from vanishing ones).

Two structures make a parameter's gradient exactly 0 in exact arithmetic, whatever the data:
- a bias right before a batch (or instance) normalisation of the same channels: the normalisation subtracts
  each channel's mean, which takes away any constant added per channel;
- the bias b of an attention's key projection: score_ij = q_i . (k_j + b) = q_i . k_j + q_i . b adds the
  same number q_i . b to every score of row i, and softmax over j is unchanged by a constant per row.
What the backward computes for such a parameter is rounding (|g| around 1e-7 of its weight's), confirmed
numerically before a flag is set. It matters for Adam: its step is m / (sqrt(v) + eps), a ratio that does not
depend on the gradient's size, so a rounding-noise gradient of 1e-9 moves the parameter as far per step as a
real one (about lr): the bias drifts by noise, and two runs that round differently drift apart.
"""
from typing import Dict, Iterator, Tuple

from torch import nn

from torchtrace.inspect.construction import looks_zero

LAYERS = (nn.Linear, nn.modules.conv._ConvNd)
NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
KEY_NAMES = ("key", "k_proj", "k", "to_k", "wk", "key_proj", "k_lin")
QUERY_NAMES = ("query", "q_proj", "q", "to_q", "wq", "query_proj", "q_lin")
ADAM_NOTE = ("Adam's step m / (sqrt(v) + eps) does not shrink with the gradient, so it turns this rounding noise into "
             "full-size steps")
BIAS_ADVICE = "nothing is wrong with training; drop the bias (bias=False), or exclude it from the optimizer"


def _width(layer: nn.Module) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def _pairs(model: nn.Module) -> Iterator[Tuple[str, nn.Module, str, nn.Module, str]]:
    """(path of a parent, child, child's name, next child, next child's name) for consecutive children."""
    for path, parent in model.named_modules():
        children = list(parent.named_children())
        for (name, child), (next_name, following) in zip(children, children[1:]):
            yield path, child, name, following, next_name


def by_structure(model: nn.Module) -> Dict[int, Tuple[str, str, nn.Parameter]]:
    """id(bias) -> (its name, why its gradient is 0 by construction, the layer's weight that sets the scale)."""
    found: Dict[int, Tuple[str, str, nn.Parameter]] = {}
    prefix = lambda path, name: f"{path}.{name}" if path else name  # noqa: E731
    for path, layer, name, norm, norm_name in _pairs(model):
        if isinstance(layer, LAYERS) and isinstance(norm, NORMS) and getattr(layer, "bias", None) is not None \
                and norm.num_features == _width(layer):
            found[id(layer.bias)] = (prefix(path, name) + ".bias", f"it is a bias added right before "
                                     f"{prefix(path, norm_name)} ({type(norm).__name__}), which subtracts each "
                                     "channel's mean and so removes any constant per channel: the loss does not depend "
                                     "on it", layer.weight)
    for path, parent in model.named_modules():
        children = dict(parent.named_children())
        key = next((children[n] for n in KEY_NAMES if n in children), None)
        if isinstance(key, nn.Linear) and key.bias is not None and any(n in children for n in QUERY_NAMES):
            name = prefix(path, next(n for n in KEY_NAMES if n in children))
            found[id(key.bias)] = (name + ".bias", "it is the bias of an attention's key projection: it adds q_i . b "
                                   "to every score of row i, and softmax is unchanged by a constant per row, so the "
                                   f"loss does not depend on it ({ADAM_NOTE})", key.weight)
    return found


def zero_by_structure(model: nn.Module) -> Dict[int, Tuple[str, str]]:
    """After a backward: id(parameter) -> (name, why) for the biases of `model` that are zero by construction and
    whose `.grad` is rounding-sized next to their layer's weight's."""
    grads = {id(p): p.grad for p in model.parameters()}
    return {key: (name, why) for key, (name, why, weight) in by_structure(model).items()
            if grads.get(key) is not None and looks_zero(grads[key], weight.grad)}
