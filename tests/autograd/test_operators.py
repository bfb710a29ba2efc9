"""`a * b` and the other binary operators on tracers take their lanes without torch's __torch_function__ entry
(lanes/operators.py): the same graph, values and gradients as the protocol gives, and the protocol itself wherever
the common case does not hold (other operand types, modes, disabled dispatch, subclasses, the readable path)."""
import operator

import numpy as np
import pytest
import torch
from helpers import needs_lanes
from torch.overrides import TorchFunctionMode

import torchtrace as tt
from torchtrace.autograd.plain import plain_torch
from torchtrace.lanes.operators import MODES_CALLED_DIRECTLY, OPERATORS

OPS = {"__add__": operator.add, "__sub__": operator.sub, "__mul__": operator.mul, "__truediv__": operator.truediv,
       "__matmul__": operator.matmul}
# the other operand on the left: a number reaches the tracer's reflected operator, a plain tensor torch's own
LEFT = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
        "matmul": operator.matmul}


def _operands(kind: str):
    g = torch.Generator().manual_seed(3)
    a = torch.rand(3, 3, generator=g, dtype=torch.float64) + 0.5
    b = torch.rand(3, 3, generator=g, dtype=torch.float64) + 0.5
    return a, {"tracer": b, "plain": b, "number": 1.75, "bool": True, "int": 3}[kind]


def _run(name: str, kind: str, readable: bool):
    """(result, a.grad, b.grad or None, grad_fn name, grad_fn.func) of `a <op> b`, a a leaf tracer."""
    a, b = _operands(kind)
    ta = tt.tracer(a, requires_grad=True)
    tb = tt.tracer(b, requires_grad=True) if kind == "tracer" else b
    with tt.readable() if readable else _nothing():
        out = OPS[name](ta, tb)
        node = out.grad_fn
        (out * out).sum().backward()
    return out, ta.grad, getattr(tb, "grad", None), node.name, node.func


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kind", ["tracer", "plain", "number", "bool", "int"])
@pytest.mark.parametrize("name", list(OPS))
def test_an_operator_records_what_the_protocol_records(name, kind):
    if name == "__matmul__" and kind not in ("tracer", "plain"):
        pytest.skip("@ takes tensors only")
    a, b = _operands(kind)
    try:
        OPS[name](a, b)
    except RuntimeError as torch_refusal:  # (x - True: torch refuses; so must both paths, in torch's words)
        for readable in (False, True):
            with pytest.raises(RuntimeError) as refusal:
                _run(name, kind, readable)
            assert str(refusal.value) == str(torch_refusal)
        return
    fast, readable = _run(name, kind, False), _run(name, kind, True)
    assert fast[3:] == readable[3:] and fast[4] is OPERATORS[name][0]
    for f, r in zip(fast[:3], readable[:3]):
        if r is None:
            assert f is None
        else:
            torch.testing.assert_close(f.as_subclass(torch.Tensor), r.as_subclass(torch.Tensor), rtol=0, atol=0)
    # against torch autograd, and against central differences of the same function
    a = a.clone().requires_grad_()
    b = b.clone().requires_grad_() if kind == "tracer" else b
    (OPS[name](a, b) ** 2).sum().backward()
    torch.testing.assert_close(fast[1].as_subclass(torch.Tensor), a.grad)
    if kind == "tracer":
        torch.testing.assert_close(fast[2].as_subclass(torch.Tensor), b.grad)
    assert tt.gradcheck(lambda x: OPS[name](x, b.detach() if kind == "tracer" else b), a.detach())


def test_an_operator_answers_not_implemented_where_torch_does():
    class Other:
        def __rmul__(self, x):
            return "Other.__rmul__"

        def __radd__(self, x):
            return "Other.__radd__"

    x = tt.tracer(torch.ones(2), requires_grad=True)
    assert x * Other() == "Other.__rmul__" and x + Other() == "Other.__radd__"
    with pytest.raises(TypeError) as ours:
        x * "text"
    with pytest.raises(TypeError) as theirs:
        torch.ones(2) * "text"
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("readable", [False, True])
@pytest.mark.parametrize("left", [1.5, 1 + 2j, "numpy"])
def test_matmul_with_a_non_tensor_on_the_left_is_torchs_type_error(left, readable):
    x = tt.tracer(torch.ones(2, 2), requires_grad=True)
    other = np.ones((2, 2)) if left == "numpy" else left
    with tt.readable() if readable else _nothing():
        with pytest.raises(TypeError) as ours:
            other @ x
    with pytest.raises(TypeError) as theirs:
        other @ torch.ones(2, 2, requires_grad=True)
    assert str(ours.value) == str(theirs.value).replace("'Tensor'", "'tracer'")


@pytest.mark.parametrize("left", [np.float32(2.5), np.int64(3), np.float64(-1.5)])
def test_a_numpy_scalar_over_a_tracer_is_torchs_quotient_and_gradient(left):
    values = torch.tensor([[0.5, -1.5], [2.0, 3.0]], dtype=torch.float64)
    x, t = tt.tracer(values.clone(), requires_grad=True), values.clone().requires_grad_()
    ours, theirs = left / x, left / t
    assert ours.dtype == theirs.dtype and torch.equal(ours.as_subclass(torch.Tensor), theirs.detach())
    (ours * ours).sum().backward()
    (theirs * theirs).sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), t.grad)
    assert tt.gradcheck(lambda v: left / v, values.clone())


def test_a_torch_function_mode_sees_every_operator():
    seen = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = tt.tracer(torch.ones(2, 2), requires_grad=True)
    with Watch():
        y = (x * x + x - x / 2.0) @ x
    assert seen[:5] == [torch.Tensor.mul, torch.Tensor.add, torch.Tensor.div, torch.Tensor.sub, torch.Tensor.matmul]
    y.sum().backward()
    t = torch.ones(2, 2, requires_grad=True)
    ((t * t + t - t / 2.0) @ t).sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), t.grad)


class _Logging(TorchFunctionMode):
    """Notes each call as its handler receives it, and whether it is still on the mode stack then."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        on_stack = torch._C._len_torch_function_stack()
        self.seen.append((func, types, tuple(type(a) for a in args), kwargs, on_stack))
        if isinstance(args[-1], float) and args[-1] == -7.0:
            raise ValueError("refused")
        return func(*args, **(kwargs or {}))


_EXPRESSIONS = [lambda a, b: a * b, lambda a, b: a + 2, lambda a, b: a - a, lambda a, b: a / 3.0,
                lambda a, b: a @ b, lambda a, b: -a, lambda a, b: 2 - a, lambda a, b: b @ a, lambda a, b: b - a,
                lambda a, b: 2 * a, lambda a, b: a * True, lambda a, b: (a * b) @ a]


def test_a_registered_mode_gets_from_an_operator_what_torch_would_hand_it():
    """An operator calls a registered mode (tt.compile's) itself: the same callable, types, arguments and keywords
    as torch's C entry hands it, with the mode off the stack while it runs, and the stack as before after a raise."""
    a = tt.tracer(torch.rand(3, 3, dtype=torch.float64), requires_grad=True)
    b = torch.rand(3, 3, dtype=torch.float64)
    heard = {}
    for direct in (False, True):
        if direct:
            MODES_CALLED_DIRECTLY.add(_Logging)
        try:
            for k, expression in enumerate(_EXPRESSIONS):
                seen = []
                with _Logging(seen):
                    value = expression(a, b)
                    with pytest.raises(ValueError, match="refused"):
                        a * -7.0
                    assert torch._C._len_torch_function_stack() == 1
                heard.setdefault(k, []).append((seen, value.as_subclass(torch.Tensor)))
        finally:
            MODES_CALLED_DIRECTLY.discard(_Logging)
    for k, ((seen_torch, value_torch), (seen_direct, value_direct)) in heard.items():
        assert seen_direct == seen_torch, k
        assert all(entry[-1] == 0 for entry in seen_direct)
        assert torch.equal(value_direct, value_torch)


def test_an_operator_calls_a_registered_mode_only_when_it_is_the_only_one():
    seen_inner, seen_outer = [], []
    a = tt.tracer(torch.rand(2, 2), requires_grad=True)
    MODES_CALLED_DIRECTLY.add(_Logging)
    try:
        with _Logging(seen_outer), _Logging(seen_inner):
            a * a
    finally:
        MODES_CALLED_DIRECTLY.discard(_Logging)
    assert [e[0] for e in seen_inner] == [torch.Tensor.mul] and [e[0] for e in seen_outer] == [torch.Tensor.mul]
    assert seen_inner[0][-1] == 1  # torch's entry: the outer mode still on the stack while the inner one runs


def test_with_subclass_dispatch_disabled_an_operator_computes_plainly():
    x = tt.tracer(torch.ones(2), requires_grad=True)
    with plain_torch():
        y = x * x + x
    assert type(y) is torch.Tensor


@needs_lanes
def test_the_readable_path_and_observers_remove_the_operators():
    assert all(name in vars(tt.tracer) for name in OPERATORS)
    with tt.readable():
        assert not any(name in vars(tt.tracer) for name in OPERATORS)
    recorded = []
    from torchtrace.autograd.state import observing
    x = tt.tracer(torch.ones(2), requires_grad=True)
    with observing(on_record=lambda node, *rest: recorded.append(node.name)):
        x * x
    assert recorded == ["MulBackward"]
    assert all(name in vars(tt.tracer) for name in OPERATORS)


def test_parameters_take_the_lane_and_a_subclass_with_its_own_entry_is_asked():
    calls = []

    class Logged(tt.tracer):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    w = tt.nn.Parameter(torch.full((2,), 3.0))
    x = tt.tracer(torch.ones(2), requires_grad=True)
    (x * w).sum().backward()
    torch.testing.assert_close(w.grad.as_subclass(torch.Tensor), torch.ones(2))
    logged = torch.ones(2).as_subclass(Logged)
    x * logged
    logged * x
    assert calls == [torch.Tensor.mul, torch.Tensor.mul]


def test_a_numpy_scalar_or_complex_operand_takes_the_protocol():

    x = tt.tracer(torch.tensor([1.0, 2.0], dtype=torch.float64), requires_grad=True)
    y = x * np.float64(2.0) + x
    y.sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.full((2,), 3.0, dtype=torch.float64))


def _graph_and_grads(fn, readable: bool):
    """(node names newest first, their funcs, the leaf's gradient) of fn(a leaf tracer), on one path."""
    x = tt.tracer(torch.tensor([[0.5, 1.5], [2.0, 3.0]], dtype=torch.float64), requires_grad=True)
    with tt.readable() if readable else _nothing():
        out = fn(x)
        nodes, node = [], out.grad_fn
        while node is not None and node.name != "AccumulateGrad":
            nodes.append((node.name, node.func))
            node = next((n for n, _ in node.next_functions if n is not None), None)
        out.sum().backward()
    return nodes, x.grad.as_subclass(torch.Tensor)


@pytest.mark.parametrize("left", ["number", "plain"])
@pytest.mark.parametrize("name", list(LEFT))
def test_the_other_operand_on_the_left_records_what_the_protocol_records(name, left):
    if name == "matmul" and left == "number":
        pytest.skip("@ takes tensors only")
    other = 1.5 if left == "number" else torch.tensor([[1.0, -2.0], [0.5, 4.0]], dtype=torch.float64)
    fast, readable = (_graph_and_grads(lambda x: LEFT[name](other, x), r) for r in (False, True))
    assert fast[0] == readable[0]
    torch.testing.assert_close(fast[1], readable[1], rtol=0, atol=0)
    x = torch.tensor([[0.5, 1.5], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    LEFT[name](other, x).sum().backward()
    torch.testing.assert_close(fast[1], x.grad)
    assert tt.gradcheck(lambda t: LEFT[name](other, t), x.detach())


def test_negation_records_what_the_protocol_records():
    fast, readable = (_graph_and_grads(lambda x: -(-x * x), r) for r in (False, True))
    assert fast[0] == readable[0] and fast[0][0] == ("NegBackward", torch.Tensor.neg)
    torch.testing.assert_close(fast[1], readable[1], rtol=0, atol=0)
    x = torch.tensor([[0.5, 1.5], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    (-(-x * x)).sum().backward()
    torch.testing.assert_close(fast[1], x.grad)


def test_a_reflected_operator_with_a_tracer_or_an_unknown_type_takes_the_protocol():
    class Other:
        def __mul__(self, x):
            return NotImplemented

    x = tt.tracer(torch.ones(2), requires_grad=True)
    with pytest.raises(TypeError) as ours:
        Other() * x
    with pytest.raises(TypeError) as theirs:
        Other() * torch.ones(2)
    assert str(ours.value).replace("tracer", "Tensor") == str(theirs.value)
    w = tt.nn.Parameter(torch.full((2,), 2.0))
    (w.__rmul__(x)).sum().backward()  # a tracer handed to a reflected operator: torch's own, as before
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.full((2,), 2.0))


def test_an_operand_class_made_in_a_loop_is_not_kept():
    import gc
    import weakref

    x = tt.tracer(torch.ones(2), requires_grad=True)
    refs = []
    for _ in range(3):
        class Other:  # an operand torch answers NotImplemented for
            def __rmul__(self, t):
                return "Other.__rmul__"

        class Sub(tt.tracer):  # a tracer subclass that keeps the tracer's entry
            pass

        assert x * Other() == "Other.__rmul__"
        (x * torch.ones(2).as_subclass(Sub)).sum().backward()
        refs += [weakref.ref(Other), weakref.ref(Sub)]
        del Other, Sub
    gc.collect()
    assert all(ref() is None for ref in refs)
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.full((2,), 3.0))
