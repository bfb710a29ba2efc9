"""grad_fn hooks on a compiled call's results: grad_fn is the node of the statement that made the result (as in
eager), and its register_prehook / register_hook hooks run around that statement's rule in the compiled backward."""
from typing import Callable, List

import pytest
import torch
from references import finite_differences, plain

import torchtrace as tt


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ((x @ w.t()).tanh() * 2).sum()


def _double(gs: tuple) -> tuple:
    return (gs[0] * 2,)


def _halve_inputs(grad_inputs: tuple, grad_outputs: tuple) -> tuple:
    return tuple(None if g is None else g / 2 for g in grad_inputs)


HOOKS = {"pre-hook doubling": ("register_prehook", _double), "post-hook halving": ("register_hook", _halve_inputs),
         "post-hook watching": ("register_hook", None)}


def _run(fn: Callable, x: torch.Tensor, w: torch.Tensor, kind: str, hook: Callable, seen: List) -> torch.Tensor:
    loss = fn(x, w)
    if hook is None:
        def hook(grad_inputs, grad_outputs):
            seen.append(([plain(g) for g in grad_inputs], [plain(g) for g in grad_outputs]))
    getattr(loss.grad_fn, kind)(hook)
    loss.backward()
    return loss


@pytest.mark.parametrize("name", list(HOOKS))
def test_a_hook_on_the_results_grad_fn_acts_as_in_eager_and_torch(name):
    kind, hook = HOOKS[name]
    torch.manual_seed(0)
    w0 = torch.randn(3, 4, dtype=torch.float64)
    w = tt.tracer(w0, requires_grad=True)
    compiled = tt.compile(_fn, ())
    for _ in range(4):
        x0 = torch.randn(2, 4, dtype=torch.float64)
        x = tt.tracer(x0, requires_grad=True)
        results = []
        for fn in (compiled, _fn):
            seen: list = []
            w.grad = x.grad = None
            loss = _run(fn, x, w, kind, hook, seen)
            assert loss.grad_fn.name() == "SumBackward"
            results.append((plain(w.grad), plain(x.grad), seen))
        x_, w_ = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        seen_torch: list = []
        _run(_fn, x_, w_, kind, hook, seen_torch)
        (ours_w, ours_x, ours_seen), (eager_w, eager_x, eager_seen) = results
        assert torch.equal(ours_w, eager_w) and torch.equal(ours_x, eager_x)
        torch.testing.assert_close(ours_w, w_.grad)
        torch.testing.assert_close(ours_x, x_.grad)
        assert len(ours_seen) == len(eager_seen) == len(seen_torch) == (1 if hook is None else 0)
        for (gi, go), (egi, ego), (tgi, tgo) in zip(ours_seen, eager_seen, seen_torch):
            assert len(gi) == len(egi) == len(tgi) == 1 and len(go) == len(ego) == len(tgo) == 1
            assert torch.equal(gi[0], egi[0]) and torch.equal(go[0], ego[0])
            torch.testing.assert_close(gi[0], tgi[0])
        factor = {"pre-hook doubling": 2.0, "post-hook halving": 0.5}.get(name, 1.0)
        numeric = finite_differences(lambda: _fn(x0, w0) * factor, [w0])[0]
        torch.testing.assert_close(ours_w, numeric, rtol=1e-5, atol=1e-6)
    assert compiled.replayed == 3


def test_grad_fn_of_a_replayed_result_is_the_node_of_its_statement():
    w = tt.tracer(torch.randn(3, 4), requires_grad=True)
    compiled = tt.compile(lambda x: (x @ w.t()).relu(), ())
    for _ in range(3):
        out = compiled(tt.tracer(torch.randn(2, 4)))
        eager = (tt.tracer(torch.randn(2, 4)) @ w.t()).relu()
        assert out.grad_fn.name() == eager.grad_fn.name() == "ReluBackward"
        assert out.grad_fn is out.grad_fn and "grad_fn=<ReluBackward>" in repr(out)
        later = compiled(tt.tracer(torch.randn(2, 4)))
        later.sum().backward()
        assert later.grad_fn.name() == "ReluBackward" and later.grad_fn.released  # read first once freed
    assert compiled.replayed == 5


def test_module_full_backward_hooks_inside_a_compiled_call_see_eagers_and_torchs_gradients():
    """torch.nn's full backward hooks are built on grad_fn hooks of the module's results."""
    import copy

    from torchtrace.port import port

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    ported = port(copy.deepcopy(model))
    seen: list = []
    for m in (model, ported):
        m[2].register_full_backward_hook(lambda mod, gi, go: seen.append((plain(gi[0]), plain(go[0]))))
        m[0].register_full_backward_pre_hook(lambda mod, go: (go[0] * 3,))
    compiled = tt.compile(lambda x: ported(x).pow(2).sum(), ())
    for _ in range(3):
        x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
        runs = []
        for fn, m, inputs in ((compiled, ported, tt.tracer(x.detach(), requires_grad=True)),
                              (lambda t: ported(t).pow(2).sum(), ported, tt.tracer(x.detach(), requires_grad=True)),
                              (lambda t: model(t).pow(2).sum(), model, x)):
            seen.clear()
            m.zero_grad(set_to_none=True)
            fn(inputs).backward()
            runs.append(([plain(p.grad) for p in m.parameters()] + [plain(inputs.grad)], list(seen)))
        (ours, ours_seen), (eager, eager_seen), (expected, torch_seen) = runs
        assert len(ours_seen) == len(eager_seen) == len(torch_seen) == 1
        for a, b, c in zip(ours + list(ours_seen[0]), eager + list(eager_seen[0]), expected + list(torch_seen[0])):
            assert torch.equal(a, b)
            torch.testing.assert_close(a, c)
    assert compiled.replayed == 2


@pytest.mark.parametrize("kind", ["register_prehook", "register_hook"])
def test_a_hook_on_an_inner_results_grad_fn_runs_after_both_are_dropped(kind):
    """The grad_fn of a result inside the compiled call is held weakly by its statement (no reference cycle) until a
    hook is registered on it: then the statement holds it, and the hook runs as eager's would."""
    w = tt.tracer(torch.randn(3, 3, dtype=torch.float64), requires_grad=True)
    x = torch.randn(2, 3, dtype=torch.float64)
    ran = []

    def record(*args):
        ran.append(len(args))

    def f(x, hook):
        h = (x @ w).tanh()
        if hook:
            getattr(h.grad_fn, kind)(record)  # h and its grad_fn are not used again
        return (h * 2).sum()

    compiled = tt.compile(f, (x, False))
    for expected, hook in enumerate((True, True, True), start=1):
        compiled(x, hook).backward()
        f(x, hook).backward()
        assert len(ran) == 2 * expected
