"""torch.utils.checkpoint on tracers: the block's activations are not kept; backward recomputes them.

forward runs the block once with recording on detached copies of its inputs, only to learn which leaf tracers
(parameters) it reads, and which plain tensors with torch's requires_grad (an unported torch module's parameters),
then drops that graph: the checkpoint node keeps the block's inputs and nothing inside.
backward re-runs the block (with the saved RNG and torch.autocast state) on fresh detached copies and
differentiates that small graph with tt.grad, for the inputs and the parameters alike, so parameter gradients flow
through the node's edges (hooks, tt.grad and create_graph behave as for any node). A block that reads a non-leaf
tracer it was not given as an argument (a closure) is recorded as usual, without recomputation: its gradient would
otherwise be counted twice (a second run, from the random state the first began with: its random draws are made
once, as torch's; other side effects of the block, a BatchNorm's running statistics, happen twice).
"""
import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, List

import torch
import torch.utils.checkpoint

from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.engine import grad as tt_grad
from torchtrace.autograd.function import Function
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE, observing
from torchtrace.errors import UnsupportedOperationError
from torchtrace.interop.detect import has_tracer
from torchtrace.nested import flatten
from torchtrace.tracer import tracer as TRACER

_ORIGINAL: Dict[str, Callable] = {}


class _Block:
    """What the checkpoint node needs to recompute: the function, its keyword arguments, the RNG state and the
    torch.autocast state it ran in (as torch's checkpoint: the recomputation casts as the forward did, wherever the
    backward runs)."""

    def __init__(self, function: Callable, kwargs: dict, n_args: int, rng: Any):
        self.function, self.kwargs, self.n_args, self.rng = function, kwargs, n_args, rng
        self.autocast = [(device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                         for device in _AUTOCAST_DEVICES]
        self.autocast_cache = torch.is_autocast_cache_enabled()
        self.outputs: List[torch.Tensor] = []
        self.others: Any = None
        self.places: List[int] = []


def _tensor_outputs(out: Any, block: _Block) -> List[Any]:
    """The tensors of the block's output (a tensor, or tuples / lists / dicts of them), in order; `block` keeps the
    rest of the structure (the tensors' places left empty) to rebuild it around the checkpoint's results."""
    if isinstance(out, torch.Tensor):
        block.others, block.places = None, [0]
        return [out]
    leaves, rebuild = flatten(out)
    block.places = [i for i, o in enumerate(leaves) if isinstance(o, torch.Tensor)]
    block.others = ([None if isinstance(o, torch.Tensor) else o for o in leaves], rebuild)
    return [leaves[i] for i in block.places]


_AUTOCAST_DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


@contextlib.contextmanager
def _autocast_as_in_forward(block: _Block) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for device, enabled, dtype in block.autocast:
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled,
                                               cache_enabled=block.autocast_cache))
        yield


@contextlib.contextmanager
def _rng(state: Any) -> Iterator[None]:
    if state is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


def _copies(args: tuple) -> list:
    with plain_torch():
        return [a.detach().as_subclass(TRACER).requires_grad_(a._tt_requires_grad)
                if isinstance(a, TRACER) else a for a in args]


def _aliases(args: tuple) -> list:
    """For create_graph: views of the inputs, so the gradient is captured there and second derivatives reach them."""
    return [a.view_as(a) if isinstance(a, TRACER) and a._tt_requires_grad else a for a in args]


def _check_second_order(inputs: tuple, leaves: tuple) -> None:
    """With create_graph the recomputed graph is tied to the inputs' history: a parameter the block reads that is
    also upstream of its inputs would get that upstream gradient twice. Refuse that case clearly."""
    wanted = {id(leaf) for leaf in leaves}
    stack = [a.grad_fn for a in inputs if isinstance(a, TRACER) and a.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if id(getattr(node, "variable", None)) in wanted:
            raise UnsupportedOperationError(
                "torch.utils.checkpoint: create_graph=True through a checkpointed block that reads a parameter "
                "also used before the block is not supported — run that block without checkpoint for double "
                "backward")
        stack.extend(nxt for nxt, _ in node.next_functions)


class Checkpoint(Function):
    """y = f(x; params) kept without f's activations -> backward recomputes f and differentiates it with tt.grad."""

    @staticmethod
    def forward(ctx: Any, block: Any, *inputs: Any) -> Any:
        block = block.value
        ctx.block = block
        arguments = inputs[:block.n_args]  # tensors are saved (their in-place changes caught); others kept as they are
        ctx.save_for_backward(*[a if isinstance(a, torch.Tensor) else None for a in arguments])
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in arguments]
        ctx.leaves = inputs[block.n_args:]
        outputs = block.outputs
        block.outputs = []
        return outputs[0] if len(outputs) == 1 and block.others is None else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        block = ctx.block
        inputs = [a if other is None else other for a, other in zip(ctx.saved_tensors, ctx.others)]
        create_graph = STATE.create_graph
        if create_graph:
            _check_second_order(inputs, ctx.leaves)
        with torch._C._EnableTorchFunction(), torch.enable_grad(), _rng(block.rng), _autocast_as_in_forward(block):
            copies = _aliases(inputs) if create_graph else _copies(inputs)
            outputs = _tensor_outputs(block.function(*copies, **block.kwargs), _Block(None, {}, 0, None))
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, TRACER) and o._tt_requires_grad]
        wanted = [c for c in copies if isinstance(c, TRACER) and c._tt_requires_grad] + list(ctx.leaves)
        found = iter(tt_grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True,
                             create_graph=create_graph) if pairs and wanted else [None] * len(wanted))
        input_grads = [next(found) if isinstance(c, TRACER) and c._tt_requires_grad else None for c in copies]
        return (None, *input_grads, *found)


def _torch_leaf(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, TRACER) and t.requires_grad and t.grad_fn is None


class _Opaque:
    def __init__(self, value: Any):
        self.value = value


def checkpoint(function: Callable, *args: Any, use_reentrant: Any = None, preserve_rng_state: bool = True,
               **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint for tracers (both flavours recompute); torch's for anything else."""
    for name in ("context_fn", "determinism_check", "debug", "early_stop"):
        kwargs.pop(name, None)
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    start = torch.get_rng_state()
    block = _Block(function, kwargs, len(args), start if preserve_rng_state else None)
    copies = _copies(args)
    recorded, read, me = set(), {}, threading.get_ident()

    def watch(node: Any, a: tuple, kw: dict, result: Any) -> None:
        if threading.get_ident() != me:  # another thread's ops
            return
        recorded.add(node)
        for t in list(a) + list(kw.values()) + [e for x in a if isinstance(x, (list, tuple)) for e in x]:
            if isinstance(t, TRACER) and t._tt_requires_grad or _torch_leaf(t):  # (a torch module's parameter too)
                read[id(t)] = t

    with observing(on_record=watch):
        out = function(*copies, **kwargs)
    own = {id(c) for c in copies}
    outside = [t for i, t in read.items() if i not in own and getattr(t, "_tt_node", None) not in recorded]
    if any(getattr(t, "_tt_node", None) is not None for t in outside):  # a closure reads a non-leaf tracer: keep
        torch.set_rng_state(start)  # the plain graph (of a second run from where the first began: its draws once)
        return function(*args, **kwargs)
    leaves = list({id(t): t for t in outside}.values())
    if not leaves and not any(isinstance(a, TRACER) and a._tt_requires_grad for a in args):
        return out
    tensors = _tensor_outputs(out, block)
    with plain_torch():
        block.outputs = [torch.Tensor.detach(t).as_subclass(torch.Tensor) for t in tensors]
    del out, tensors
    recorded.clear()
    read.clear()
    result = run_rule(TRACER, Checkpoint, None, (_Opaque(block), *args, *leaves), {})
    if block.others is None:
        return result
    (items, rebuild), linked = block.others, [result] if isinstance(result, torch.Tensor) else list(result)
    items = list(items)
    for i, t in zip(block.places, linked):
        items[i] = t
    return rebuild(items)


def _wrap(original: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(function: Callable, *args: Any, **kwargs: Any) -> Any:
        if has_tracer(args) or has_tracer(kwargs.values()) or _module_has_tracers(function):
            return checkpoint(function, *args, **kwargs)
        return original(function, *args, **kwargs)

    wrapper._torchtrace = True
    return wrapper


def _module_has_tracers(function: Any) -> bool:
    return isinstance(function, torch.nn.Module) and any(isinstance(p, TRACER) for p in function.parameters())


def install() -> None:
    """Route torch.utils.checkpoint.checkpoint (and so checkpoint_sequential) to `checkpoint` for tracers."""
    if not getattr(torch.utils.checkpoint.checkpoint, "_torchtrace", False):
        torch.utils.checkpoint.checkpoint = _wrap(torch.utils.checkpoint.checkpoint)
