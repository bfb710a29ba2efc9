"""The generated fast lanes against the readable path (tt.readable()): bit-identical values, gradients and graphs.

Every op in tests/opinfo_passing.txt runs its first OpInfo sample in every form on both paths; a few ModuleInfo
modules run forward and backward ported. Torch's own results are the business of tests/test_opinfo.py: here
the readable path is the reference, and nothing may differ from it by a single bit.
"""
import contextlib
import pathlib
from typing import Any, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from helpers import needs_lanes

import torchtrace as tt
from torchtrace import coverage
from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.function import RULES
from torchtrace.lanes.forward import LANES, lane_source

PASSING = sorted(line.strip() for line in
                 pathlib.Path(__file__).parents[1].joinpath("opinfo_passing.txt").read_text().splitlines()
                 if line.strip())
OPS = {coverage.op_key(op): op for op in coverage.judged_ops()}


def _graph(outputs: List[Any]) -> List[str]:
    roots = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and getattr(o, "grad_fn", None) is not None]
    return [node.name for node in topological_order(roots)]


def _run(op: Any, fn: Any, sample: Any, readable: bool) -> Tuple[Any, ...]:
    """(outputs, gradients of the leaves, node names) of one sample, or the exception it raised."""
    with tt.readable() if readable else contextlib.nullcontext():
        inp, args, kwargs, leaves = coverage._copies(sample, coverage._tt_leaf)
        torch.manual_seed(0)
        try:
            outputs = coverage._run(lambda i, *a, **k: op.gradcheck_wrapper(fn, i, *a, **k), inp, args, kwargs, sample)
            recorded = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
            graph = _graph(recorded)
            if recorded and leaves:
                weights = coverage._weights(recorded, seed=1)
                sum((o * w).sum() for o, w in zip(recorded, weights)).backward()
        except Exception as exc:  # both paths must raise the same
            return ("raised", type(exc).__name__, str(exc))
        return ([coverage._plain(o) if isinstance(o, torch.Tensor) else o for o in outputs],
                [None if x.grad is None else coverage._plain(x.grad) for x in leaves], graph)


def _assert_identical(fast: Any, reference: Any, what: str) -> None:
    if isinstance(reference, torch.Tensor):
        assert isinstance(fast, torch.Tensor) and fast.dtype == reference.dtype, what
        torch.testing.assert_close(fast, reference, rtol=0, atol=0, equal_nan=True, msg=what)
    elif isinstance(reference, (list, tuple)):
        assert type(fast) is type(reference) and len(fast) == len(reference), what
        for i, (f, r) in enumerate(zip(fast, reference)):
            _assert_identical(f, r, f"{what}[{i}]")
    else:
        assert fast == reference or (fast != fast and reference != reference), what


@pytest.mark.parametrize("name", [n for n in PASSING if n in OPS])
def test_fast_lanes_equal_the_readable_path_on_opinfo_samples(name: str) -> None:
    op = OPS[name]
    sample = next(iter(coverage.samples(op, 1)))
    for label, fn in coverage.variants(op):
        reference = _run(op, fn, sample, readable=True)
        fast = _run(op, fn, sample, readable=False)
        _assert_identical(fast, reference, f"{name} ({label})")


def _module_cases() -> List[Any]:
    from torch.testing._internal.common_modules import module_db

    wanted = {"nn.Linear", "nn.Conv2d", "nn.LayerNorm", "nn.Embedding", "nn.GRUCell", "nn.MultiheadAttention",
              "nn.BatchNorm1d", "nn.Tanh", "nn.ReLU"}
    return [info for info in module_db if info.name in wanted]


def _run_module(info: Any, readable: bool) -> Any:
    with tt.readable() if readable else contextlib.nullcontext():
        torch.manual_seed(0)
        inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float64, requires_grad=True, training=True)
        results = []
        for module_input in inputs[:3]:
            if module_input.forward_input is None:
                continue
            torch.manual_seed(0)
            args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
            model = tt.port(info.module_cls(*args, **kwargs).to(torch.float64))
            leaves: List[Any] = []

            def leaf(t: Any) -> Any:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    leaves.append(tt.as_tracer(t.detach().clone(), requires_grad=True))
                    return leaves[-1]
                return t

            fargs = [leaf(a) for a in module_input.forward_input.args]
            fkwargs = {k: leaf(v) for k, v in module_input.forward_input.kwargs.items()}
            results.append(_run_model(model, fargs, fkwargs, leaves))
        return results


def _run_model(model: Any, args: list, kwargs: dict, leaves: list) -> Any:
    try:
        out = model(*args, **kwargs)
        outputs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
        graph = _graph(outputs)
        sum((o.float().sum() if o.requires_grad else 0) for o in outputs).backward()
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))
    params = [p.grad for p in model.parameters()]
    return ([coverage._plain(o) for o in outputs], [coverage._plain(g) if g is not None else None
                                                    for g in [x.grad for x in leaves] + params], graph)


@pytest.mark.parametrize("info", _module_cases(), ids=lambda info: info.name)
def test_fast_lanes_equal_the_readable_path_on_module_samples(info: Any) -> None:
    _assert_identical(_run_module(info, readable=False), _run_module(info, readable=True), info.name)


@needs_lanes
def test_the_common_call_takes_a_generated_lane():
    x, w = tt.randn(3, 4, requires_grad=True), tt.randn(5, 4, requires_grad=True)
    y = torch.nn.functional.linear(torch.tanh(x * 2 + x), w).relu().sum()
    for func, n_args in ((torch.Tensor.mul, 2), (torch.Tensor.add, 2), (torch.tanh, 1),
                         (torch.nn.functional.linear, 2), (torch.Tensor.relu, 1), (torch.Tensor.sum, 1)):
        assert LANES[RULES[func]][n_args].__name__ == f"record_{RULES[func].__name__}_{n_args}"
    assert y.grad_fn.name == "SumBackward"


def test_inside_readable_every_call_takes_the_readable_path(monkeypatch):
    from torchtrace.autograd import dispatch

    seen = []
    run_rule = dispatch.run_rule
    monkeypatch.setattr(dispatch, "run_rule", lambda *call: seen.append(call[2]) or run_rule(*call))
    x = tt.randn(3, requires_grad=True)
    with tt.readable():
        (x * x).sum()
    assert torch.Tensor.mul in seen and torch.Tensor.sum in seen


@needs_lanes
def test_a_lane_is_python_source_with_a_filename_inside_the_package():
    source = lane_source(RULES[torch.mul], 2)  # a hand-written rule: its own forward runs
    assert source.startswith("def record_Mul_2(T, func, args):") and "forward(ctx, a0, a1)" in source
    table = lane_source(RULES[torch.tanh], 1)  # a table rule: the op, and its saves written out
    assert "out = op(a0)" in table and "ctx._saved, ctx._versions = (None, out), [None, out._version]" in table
    assert "ctx._saved, ctx._versions = (a0, a1, None), [a0._version, version_of(a1), None]" in lane_source(
        RULES[torch.atan2], 2)  # only a needs a gradient: b may be a number, which version_of gives none
    x = tt.randn(2, requires_grad=True)
    torch.tanh(x)
    code = LANES[RULES[torch.tanh]][1].__code__
    assert pathlib.Path(code.co_filename).parent == pathlib.Path(tt.__file__).parent / "lanes"


@pytest.mark.parametrize("by_keyword", [False, True])
def test_an_inplace_flag_set_takes_the_readable_path(by_keyword):
    x = tt.randn(4, requires_grad=True)
    for _ in range(2):  # the second call: the keyword's place is known (arguments.KEYWORD_PLANS)
        y = x * 1
        torch.nn.functional.relu(y, inplace=True) if by_keyword else torch.nn.functional.relu(y, True)
        assert y.grad_fn.name == "ReluBackward"  # y itself was written: recorded as y.relu_()
    x.grad = None
    y.sum().backward()
    assert torch.equal(x.grad, (x > 0).to(x.dtype))
    assert "if flag is not None and flag < 2 and args[flag]" in lane_source(RULES[torch.relu], 2)


def test_a_rule_registered_later_replaces_the_lane():
    x = tt.randn(3, requires_grad=True)
    before = torch.atan2(x, x)

    class Twice(tt.Function):
        """y = 2 a (a stand-in)"""

        _tt_trusted = True  # as torchtrace's own rules: it takes a lane

        @staticmethod
        def forward(ctx, a, b):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    old = RULES[torch.atan2]
    try:
        tt.register(torch.atan2, Twice)
        assert torch.atan2(x, x).grad_fn.name == "TwiceBackward"
    finally:
        tt.register(torch.atan2, old)
    assert before.grad_fn.name == torch.atan2(x, x).grad_fn.name == "Atan2Backward"



@pytest.mark.parametrize("change", ["setitem", "update", "pop"])
def test_every_change_of_the_rule_table_reaches_the_lanes(change):
    x = tt.randn(3, requires_grad=True)
    torch.atan2(x, x)  # its lanes are cached by callable

    class Halved(tt.Function):
        """y = a / 2 (a stand-in)"""

        _tt_trusted = True  # as torchtrace's own rules: it takes a lane

        @staticmethod
        def forward(ctx, a, b):
            return a / 2

        @staticmethod
        def backward(ctx, g):
            return g / 2, None

    old = RULES[torch.atan2]
    try:
        if change == "setitem":
            RULES[torch.atan2] = Halved
        elif change == "update":
            RULES.update({torch.atan2: Halved})
        else:
            RULES.pop(torch.atan2)
        if change == "pop":  # no rule: refused, as for any op without one
            with pytest.raises(Exception, match="atan2"):
                torch.atan2(x, x)
        else:
            torch.atan2(x, x).sum().backward()
            assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.full((3,), 0.5))
    finally:
        RULES[torch.atan2] = old
    x.grad = None
    torch.atan2(x, x).sum().backward()  # the rule put back is the one that runs again: d/dx atan2(x, x) = 0
    assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.zeros(3))


@pytest.mark.parametrize("readable", [False, True])
@pytest.mark.parametrize("pack", ["identity", "copy"])
@pytest.mark.parametrize("op", [torch.tanh, torch.sigmoid, torch.exp, torch.sqrt, torch.rsqrt])
def test_a_result_saved_under_saved_tensors_hooks_refuses_create_graph_on_both_paths(op, pack, readable):
    """A rule that saves its result, under torch's saved_tensors_hooks: what unpack returns is no tracer of the node,
    so a second derivative through it would lose the result's own dependence on x (with a copying pack the readable
    path gave a silently wrong one): create_graph is refused on both paths; the first derivative is torch's."""
    x0 = torch.rand(3, dtype=torch.float64) + 0.5
    x, xt = tt.as_tracer(x0.clone(), requires_grad=True), x0.clone().requires_grad_()
    hooks = (lambda t: t, lambda t: t) if pack == "identity" else (lambda t: t.clone(), lambda t: t)
    with tt.readable() if readable else contextlib.nullcontext():
        with torch.autograd.graph.saved_tensors_hooks(*hooks):
            y, yt = op(x), op(xt)
        with pytest.raises(RuntimeError, match="create_graph=True through tensors saved under"):
            tt.grad((y * y).sum(), [x], create_graph=True)
        g, = tt.grad((y * y).sum(), [x])
    torch.testing.assert_close(g.as_subclass(torch.Tensor), torch.autograd.grad((yt * yt).sum(), [xt])[0],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("readable", [False, True])
def test_a_users_rule_runs_as_a_custom_function_on_both_paths(readable):
    """A rule registered by a user is no rule of torchtrace's: on either path its forward runs without grad mode (as
    torch runs a Function's forward) and a view it returns is refused in-place changes (its own backward would be
    skipped), as in torch."""
    from torch.overrides import handle_torch_function

    def scaled(x):
        return x * 1

    def flat(x):
        return x.view(-1)

    class Scaled(tt.Function):
        """y = x: 1 without grad mode, 100 with it (a probe)"""

        @staticmethod
        def forward(ctx, x):
            return x * (100 if torch.is_grad_enabled() else 1)

        @staticmethod
        def backward(ctx, g):
            return g

    class Flat(tt.Function):
        """y = x flattened, dx = 10 g (a gradient of its own)"""

        @staticmethod
        def forward(ctx, x):
            return x.view(-1)

        @staticmethod
        def backward(ctx, g):
            return 10 * g.view(2, 3)

    tt.register(scaled, Scaled)
    tt.register(flat, Flat)
    x = tt.as_tracer(torch.ones(2, 3, dtype=torch.float64), requires_grad=True)
    try:
        with tt.readable() if readable else contextlib.nullcontext():
            ones = torch.ones(2, 3, dtype=torch.float64)
            assert torch.equal(coverage._plain(handle_torch_function(scaled, (x,), x)), ones)
            y = handle_torch_function(flat, (x,), x * 1)
            with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
                y.mul_(2)
            handle_torch_function(flat, (x,), x * 1).sum().backward()
    finally:  # (the rule table lists what is registered: the op listing's tests read it)
        RULES.pop(scaled)
        RULES.pop(flat)
    torch.testing.assert_close(coverage._plain(x.grad), torch.full((2, 3), 10.0, dtype=torch.float64), rtol=0, atol=0)


def test_inference_tensors_take_the_readable_path():
    with torch.inference_mode():
        w = torch.randn(3)
    x = tt.randn(3, requires_grad=True)
    with tt.readable():
        expected = pytest.raises(RuntimeError)
        with expected as readable_error:
            x * w
    with pytest.raises(RuntimeError) as fast_error:
        x * w
    assert str(fast_error.value) == str(readable_error.value)


def test_ops_show_prints_a_rules_generated_lane(capsys):
    from torchtrace.__main__ import main

    main(["ops", "--show", "Tanh"])
    printed = capsys.readouterr().out
    assert "def record_Tanh_1(T, func, args):" in printed and "def backward_Tanh(ctx, g):" in printed
    with pytest.raises(SystemExit, match="no rule named 'Tanhh'"):
        main(["ops", "--show", "Tanhh"])
    main(["ops", "--show", "MseLoss"])  # a loss's rule takes its torch function's arguments, all six
    printed = capsys.readouterr().out
    assert "def record_MseLoss_6(T, func, args):" in printed and "no lane" not in printed


def test_a_generated_backward_step_calls_the_table_formula():
    from torchtrace.lanes.walk import step_source

    assert "grad_0(g, x, y, **ctx.options)" in step_source(RULES[torch.sum])
    assert step_source(RULES[torch.mul]) is None  # a hand-written rule: its backward is already code


def test_the_lanes_save_what_the_readable_path_saves():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                        torch.nn.Linear(8, 1), torch.nn.Sigmoid()))
    x = tt.randn(5, 4, requires_grad=True)

    def saved_per_node(readable: bool) -> List[Tuple[str, int]]:
        with tt.readable() if readable else contextlib.nullcontext():
            y = (model(x) * x.sum(1, keepdim=True) - x.mean()).sum()
        return [(node.name, sum(s is not None for s in node.saved)) for node in topological_order([y.grad_fn])
                if hasattr(node, "saved")]

    assert saved_per_node(readable=False) == saved_per_node(readable=True)


@pytest.mark.parametrize("holds", ["saves", "marks", "keeps", "returns"])
def test_a_hand_written_rule_that_holds_its_result_is_linked_as_the_readable_path_links_it(holds):
    """A lane links a hand-written rule's result itself only when nothing else holds it: a result the rule saved,
    marked non-differentiable, kept on ctx or handed back as it came goes the readable path's way (gradients and
    graphs equal, the saved result no tracer of its own node)."""

    class Doubled(tt.Function):
        """y = 2 a: dy/da = 2 (a stand-in that holds its result in one way or another)"""

        _tt_trusted = True  # as torchtrace's own rules: it takes a lane (a user's rule takes run_rule)

        @staticmethod
        def forward(ctx, a, b):
            out = a if holds == "returns" else a * 2
            if holds == "saves":
                ctx.save_for_backward(out)
            elif holds == "marks":
                ctx.mark_non_differentiable(out)
            elif holds == "keeps":
                ctx.out = out
            return out

        @staticmethod
        def backward(ctx, g):
            return g if holds == "returns" else g * 2, None

    def run(readable: bool) -> Tuple[Any, ...]:
        x = tt.as_tracer(torch.arange(3.0), requires_grad=True)
        with tt.readable() if readable else contextlib.nullcontext():
            y = torch.atan2(x, x)
            graph = _graph([y])
            saved = getattr(y.grad_fn, "saved", ())  # (read before the backward frees it)
            if y.requires_grad:
                (y * y).sum().backward()
        return (coverage._plain(y), y.requires_grad, graph, None if x.grad is None else coverage._plain(x.grad),
                [type(s).__name__ for s in saved])

    old = RULES[torch.atan2]
    try:
        tt.register(torch.atan2, Doubled)
        fast, reference = run(readable=False), run(readable=True)
    finally:
        tt.register(torch.atan2, old)
    _assert_identical(list(fast), list(reference), holds)
    if holds != "marks":  # d/dx (2x)^2 = 8x, or d/dx x^2 = 2x for the result handed back
        expected = torch.arange(3.0) * (2 if holds == "returns" else 8)
        torch.testing.assert_close(fast[3], expected, rtol=0, atol=0)
    if holds == "saves":
        assert fast[4] == ["Tensor"]  # the saved result stays plain: no tracer of its own node


@pytest.mark.parametrize("readable", [False, True])
@pytest.mark.parametrize("op", [torch.tanh, torch.sigmoid, torch.exp])
def test_a_result_its_rule_saved_is_no_view_and_an_inplace_change_is_refused_as_torch(op, readable):
    """The tracer over a result its own rule saved (y = tanh x keeps y) is a detached alias of it: no view (torch's
    result is none), its gradient torch's and central differences', and an in-place change of it before backward
    refused."""
    x0 = torch.rand(3, 4, dtype=torch.float64)
    x, xt = tt.as_tracer(x0.clone(), requires_grad=True), x0.clone().requires_grad_()
    with tt.readable() if readable else contextlib.nullcontext():
        y = op(x)
        assert y._is_view() == op(xt)._is_view() is False
        (y * y).sum().backward()
    (op(xt) * op(xt)).sum().backward()
    torch.testing.assert_close(x.grad, xt.grad, rtol=0, atol=1e-12)
    with tt.readable() if readable else contextlib.nullcontext():
        assert tt.gradcheck(lambda v: (op(v) * op(v)).sum(), x0.clone())  # and central differences
        y = op(x)
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            y.sum().backward()


def test_the_environment_variable_selects_the_readable_path_for_a_whole_run():
    import os
    import subprocess
    import sys

    probe = ("import torchtrace as tt; from torchtrace.autograd import dispatch, engine; "
             "print(tt.tracer.__torch_function__.__func__ is dispatch.torch_function, engine.WALK[0] is engine._walk)")
    env = {**os.environ, "TORCHTRACE_READABLE": "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


KEYWORD_CALLS = {  # torch.nn.functional passes its options to __torch_function__ as keywords
    "mse_loss": lambda x, t: F.mse_loss(x, t, reduction="sum"),
    "l1_loss": lambda x, t: F.l1_loss(x, t),
    "relu": lambda x, t: F.relu(x) * t,
    "softmax": lambda x, t: F.softmax(x, dim=-1) * t,
    "leaky_relu": lambda x, t: F.leaky_relu(x, negative_slope=0.2) * t,
    "dropout, not training": lambda x, t: F.dropout(x, p=0.3, training=False) * t,
}


@pytest.mark.parametrize("name", KEYWORD_CALLS)
def test_a_call_with_keywords_takes_its_lane_once_their_places_are_known(name, monkeypatch):
    from torchtrace.lanes import forward

    call = KEYWORD_CALLS[name]
    generator = torch.Generator().manual_seed(0)
    x0, t0 = (torch.randn(3, 5, generator=generator, dtype=torch.float64) for _ in range(2))

    def gradients(readable: bool) -> List[torch.Tensor]:
        x, t = tt.tracer(x0.clone(), requires_grad=True), tt.tracer(t0.clone(), requires_grad=True)
        with tt.readable() if readable else contextlib.nullcontext():
            call(x, t).sum().backward()
        return [x.grad.as_subclass(torch.Tensor), t.grad.as_subclass(torch.Tensor)]

    gradients(readable=False)  # the first call places the keywords (on the readable path)
    readable_calls = []
    original = forward.readable_torch_function
    monkeypatch.setattr(forward, "readable_torch_function",
                        lambda *a, **k: readable_calls.append(a[1]) or original(*a, **k))
    ours = gradients(readable=False)
    assert not [f for f in readable_calls if f in RULES]  # every recorded call took a lane
    assert all(torch.equal(a, b) for a, b in zip(ours, gradients(readable=True)))
    x, t = x0.clone().requires_grad_(), t0.clone().requires_grad_()
    torch.autograd.backward(call(x, t).sum())
    torch.testing.assert_close(ours, [x.grad, t.grad])
    assert tt.gradcheck(call, tt.tracer(x0.clone(), requires_grad=True), tt.tracer(t0.clone(), requires_grad=True))


VIEW_CALLS = {  # a view as an argument, its base changed in place after the view was taken (or not)
    "view of a changed base": lambda x, t: _changed_base_view(x, t) * t[1:],
    "transposed view": lambda x, t: (x * 2).t() @ t,
    "list of ints (layer norm's shape)": lambda x, t: F.layer_norm(x * t, [5]),
}


def _changed_base_view(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    base = x * 1
    view = base[1:]
    base.mul_(t)  # the view sees it: its gradient must go through the in-place multiplication
    return view.exp()


@pytest.mark.parametrize("name", VIEW_CALLS)
def test_views_and_lists_without_tensors_take_the_lane(name, monkeypatch):
    from torchtrace.lanes import forward

    call = VIEW_CALLS[name]
    generator = torch.Generator().manual_seed(1)
    x0 = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    t0 = torch.randn(3, 4 if name == "transposed view" else 5, generator=generator, dtype=torch.float64)

    def gradients(readable: bool) -> List[torch.Tensor]:
        x, t = tt.tracer(x0.clone(), requires_grad=True), tt.tracer(t0.clone(), requires_grad=True)
        with tt.readable() if readable else contextlib.nullcontext():
            out = call(x, t)
            out.sum().backward()
        return [x.grad.as_subclass(torch.Tensor), t.grad.as_subclass(torch.Tensor)]

    gradients(readable=False)
    lane_fallbacks = []
    original = forward.run_rule
    monkeypatch.setattr(forward, "run_rule", lambda *a, **k: lane_fallbacks.append(a[1]) or original(*a, **k))
    for lanes in forward.LANES.values():  # the generated lanes read run_rule from their own namespace
        for lane in lanes:
            if "run_rule" in getattr(lane, "__globals__", {}):
                monkeypatch.setitem(lane.__globals__, "run_rule", forward.run_rule)
    ours = gradients(readable=False)
    assert not [rule.__name__ for rule in lane_fallbacks if rule.__name__ != "ViewOfBase"]  # the catch-up's own
    assert all(torch.equal(a, b) for a, b in zip(ours, gradients(readable=True)))
    x, t = x0.clone().requires_grad_(), t0.clone().requires_grad_()
    torch.autograd.backward(call(x, t).sum())
    torch.testing.assert_close(ours, [x.grad, t.grad])
    assert tt.gradcheck(call, tt.tracer(x0.clone(), requires_grad=True), tt.tracer(t0.clone(), requires_grad=True))


@pytest.mark.parametrize("readable", [False, True])
def test_saves_written_out_in_a_lane_go_through_saved_tensors_hooks_as_torchs(readable):
    """A table rule's lane writes its saves out (no save_for_backward call): under torch's saved_tensors_hooks each
    saved tensor still goes through pack, as many times as torch packs, and backward computes on what unpack gave
    (atan2: a table rule; the product by a number: Mul, hand-written)."""
    x0, w0 = torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64)
    results = {}
    for side, make in (("torch", lambda t: t.clone().requires_grad_()),
                       ("tt", lambda t: tt.as_tracer(t.clone(), requires_grad=True))):
        x, w = make(x0), make(w0)
        packed = []
        with tt.readable() if readable and side == "tt" else contextlib.nullcontext():
            with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t.detach() * 2,
                                                          lambda t: t):
                y = torch.atan2(x, w) * 0.5
            y.sum().backward()
        results[side] = (len(packed), coverage._plain(x.grad), coverage._plain(w.grad))
    assert results["tt"][0] == results["torch"][0] == 2  # x and w; for atan2(x, w) * 0.5 only the number 0.5
    for ours, theirs in zip(results["tt"][1:], results["torch"][1:]):  # unpack's values: twice each operand
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
