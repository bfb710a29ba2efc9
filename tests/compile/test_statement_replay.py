"""A fast statement's generated replay (statement_replay.py) against the interpreted checks (`Run._fits`): on random
argument tuples drawn from objects that fit and objects that do not, both accept the same calls and bind the same
leaf slots; what it replays equals eager, values and gradients, bit for bit."""
import linecache
import random
from typing import Any, List

import pytest
import torch

import torchtrace as tt
from torchtrace.compiler.ir import NUMBER, REPLAY, TENSOR
from torchtrace.compiler.replay import MISS, Run
from torchtrace.tracer import tracer


def _two_new_leaves(x, w, v):
    return (torch.mul(w, v) + x).sum()


def _leaf_twice(x, w, v):
    return (torch.mul(w, w) * v + x).sum()


def _float_and_structure(x, w, v):
    return torch.sum(torch.lerp(w, v, 0.25) * x, 1, True).sum()


FUNCTIONS = [_two_new_leaves, _leaf_twice, _float_and_structure]


def _leaf(shape: tuple, dtype: torch.dtype = torch.float32, requires_grad: bool = True) -> torch.Tensor:
    return tt.tracer(torch.rand(*shape, dtype=dtype), requires_grad=requires_grad)


def _fast_statements(fn: Any, inputs: tuple) -> list:
    compiled = tt.compile(fn, inputs)
    for _ in range(3):
        compiled(*inputs).backward()
    statements = [st for st in compiled.last_path if st.kind == REPLAY]
    assert statements and all(st.replay is not None for st in statements)
    return compiled, statements


def _state(compiled: Any, st: Any, pool: List[Any], rng: random.Random) -> Run:
    """A Run standing at `st`: values and leaf slots bound to objects of the pool (some, at random)."""
    run = Run(compiled.program, dict)
    block = compiled.program.root
    run.block, run.at = block, block.statements.index(st)
    run.n_values = st.first_value
    tensors = [p for p in pool if isinstance(p, torch.Tensor)]
    recorded = [t for t in tensors if t.shape == (3, 4) and t.dtype == torch.float32]  # as the recorded values
    for value in range(st.first_value):
        if rng.random() < 0.7:
            run.values[id(rng.choice(recorded))] = value
    for slot in range(min(s for s in st.new_slots) if st.new_slots else 4):
        t = rng.choice(tensors)
        if id(t) not in run.slot_of and rng.random() < 0.8:
            run.slot_of[id(t)] = len(run.slots)
            run.slots.append(t)
    return run


def _copy(run: Run, compiled: Any) -> Run:
    twin = Run(compiled.program, dict)
    twin.block, twin.at, twin.n_values = run.block, run.at, run.n_values
    twin.values, twin.slot_of, twin.slots = dict(run.values), dict(run.slot_of), list(run.slots)
    return twin


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_generated_checks_accept_what_the_interpreted_ones_accept(fn):
    rng = random.Random(0)
    x, w, v = _leaf((3, 4), requires_grad=False), _leaf((3, 4)), _leaf((3, 4))
    compiled, statements = _fast_statements(fn, (x, w, v))
    inplace_changed = _leaf((3, 4))
    inplace_changed._tt_node, inplace_changed._tt_version = object(), inplace_changed._version - 1
    pool = [x, w, v, _leaf((3, 4)), _leaf((3, 4)), _leaf((4, 3)), _leaf((3, 4), torch.float64),
            _leaf((3, 4), requires_grad=False), torch.rand(3, 4), torch.rand(3, 4, requires_grad=True),
            inplace_changed, 0.25, 0.5, 1, True, None, "a"]
    agreed = accepted = 0
    for st in statements:
        for _ in range(400):
            run = _state(compiled, st, pool, rng)
            n = len(st.checks) + (1 if rng.random() < 0.05 else 0) - (1 if rng.random() < 0.05 else 0)
            args = tuple(rng.choice(pool) for _ in range(max(n, 0)))
            if rng.random() < 0.5:  # mostly-right calls: each argument from where the statement's came
                args = tuple(_fitting(run, entry, source, pool, rng) for entry, source, _ in st.checks)
            interpreted = _copy(run, compiled)
            with torch._C.DisableTorchFunctionSubclass():
                expected = len(args) == len(st.checks) and interpreted._fits(st, st.checks, args)
                got = st.replay(run, st, args) is not MISS
            assert got == expected, (st.describe(), args)
            if expected:
                accepted += 1
                assert run.slot_of == interpreted.slot_of and [id(t) for t in run.slots] == \
                    [id(t) for t in interpreted.slots]
            agreed += 1
    assert accepted > 20 and agreed == 400 * len(statements)


def _fitting(run: Run, entry: Any, source: int, pool: list, rng: random.Random) -> Any:
    """An argument from where the statement's came, where the run has one (else any object of the pool)."""
    if entry is NUMBER:
        return rng.choice([0.25, 0.5, 1])
    if entry is not TENSOR:
        return entry[1]
    if source >= 0:
        owners = [t for t in pool if isinstance(t, torch.Tensor) and run.values.get(id(t)) == source]
    else:
        owners = run.slots[~source:~source + 1]
    return owners[0] if owners else rng.choice(pool)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_replayed_calls_equal_eager_with_new_leaves_each_call(fn):
    """New leaf objects every call (bound to their slots on first read), the same object twice, a float that
    changes: values and gradients equal eager's and torch autograd's, and every call after the first replays."""
    compiled = tt.compile(fn, (_leaf((3, 4), requires_grad=False), _leaf((3, 4)), _leaf((3, 4))))
    torch.manual_seed(0)
    for _ in range(4):
        data = [torch.rand(3, 4, dtype=torch.float64) for _ in range(3)]
        ours = [tt.tracer(d.clone(), requires_grad=i > 0) for i, d in enumerate(data)]
        eager = [tt.tracer(d.clone(), requires_grad=i > 0) for i, d in enumerate(data)]
        theirs = [d.clone().requires_grad_(i > 0) for i, d in enumerate(data)]
        out = compiled(*ours)
        out.backward()
        fn(*eager).backward()
        fn(*theirs).backward()
        assert torch.equal(out.detach().as_subclass(torch.Tensor), fn(*eager).detach().as_subclass(torch.Tensor))
        for a, b, c in zip(ours[1:], eager[1:], theirs[1:]):
            assert torch.equal(a.grad, b.grad)
            torch.testing.assert_close(a.grad.as_subclass(torch.Tensor), c.grad)
    assert compiled.replayed == compiled.calls - 1
    assert isinstance(ours[1], tracer)


def test_replay_code_shows_the_source_that_runs():
    inputs = (_leaf((3, 4), requires_grad=False), _leaf((3, 4)), _leaf((3, 4)))
    compiled, statements = _fast_statements(_float_and_structure, inputs)
    shown = compiled.replay_code
    for st in statements:
        assert st.replay.source in shown
        form = "".join(linecache.getlines(st.replay.__code__.co_filename))  # what tracebacks show
        assert st.replay.source.endswith(form) and st.describe() in st.replay.source.split("\n")[0]
    assert shown.count("def replay(run, st, args):") == len(statements)
    assert "# a2: a float (read on every call)" in shown and "# a2: K[" in shown and ", True, " in shown


def test_calls_with_keywords_take_the_generated_replay(monkeypatch):
    """Keywords moved to their positions (as the statement was recorded: a Python function's, such as F.mse_loss's)
    fit the statement's generated replay: no call of a replayed path goes down the general path; values and
    gradients equal eager's and torch autograd's."""
    def fn(x, w, t):
        return torch.nn.functional.mse_loss(torch.sum(x * w, 1, True), t, reduction="sum")

    general: List[Any] = []
    interpreted = Run.replay
    monkeypatch.setattr(Run, "replay", lambda run, f, a, k: general.append(f) or interpreted(run, f, a, k))
    torch.manual_seed(0)
    x, w, t = torch.rand(4, 3, dtype=torch.float64), torch.rand(4, 3, dtype=torch.float64), torch.rand(4, 1)
    t = t.double()
    compiled = tt.compile(fn, (tt.tracer(x), tt.tracer(w, requires_grad=True), tt.tracer(t)))
    for call in range(4):
        general.clear()
        ours, eager = tt.tracer(w.clone(), requires_grad=True), tt.tracer(w.clone(), requires_grad=True)
        theirs = w.clone().requires_grad_()
        out = compiled(tt.tracer(x), ours, tt.tracer(t))
        out.backward()
        fn(tt.tracer(x), eager, tt.tracer(t)).backward()
        fn(x, theirs, t).backward()
        assert torch.equal(ours.grad, eager.grad)
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
        if call >= 2:  # (the first call records, the second plans each statement and generates its replay)
            assert general == [], general
    assert compiled.replayed == compiled.calls - 1


def test_the_written_out_context_and_step_equal_their_classes_own_construction():
    """The generated replay builds each Context and Step without calling __init__ (one Python frame fewer per op):
    every slot it fills must be what `Context(rule, (), mask)` and `Step(...)` fill, so the two cannot drift apart."""
    from torchtrace.autograd.node import Context
    from torchtrace.compiler.segment import Step

    def slots(obj: Any, cls: type) -> dict:
        names = [n for klass in cls.__mro__ for n in getattr(klass, "__slots__", ()) if n != "__dict__"]
        return {n: getattr(obj, n, "<unset>") for n in names} | dict(getattr(obj, "__dict__", {}))

    w = tt.tracer(torch.rand(3, 3, dtype=torch.float64), requires_grad=True)
    v = tt.tracer(torch.rand(3, 3, dtype=torch.float64), requires_grad=True)
    x = torch.rand(3, 3, dtype=torch.float64)
    compiled = tt.compile(_two_new_leaves, (x, w, v))
    for _ in range(3):
        compiled(x, w, v)
    steps = _steps_of(compiled, x, w, v)
    assert steps and all(step.statement.replay is not None for step in steps)
    for step in steps:
        ctx = step.ctx
        made = Context(ctx._rule, (), ctx._mask)
        made._saved, made._versions = ctx._saved, ctx._versions  # (what the rule's forward set afterwards: its
        made.__dict__.update(ctx.__dict__)  # saves, and attributes of its own such as ctx.alpha)
        assert slots(ctx, Context) == slots(made, Context)
        again = Step(step.rule, ctx, step.outputs, step.metas, step.targets, step.local, step.saved_outputs,
                     step.statement, step.floats)
        again.saved_inputs = step.saved_inputs  # (set by Segment.plain_saved_input afterwards)
        assert slots(step, Step) == slots(again, Step)


def _steps_of(compiled: Any, *args: Any) -> list:
    """The steps of one replayed call: those of its result's node (whose ctx is the segment)."""
    return list(compiled(*args)._tt_node.ctx.steps)
