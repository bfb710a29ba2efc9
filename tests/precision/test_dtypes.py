"""The dtype of every op under tt.precision is the one torch.autocast gives the same call on plain tensors, and
the reason it names (autocast's lower-precision list, its float32 list, or promotion) is what torch does with
that op: cast float32 inputs down, cast low inputs up, or keep the widest input type."""
import pytest
import torch
from precision_models import CNN, GPT, cnn_loss, gpt_loss

import torchtrace as tt
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.precision.lists import WHY_FLOAT32, WHY_LOWER, WHY_PROMOTED, op_name, why

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


def test_a_dtype_that_is_not_low_is_refused():
    fn, args = CASES["cnn"]
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        tt.precision(fn, *args, dtype=torch.float64)
