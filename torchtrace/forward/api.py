"""tt.jvp and tt.jacobian: Jacobian-vector products in one forward pass, and whole Jacobians in either mode."""
import contextlib
import warnings
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple, Union

import torch

from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.engine import grad
from torchtrace.autograd.inplace import catch_up
from torchtrace.autograd.node import _next_sequence_nr as next_sequence_nr
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.errors import UnsupportedOperationError
from torchtrace.factories import as_tracer
from torchtrace.forward.constant_results import constant_results, reads_a_gradient
from torchtrace.forward.dual import TRANSPOSED, DualPass
from torchtrace.forward.pass_state import PassState
from torchtrace.forward.transpose import Linearised, plain
from torchtrace.nested import flatten
from torchtrace.tracer import tracer as TRACER

Tensors = Union[torch.Tensor, Tuple[torch.Tensor, ...]]
METHODS = ("auto", "dual", "transpose")


class TransposedOpsWarning(UserWarning):
    """Forward mode transposed the backward of some ops (they have no tangent rule): exact, but two small reverse
    passes per op instead of one tangent rule."""


@contextlib.contextmanager
def recording_on() -> Iterator[None]:
    """A transform's own passes record whatever the caller's mode, as torch.func's transforms: grad mode on (an outer
    no_grad is ignored) and inference mode off (inside torch.inference_mode nothing would record: every result a
    constant, every derivative a silent 0). A tensor made under inference mode is read as a constant."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def _leaves(values: Sequence[Any], what: str) -> List[torch.Tensor]:
    """Fresh tracer leaves for the primals (floating tensors only), so f's graph starts at them. Inside another
    forward-mode pass they would cut the outer tangents off (its result's tangent silently 0): refused."""
    if any(isinstance(getattr(observer, "__self__", None), DualPass) for observer in STATE.on_record):
        raise UnsupportedOperationError(
            "tt.jvp, tt.hvp or tt.jacobian inside a function that forward mode differentiates (tt.jvp, tt.hvp, "
            "tt.jacobian(mode='forward')): nested forward mode is not supported (the outer tangent would be lost). "
            "Compute the inner derivative with tt.grad(..., create_graph=True), which forward mode follows.")
    leaves = []
    for i, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}[{i}] is a {type(value).__name__}; pass tensors (torch.tensor(...) or tt.tracer)")
        if not value.is_floating_point():
            raise TypeError(f"{what}[{i}] has dtype {value.dtype}; only floating-point inputs have derivatives")
        with plain_torch():
            leaves.append(as_tracer(plain(value).clone(), requires_grad=True))
    return leaves


def _outputs(result: Any) -> Tuple[List[torch.Tensor], bool]:
    """f's outputs as a list, and whether f returned a tuple (the results keep that structure). An output that is a
    view whose base changed in place since its last use is brought up to date first (as its next use would)."""
    is_tuple = isinstance(result, (tuple, list))
    outputs = list(result) if is_tuple else [result]
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"f must return tensors (a tensor, or tuples, lists or dicts of them); output {i} is a "
                            f"{type(out).__name__}")
        if isinstance(out, TRACER) and out._tt_view:
            catch_up(out, TRACER, run_rule)
    return outputs, is_tuple


def _checked_tangents(primals: Any, tangents: Any) -> List[torch.Tensor]:
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise TypeError("tt.jvp(f, primals, tangents): primals and tangents must be tuples of tensors, "
                        "e.g. tt.jvp(f, (x,), (v,))")
    if len(primals) != len(tangents):
        raise ValueError(f"tt.jvp: {len(primals)} primals but {len(tangents)} tangents; give one tangent per primal")
    if not any(isinstance(p, torch.Tensor) for p in primals):
        raise RuntimeError("tt.jvp: expected primals to contain at least one tensor (the point f is differentiated at)")
    checked = []
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tangents[{i}] is a {type(t).__name__}; pass a tensor shaped like primals[{i}]")
        if isinstance(p, torch.Tensor) and t.shape != p.shape:
            raise ValueError(f"tangents[{i}] has shape {tuple(t.shape)}, primals[{i}] has {tuple(p.shape)}; "
                             "a tangent has its primal's shape")
        checked.append(as_tangent(t, p, f"tangents[{i}]", f"primals[{i}]", "tt.jvp") if isinstance(p, torch.Tensor)
                       else t)
    return checked


def as_tangent(t: torch.Tensor, p: torch.Tensor, name: str, primal: str, tool: str) -> torch.Tensor:
    """The tangent `t` (called `name`) of the primal `p` (called `primal`) as a plain tensor in p's dtype; an integer
    tangent is refused (cast, 1 would stand for 1.0), as torch.func's, and a complex one for a real primal (cast, its
    imaginary part would be dropped)."""
    if not (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"{name}: expected a floating-point tangent (as torch.func.jvp), got {t.dtype}")
    if t.is_complex() and not p.is_complex():
        raise ValueError(f"{name} is complex ({t.dtype}) and {primal} is real ({p.dtype}): torchtrace's forward mode "
                         f"carries real tangents: call {tool} with the real part and with the imaginary part (the "
                         "result is linear in it: J (a + ib) = J a + i J b)")
    return plain(t).to(p.dtype)


def dual_pass(f: Callable, primals: Sequence[torch.Tensor], tangents: Sequence[torch.Tensor],
              strict: bool = False) -> Tuple[List[torch.Tensor], bool, List[torch.Tensor], DualPass]:
    """Run f once on dual numbers: its outputs, whether it returned a tuple, their tangents, and the pass."""
    dual = DualPass()
    dual.strict = strict
    leaves = _leaves(primals, "primals")
    copies = [leaf.clone() for leaf in leaves]  # f may write into its inputs in place, as into torch.func's (a leaf
    for copy, t in zip(copies, tangents):  # refuses that): it gets a recorded copy of each, made before the pass
        dual.seed(copy, t)
    dual.leaves += leaves
    with dual.running():
        outputs, is_tuple = _outputs(f(*copies))
    products = []
    for out in outputs:
        dot = dual.tangent_of(out)
        products.append(plain(dot) if dot is not None else torch.zeros_like(plain(out)))
    return outputs, is_tuple, products, dual


def _warn_transposed(methods: Dict[str, str]) -> None:
    transposed = sorted(name for name, how in methods.items() if how == TRANSPOSED)
    if transposed:
        warnings.warn(f"forward mode transposed the backward of {', '.join(transposed)} (no tangent rule): the values "
                      "are exact, at the cost of two small reverse passes per op", TransposedOpsWarning, stacklevel=3)


def jvp(f: Callable, primals: Tuple[torch.Tensor, ...], tangents: Tuple[torch.Tensor, ...], *, method: str = "auto",
        report: bool = False) -> Any:
    """(f(*primals), J @ tangents), as torch.func.jvp.

    method="auto": one forward pass on dual numbers (each op's tangent rule, ẏ = J ẋ); an op without a tangent
    rule has its own backward transposed, with a TransposedOpsWarning naming it. "dual": refuse such ops.
    "transpose": the whole of f from two reverse passes, J v = d/du < J^T u, v > (the lesson of notebook 06a).
    report=True adds a third result: {rule name: "tangent rule" | "transposed backward"} for every op that
    carried a tangent ({"f": "transposed backward"} for method="transpose").
    """
    if method not in METHODS:
        raise ValueError(f"tt.jvp: method must be one of {METHODS}, not {method!r}")
    grad_outside = torch.is_grad_enabled()
    structure: List[Callable] = []

    def flat(*xs: torch.Tensor) -> Tuple[Any, ...]:  # f's outputs in any nesting of tuples, lists and dicts, as
        outputs, rebuild = flatten(f(*xs))  # torch.func.jvp takes them; the results come back in the same nesting
        structure.append(rebuild)
        return tuple(outputs)

    with recording_on():  # as torch.func.jvp, whatever the grad mode outside; constant results where it was off
        tangents_plain = _checked_tangents(primals, tangents)
        first_node = next_sequence_nr()
        if method == "transpose":
            leaves = _leaves(primals, "primals")
            outputs, _ = _outputs(flat(*[x.clone() for x in leaves]))  # (copies f may change in place, as auto's)
            products = Linearised(leaves, outputs).jvp(tangents_plain)
            methods = {"f": TRANSPOSED}
        else:
            outputs, _, products, dual = dual_pass(flat, primals, tangents_plain, strict=method == "dual")
            leaves = dual.leaves
            methods = dual.used()
            _warn_transposed(methods)
        # results torch.func would differentiate (none where grad mode was off outside)
        anchor = reads_a_gradient(primals, leaves, outputs, first_node) if grad_outside else None
        values = constant_results([plain(out) for out in outputs], anchor, "tt.jvp")
        result = (structure[-1](values), structure[-1](constant_results(products, anchor, "tt.jvp")))
        return (*result, methods) if report else result


def _unit(like: torch.Tensor, k: int) -> torch.Tensor:
    e = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    e[k] = 1
    return e.view(like.shape)


def jacobian(f: Callable, inputs: Tensors, mode: str = "reverse") -> Any:
    """The Jacobian of f at inputs, with the shapes and nesting of torch's functional `jacobian`.

    mode="reverse": one reverse pass per output element (a row of J each);
    mode="forward": one forward pass on dual numbers per input element (a column of J each).
    For a tensor input and output the result has shape output.shape + input.shape; a tuple of inputs
    or outputs gives a tuple (tuples of tuples for both: `J[output][input]`).
    """
    if mode not in ("forward", "reverse"):
        raise ValueError(f"tt.jacobian: mode must be 'forward' or 'reverse', not {mode!r}")
    grad_outside = torch.is_grad_enabled()
    with recording_on():  # as torch.func.jacfwd and torch's functional jacobian; constant where it was off
        inputs_tuple = isinstance(inputs, tuple)
        primals = inputs if inputs_tuple else (inputs,)
        first_node = next_sequence_nr()
        xs = _leaves(primals, "primals")
        start = PassState(f) if mode == "forward" else None  # every column's pass starts where this one did
        outs, is_tuple = _outputs(f(*([x.clone() for x in xs] if mode == "forward" else xs)))  # (as dual_pass's)
        blocks = [[plain(o).new_zeros(o.shape + x.shape, dtype=x.dtype if mode == "reverse" else o.dtype)
                   for x in xs] for o in outs]  # (torch's: rows in the input's dtype, columns the output's)
        if mode == "reverse":
            _rows(outs, xs, blocks)
        else:
            _columns(f, primals, xs, blocks, start)
        # blocks torch.func would differentiate (none where grad mode was off outside)
        anchor = reads_a_gradient(primals, xs, outs, first_node) if grad_outside else None
        blocks = [constant_results(row, anchor, "tt.jacobian / tt.hessian") for row in blocks]
        per_output = [tuple(row) if inputs_tuple else row[0] for row in blocks]
        return tuple(per_output) if is_tuple else per_output[0]


def _rows(outs: List[torch.Tensor], xs: List[torch.Tensor], blocks: List[List[torch.Tensor]]) -> None:
    """Row k of J_i: one reverse pass from the unit cotangent e_k of output i."""
    for i, out in enumerate(outs):
        if not getattr(out, "_tt_requires_grad", False):
            continue
        for k in range(out.numel()):
            row = grad(out, xs, _unit(plain(out), k), retain_graph=True, allow_unused=True)
            for j, g in enumerate(row):
                if g is not None:
                    blocks[i][j].view(out.numel(), *xs[j].shape)[k] = plain(g)


def _columns(f: Callable, primals: Sequence[torch.Tensor], xs: List[torch.Tensor],
             blocks: List[List[torch.Tensor]], start: PassState) -> None:
    """Column k of J_.j: one pass of f on dual numbers, seeded with the unit tangent e_k of input j, each from the
    random and module state the first pass started from (pass_state.py); the state one pass leaves, after."""
    methods: Dict[str, str] = {}
    after = PassState(f)
    for j, x in enumerate(xs):
        for k in range(x.numel()):
            tangents = [_unit(plain(x), k) if m == j else torch.zeros_like(plain(other)) for m, other in enumerate(xs)]
            start.restore()
            outputs, _, products, dual = dual_pass(f, primals, tangents)
            methods.update(dual.used())
            for i, column in enumerate(products):
                blocks[i][j].view(*outputs[i].shape, x.numel())[..., k] = column
    after.restore()
    _warn_transposed(methods)
