"""What torch checks of a Function that it does not check of its own rules: forward returns something, backward
returns one gradient per argument of apply."""
from typing import Any


def returned_outputs(rule: type, out: Any) -> Any:
    """What Function.apply returns: forward's output, which must be a tensor or a tuple (None is a mistake)."""
    if out is None:
        raise RuntimeError(f"{rule.__name__}.forward returned None: return the output tensor (or a tuple of "
                           "tensors) from forward, e.g. `return x * 2`")
    return out


def checked_gradient_count(node: Any, result: tuple) -> tuple:
    """One gradient per argument of a user's Function.apply (and of a torch autograd Function's), as torch requires
    (extra trailing Nones are dropped)."""
    rule = node.rule
    if rule.__module__.startswith("torchtrace.") and not getattr(rule, "user_backward", None):
        return result  # torchtrace's own rules may leave out the trailing None gradients of their options
    expected = node.ctx._n_inputs
    if len(result) == expected or (len(result) > expected and all(g is None for g in result[expected:])):
        return result[:expected]
    hidden = getattr(node.rule, "hidden_arguments", 0)  # a bridge's own leading argument, not the user's
    raise RuntimeError(f"function {node.name} returned an incorrect number of gradients (expected "
                       f"{expected - hidden}, got {len(result) - hidden})")
