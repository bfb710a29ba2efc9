"""The dtype of every op under tt.precision is the one torch.autocast gives the same call on plain tensors, and
the reason it names (autocast's lower-precision list, its float32 list, or promotion) is what torch does with
that op: cast float32 inputs down, cast low inputs up, or keep the widest input type."""
import pytest
import torch
from precision_models import CNN, GPT, cnn_loss, gpt_loss

import torchtrace as tt
from torchtrace.autocast_lists import WHY_FLOAT32, WHY_LOWER, WHY_PROMOTED, op_name, why
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing

LOW = (torch.bfloat16, torch.float16)


def _plain(value, cast=None):
    """A plain copy of value (tensors in lists and tuples too); floating tensors cast to `cast` when given."""
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v, cast) for v in value)
    if isinstance(value, torch.Tensor):
        with plain_torch():
            t = value.detach().as_subclass(torch.Tensor).clone()
        return t.to(cast) if cast is not None and t.is_floating_point() else t
    return value


def _first_tensor(result):
    return result if isinstance(result, torch.Tensor) else next(t for t in result if isinstance(t, torch.Tensor))


def _floating_inputs(args):
    found = []
    for a in args:
        items = a if isinstance(a, (list, tuple)) else [a]
        found += [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return found


def _recorded_calls(fn, args, dtype):
    """Each op tt.precision's low-precision run records: (func, plain args, kwargs, the dtype torchtrace gave)."""
    calls = []

    def note(node, call_args, kwargs, result):
        calls.append((node.func, _plain(call_args), _plain(kwargs), _first_tensor(result).dtype))

    with observing(on_record=note):
        report = tt.precision(fn, *args, dtype=dtype)
    return report, calls[len(calls) // 2:]  # the float32 run records first


def _cases():
    torch.manual_seed(0)
    gpt, cnn = tt.port(GPT()), tt.port(CNN())
    return {"gpt": (lambda idx: gpt_loss(gpt, idx), (torch.randint(0, 11, (2, 9)),)),
            "cnn": (lambda x, y: cnn_loss(cnn, x, y), (torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 3])))}


CASES = _cases()


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("model", sorted(CASES))
def test_every_op_runs_in_the_dtype_torch_autocast_gives_it_on_plain_tensors(model, dtype):
    fn, args = CASES[model]
    report, calls = _recorded_calls(fn, args, dtype)
    forward = [row for row in report.rows if row.phase == "forward"]
    assert len(forward) == len(calls) and len(calls) > 8
    for row, (func, call_args, kwargs, recorded) in zip(forward, calls):
        with torch.autocast("cpu", dtype=dtype):
            expected = _first_tensor(func(*call_args, **kwargs)).dtype
        assert recorded == expected == row.dtype, (row.rule, recorded, expected, row.dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("model", sorted(CASES))
def test_the_reason_given_is_what_torch_autocast_does_with_the_op(model, dtype):
    fn, args = CASES[model]
    report, calls = _recorded_calls(fn, args, dtype)
    seen, promoted = set(), 0
    for func, call_args, kwargs, _ in calls:
        reason = why(func)
        seen.add(reason)
        if reason == WHY_LOWER:  # float32 inputs are cast down
            with torch.autocast("cpu", dtype=dtype):
                out = _first_tensor(func(*_plain(call_args, torch.float32), **kwargs))
            assert out.dtype == dtype, op_name(func)
        elif reason == WHY_FLOAT32:  # low inputs are cast up
            with torch.autocast("cpu", dtype=dtype):
                out = _first_tensor(func(*_plain(call_args, dtype), **kwargs))
            assert out.dtype == torch.float32, op_name(func)
        else:  # autocast leaves it alone: the type its inputs give it, as without autocast
            with torch.autocast("cpu", dtype=dtype):
                out = _first_tensor(func(*call_args, **kwargs))
            without = _first_tensor(func(*call_args, **kwargs))
            assert out.dtype == without.dtype, op_name(func)
            promoted += len(_floating_inputs(call_args)) > 1 and out.dtype == torch.float32
    assert promoted or model != "gpt", "the residual adds promote a low branch to float32"
    assert {WHY_LOWER, WHY_FLOAT32, WHY_PROMOTED} <= seen
    assert [row.why for row in report.rows if row.phase == "forward"] == [why(c[0]) for c in calls]


@pytest.mark.parametrize("call, error, says", [
    (lambda fn, args: tt.precision(fn, *args, dtype=torch.float64), ValueError, "bfloat16 or torch.float16, not torch"),
    (lambda fn, args: tt.precision(fn, *args, dtype="float16"), ValueError, "not 'float16' \\(a str\\)"),
    (lambda fn, args: tt.precision(42, *args), TypeError, "fn must be a function"),
    (lambda fn, args: tt.precision(fn, *args, device="tpu"), ValueError, "device must be a device type"),
    (lambda fn, args: tt.precision(torch.nn.Linear(4, 1), torch.randn(3, 4)), RuntimeError, "tt.port\\(model\\)"),
    (lambda fn, args: tt.precision(fn, *args, dtpye=torch.float16), TypeError, "dtpye= .* did you mean dtype="),
    (lambda fn, args: tt.precision(fn, *args, device_type="cpu"), TypeError, "device_type= .* did you mean device="),
], ids=["float64", "a string", "not callable", "unknown device", "a module not ported", "a misspelt dtype",
        "torch.autocast's device_type"])
def test_arguments_it_cannot_take_are_refused_naming_them(call, error, says):
    fn, args = CASES["cnn"]
    with pytest.raises(error, match=says):
        call(fn, args)


def _cast_floating(args, dtype):
    return [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def _assert_autocast_does(reason, func, args, kwargs, dtype):
    """What each reason means, checked on plain tensors under torch.autocast: the lower-precision list casts float32
    inputs down, the float32 list casts low ones up, and an op on no list keeps both as they come."""
    def under_autocast(inputs_dtype):
        with torch.autocast("cpu", dtype=dtype):
            return _first_tensor(func(*_cast_floating(args, inputs_dtype), **kwargs)).dtype

    if reason == WHY_LOWER:
        assert under_autocast(torch.float32) == dtype
    elif reason == WHY_FLOAT32:
        assert under_autocast(dtype) == torch.float32
    else:
        assert (under_autocast(torch.float32), under_autocast(dtype)) == (torch.float32, dtype)


def _spd():
    a = torch.randn(4, 4)
    return a @ a.T + 4 * torch.eye(4)


SINGLE_OPS = {  # name -> (callable, its tensor arguments, its other arguments)
    "linalg.inv": (torch.linalg.inv, lambda: [_spd()], {}),
    "linalg.solve": (torch.linalg.solve, lambda: [_spd(), torch.randn(4, 2)], {}),
    "linalg.cholesky": (torch.linalg.cholesky, lambda: [_spd()], {}),
    "linalg.eigh": (torch.linalg.eigh, lambda: [_spd()], {}),
    "linalg.svdvals": (torch.linalg.svdvals, lambda: [torch.randn(4, 3)], {}),
    "linalg.qr": (torch.linalg.qr, lambda: [torch.randn(4, 3)], {}),
    "linalg.matmul": (torch.linalg.matmul, lambda: [torch.randn(4, 3), torch.randn(3, 2)], {}),
    "linalg.vector_norm": (torch.linalg.vector_norm, lambda: [torch.randn(5)], {}),
    "inverse": (torch.inverse, lambda: [_spd()], {}),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: [torch.randn(4, 3), torch.randn(3, 2)], {}),
    "tensordot": (torch.tensordot, lambda: [torch.randn(4, 3), torch.randn(3, 2)], {"dims": 1}),
    "inner": (torch.inner, lambda: [torch.randn(4, 3), torch.randn(2, 3)], {}),
    "pad reflect 1d": (torch.nn.functional.pad, lambda: [torch.randn(1, 2, 8)], {"pad": (1, 1), "mode": "reflect"}),
    "pad replicate 2d": (torch.nn.functional.pad, lambda: [torch.randn(1, 2, 5, 5)],
                         {"pad": (1, 1, 2, 0), "mode": "replicate"}),
    "pad circular 1d": (torch.nn.functional.pad, lambda: [torch.randn(1, 2, 8)], {"pad": (1, 1), "mode": "circular"}),
    "pad constant": (torch.nn.functional.pad, lambda: [torch.randn(1, 2, 8)], {"pad": (1, 1)}),
    "mse_loss": (torch.nn.functional.mse_loss, lambda: [torch.randn(5), torch.randn(5)], {}),
}


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", sorted(SINGLE_OPS))
def test_the_reason_a_report_gives_for_one_op_is_what_torch_autocast_does(name, dtype):
    func, make, kwargs = SINGLE_OPS[name]
    torch.manual_seed(0)
    args = make()
    report = tt.precision(lambda *ts: _first_tensor(func(*ts, **kwargs)).float().sum(),
                          *[tt.tracer(a, requires_grad=True) for a in args], dtype=dtype)
    _assert_autocast_does(report.rows[0].why, func, args, kwargs, dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("func", [torch.fft.fft, torch.fft.rfft, torch.fft.ifft, torch.fft.fftshift,
                                  torch.linalg.eigvals, torch.linalg.cond], ids=lambda f: f.__name__)
def test_the_reason_of_ops_without_a_rule_is_what_torch_autocast_does(func, dtype):
    _assert_autocast_does(why(func), lambda a: _first_tensor(func(a)).real, [_spd()], {}, dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_an_op_autocast_left_alone_is_promoted_not_its_lists(dtype):
    """A listed op that autocast did not cast runs in the type its inputs give it ('promoted'): inside
    torch.autocast(enabled=False), or on float64 inputs, which autocast never casts; its list's reason was given."""
    torch.manual_seed(0)
    low, high = tt.port(torch.nn.Linear(4, 4)), tt.port(torch.nn.Linear(4, 4).double())

    def loss(x):
        h = low(x)  # cast: the lower-precision list
        with torch.autocast("cpu", enabled=False):
            h = low(h.float())  # autocast switched off: float32, its inputs' type
        return high(h.double()).softmax(-1).sum()  # float64: never cast (softmax is on the float32 list)

    rows = [row for row in tt.precision(loss, torch.randn(3, 4), dtype=dtype).rows if row.rule in
            ("LinearFunction", "Softmax")]
    forward = [(row.rule, row.dtype, row.why) for row in rows if row.phase == "forward"]
    assert forward == [("LinearFunction", dtype, WHY_LOWER), ("LinearFunction", torch.float32, WHY_PROMOTED),
                       ("LinearFunction", torch.float64, WHY_PROMOTED), ("Softmax", torch.float64, WHY_PROMOTED)]
    with torch.autocast("cpu", dtype=dtype):  # what torch autocast does with the same calls on plain tensors
        x = torch.randn(3, 4)
        assert torch.nn.functional.linear(x, torch.randn(4, 4)).dtype == dtype
        with torch.autocast("cpu", enabled=False):
            assert torch.nn.functional.linear(x, torch.randn(4, 4)).dtype == torch.float32
        assert torch.nn.functional.linear(x.double(), torch.randn(4, 4).double()).softmax(-1).dtype == torch.float64
    backward = {row.rule: row.why for row in rows if row.phase == "backward" and row.dtype == torch.float64}
    assert set(backward.values()) == {WHY_PROMOTED}
