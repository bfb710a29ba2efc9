"""The generated backward of a compiled node: the same bits as the interpreted steps, right against torch autograd
and finite differences, and the step-by-step path wherever the generated one cannot serve a call."""
import copy

import pytest
import torch
import torch.nn.functional as F
from test_port import GPT, LeNet, sequence_loss

import torchtrace as tt
import torchtrace.compiler.segment as segment_module
from torchtrace.compiler.segment import Segment
from torchtrace.compiler.segment_code import generated_backward
from torchtrace.compiler.step_code import LayoutDiffers, StepCode, expect
from torchtrace.port import port


@pytest.fixture
def generated_runs(monkeypatch):
    """How many backwards of compiled nodes ran generated code."""
    count = [0]

    def counting(*args):
        count[0] += 1
        return generated_backward(*args)

    monkeypatch.setattr(segment_module, "generated_backward", counting)
    return count


def interpreted(monkeypatch):
    monkeypatch.setattr(Segment, "_run_generated", lambda self, grads, retain: None)


def _floats_each_call(x, w, slope, alpha, low, p, smoothing, target):
    h = F.leaky_relu(x @ w, slope)
    h = F.elu(h, alpha).clamp(low, 3.0)
    h = (h.abs() + 0.5).pow(p)
    return F.cross_entropy(h, target, label_smoothing=smoothing)


def _mlp_loss(x, w1, b1, w2, b2, target):
    return F.mse_loss(torch.tanh(x @ w1 + b1) @ w2 + b2, target)


def _chunked(x, w):
    a, b = (x @ w).chunk(2, dim=1)
    return (torch.sigmoid(a) * b).sum() + a.max(dim=1).values.sum()


CASES = {
    "mlp": (_mlp_loss, lambda: [torch.randn(8, 2), torch.randn(2, 16), torch.randn(16), torch.randn(16, 1),
                                torch.randn(1), torch.randn(8, 1)], (1, 2, 3, 4)),
    "floats": (_floats_each_call, lambda: [torch.randn(6, 4), torch.randn(4, 5), 0.01, 1.0, -0.5, 2.0, 0.0,
                                           torch.tensor([0, 1, 4, 2, 3, 1])], (1,)),
    "chunk": (_chunked, lambda: [torch.randn(3, 4), torch.randn(4, 6)], (0, 1)),
}
CALLS = {"floats": [dict(), {2: 0.2, 3: 0.7, 4: -0.25, 5: 1.5, 6: 0.1}, {2: 0.05, 6: 0.0, 5: 3.0}]}


def _run(name, dtype=torch.float64):
    """Gradients of each call of the compiled case (floats changed per call where the case says)."""
    fn, make, needing = CASES[name]
    torch.manual_seed(0)
    values = [v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in make()]
    inputs = [tt.tracer(v, requires_grad=i in needing) if isinstance(v, torch.Tensor) else v
              for i, v in enumerate(values)]
    compiled = tt.compile(fn, tuple(inputs))
    grads = []
    for change in [dict()] + CALLS.get(name, [dict(), dict()]):
        call = [change.get(i, v) for i, v in enumerate(inputs)]
        for i in needing:
            inputs[i].grad = None
        compiled(*call).backward()
        grads.append([inputs[i].grad.clone() for i in needing])
    return grads, values, needing


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_equals_interpreted_bit_for_bit(name, monkeypatch, generated_runs):
    generated, _, _ = _run(name)
    assert generated_runs[0] >= 2  # the replayed calls' backwards ran generated code
    interpreted(monkeypatch)
    stepped, _, _ = _run(name)
    for a, b in zip(generated, stepped):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_matches_torch_autograd_and_finite_differences(name, generated_runs):
    generated, values, needing = _run(name)
    fn = CASES[name][0]
    calls = [dict()] + CALLS.get(name, [dict(), dict()])
    for change, got in zip(calls, generated):
        call = [change.get(i, v) for i, v in enumerate(values)]
        leaves = [call[i].clone().requires_grad_() for i in needing]
        torch_call = list(call)
        for i, leaf in zip(needing, leaves):
            torch_call[i] = leaf
        expected = torch.autograd.grad(fn(*torch_call), leaves)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)
        for g, i in zip(got, needing):  # central differences on a few entries
            flat = call[i].reshape(-1)
            for j in range(0, flat.numel(), max(1, flat.numel() // 5)):
                up, down = list(call), list(call)
                up[i], down[i] = call[i].clone(), call[i].clone()
                up[i].view(-1)[j] += 1e-6
                down[i].view(-1)[j] -= 1e-6
                numeric = (fn(*up) - fn(*down)).item() / 2e-6
                assert abs(g.reshape(-1)[j].item() - numeric) <= 1e-5 * max(1.0, abs(numeric))
    assert generated_runs[0] >= 2


def _mixed(x, w, b, s):
    """float32 and float64 inputs, broadcast: the gradients of w, b and s are summed to their shapes and cast back."""
    h = x * w + b
    return (h * s).sin() + h.exp() * x


def _mixed_inputs():
    g = torch.Generator().manual_seed(5)
    return [torch.rand(4, 3, generator=g), torch.rand(3, generator=g, dtype=torch.float64),
            torch.rand(1, 3, generator=g), torch.rand((), generator=g)]


def _mixed_grads(values, gradient, compiled=None):
    leaves = [tt.tracer(v, requires_grad=True) for v in values]
    for _ in range(3):  # the first call records, the others replay
        for leaf in leaves:
            leaf.grad = None
        (compiled or _mixed)(*leaves).backward(gradient)
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("gradient_dtype", [torch.float64, torch.float32])
def test_gradients_summed_and_cast_where_the_trace_knows_their_shapes_and_dtypes(gradient_dtype, monkeypatch,
                                                                                generated_runs):
    """The generated backward sums and casts by what the trace knows of each gradient (no shape or dtype read): bit
    for bit eager's and the step-by-step path's, torch autograd's and finite differences', whatever dtype the
    gradient backward starts from (the engine gives each node gradients of its outputs' dtypes)."""
    values = _mixed_inputs()
    gradient = torch.linspace(-1, 1, 12, dtype=gradient_dtype).reshape(4, 3)
    compiled = tt.compile(_mixed, tuple(values))
    generated = _mixed_grads(values, gradient, compiled)
    assert generated_runs[0] >= 2
    assert "_g.shape" not in compiled.backward_code and "sum_to_size" in compiled.backward_code
    eager = _mixed_grads(values, gradient)
    interpreted(monkeypatch)
    stepped = _mixed_grads(values, gradient, tt.compile(_mixed, tuple(values)))
    leaves = [v.clone().requires_grad_() for v in values]
    _mixed(*leaves).backward(gradient)
    for got, e, s, leaf in zip(generated, eager, stepped, leaves):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
        assert torch.equal(got, e) and torch.equal(got, s)
        torch.testing.assert_close(got.as_subclass(torch.Tensor), leaf.grad)
    wide = [v.double() for v in values]  # central differences of <gradient, f> in float64
    for i, got in enumerate(generated):
        for j in range(got.numel()):
            up, down = [v.clone() for v in wide], [v.clone() for v in wide]
            up[i].view(-1)[j] += 1e-6
            down[i].view(-1)[j] -= 1e-6
            numeric = ((_mixed(*up) - _mixed(*down)) * gradient.double()).sum().item() / 2e-6
            assert abs(got.reshape(-1)[j].item() - numeric) <= 1e-4 * max(1.0, abs(numeric))


@pytest.mark.parametrize("name", ["lenet", "gpt"])
def test_models_generated_equals_interpreted_and_torch(name, monkeypatch, generated_runs):
    def grads_of_three_steps():
        torch.manual_seed(0)
        if name == "lenet":
            twin, x, target = LeNet(), torch.randn(2, 1, 28, 28).double(), torch.tensor([3, 7])
            loss_fn = F.cross_entropy
        else:
            twin = GPT(vocab=16, d=16, heads=2, length=8, layers=2)
            x, target, loss_fn = torch.randint(0, 16, (2, 8)), torch.randint(0, 16, (2, 8)), sequence_loss
        twin = twin.double()
        ours = port(copy.deepcopy(twin))
        compiled = tt.compile(lambda inputs, targets: loss_fn(ours(inputs), targets), (x, target))
        out = []
        for _ in range(3):
            for p in ours.parameters():
                p.grad = None
            compiled(x, target).backward()
            out.append([p.grad.clone() for p in ours.parameters()])
        loss_fn(twin(x), target).backward()
        return out, [p.grad for p in twin.parameters()]

    generated, torch_grads = grads_of_three_steps()
    assert generated_runs[0] >= 2
    for g, t in zip(generated[-1], torch_grads):
        torch.testing.assert_close(g, t)
    interpreted(monkeypatch)
    stepped, _ = grads_of_three_steps()
    for a, b in zip(generated, stepped):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def _compiled_mlp():
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 3), tt.tracer(torch.randn(3, 2), requires_grad=True), tt.tracer(
        torch.randn(2), requires_grad=True)
    compiled = tt.compile(lambda x, w, b: torch.tanh(x @ w + b).pow(2).sum(), (x, w, b))
    compiled(x, w, b)
    return compiled, x, w, b


def test_grad_fn_hooks_take_the_step_by_step_path(generated_runs):
    compiled, x, w, b = _compiled_mlp()
    loss = compiled(x, w, b)
    seen = []
    loss.grad_fn.register_prehook(lambda gs: seen.append(gs) or (gs[0] * 2,))
    loss.backward()
    assert generated_runs[0] == 0 and len(seen) == 1
    doubled = w.grad.clone()
    w.grad = None
    compiled(x, w, b).backward()
    assert generated_runs[0] == 1
    torch.testing.assert_close(doubled, 2 * w.grad, rtol=0, atol=0)


def test_retain_grad_and_create_graph_take_the_step_by_step_path(generated_runs):
    compiled, x, w, b = _compiled_mlp()
    loss = compiled(x, w, b)
    loss.retain_grad()
    loss.backward()
    assert generated_runs[0] == 0 and loss.grad.item() == 1.0
    w.grad = None
    (g,) = tt.grad(compiled(x, w, b), [w], create_graph=True)
    assert generated_runs[0] == 0
    g.sum().backward()  # through the re-linked saved results: a plain backward of the compiled node again
    w_ = w.detach().as_subclass(torch.Tensor).clone().requires_grad_()
    plain_b = b.detach().as_subclass(torch.Tensor)
    (g_,) = torch.autograd.grad(torch.tanh(x @ w_ + plain_b).pow(2).sum(), [w_], create_graph=True)
    g_.sum().backward()
    torch.testing.assert_close(w.grad, w_.grad)


REFUSED = "MatmulBackward for backward was modified by an in-place operation"


def test_a_saved_tensor_changed_in_place_is_refused_as_in_eager(generated_runs):
    compiled, x, w, b = _compiled_mlp()
    loss = compiled(x, w, b)
    x.add_(1)  # matmul saved x for w's gradient
    with pytest.raises(RuntimeError, match=REFUSED):
        loss.backward()
    eager = (torch.tanh(x @ w + b)).pow(2).sum()
    x.add_(1)
    with pytest.raises(RuntimeError, match=REFUSED):
        eager.backward()
    assert generated_runs[0] == 1


def test_a_second_backward_is_refused_and_retain_graph_allows_it(generated_runs):
    compiled, x, w, b = _compiled_mlp()
    loss = compiled(x, w, b)
    loss.backward(retain_graph=True)
    first = w.grad.clone()
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * first)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    assert generated_runs[0] == 2


def test_steps_that_save_nothing_run_again_and_the_others_are_freed_as_in_eager(generated_runs):
    """The generated code frees each step's saved tensors as the engine frees a node's: a second backward through a
    step that saved nothing (an add, a sum) runs again, as torch's; one through a step that saved is refused; a
    statement's grad_fn shown to the user shows its saved tensors freed, as eager's."""
    w = torch.randn(3, 4).requires_grad_()
    tw = tt.as_tracer(w.detach().clone(), requires_grad=True)

    def adds(x, v):
        return (x + v).sum()

    def saves(x, v):
        h = x * v
        return h, (h + 1.0).sum()

    x = torch.randn(3, 4)
    compiled_adds, compiled_saves = tt.compile(adds, (x, tw)), tt.compile(saves, (x, tw))
    for f in (compiled_adds, compiled_saves):
        f(x, tw)  # recorded: the calls below are replayed
    for f, g in ((compiled_adds, adds), (adds, adds)):
        tw.grad, w.grad = None, None
        loss = f(x, tw)
        loss.backward()
        loss.backward()  # nothing saved: runs again
        expected = g(x, w)
        expected.backward()
        expected.backward()
        torch.testing.assert_close(tt_plain(tw.grad), w.grad, rtol=0, atol=0)
    for f in (compiled_saves, saves):
        tw.grad = None
        h, loss = f(x, tw)
        loss.backward()
        assert h.grad_fn.saved == () and h.grad_fn.name == "MulBackward"
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
        w.grad = None
        saves(x, w)[1].backward()
        torch.testing.assert_close(tt_plain(tw.grad), w.grad, rtol=0, atol=0)
    assert generated_runs[0] == 3


def tt_plain(t):
    return t.as_subclass(torch.Tensor).detach()


def test_a_layout_the_trace_did_not_see_goes_step_by_step(monkeypatch):
    compiled, x, w, b = _compiled_mlp()
    compiled(x, w, b).backward()
    expected = w.grad.clone()

    class Raising:
        frees_inline = False  # it has layout checks: nothing is freed before they pass

        def function(self, steps, grads, free):
            raise LayoutDiffers("x0.stride() is (1, 3), the trace was recorded with (3, 1)")

    monkeypatch.setattr(segment_module, "generated_backward", lambda *args: Raising())
    w.grad = None
    compiled(x, w, b).backward()
    assert torch.equal(w.grad, expected)
    with pytest.raises(LayoutDiffers, match="recorded with"):
        expect((1, 3), (3, 1), "x0.stride()")
    expect((3, 1), (3, 1), "x0.stride()")


@pytest.mark.parametrize("draw", [lambda x: F.dropout(x, 0.5), lambda x: F.rrelu(x - 0.5, training=True),
                                  torch.nn.RReLU().train()], ids=["dropout", "rrelu", "RReLU module"])
def test_tracing_a_rule_that_draws_at_record_time_leaves_torchs_random_stream_as_eager(draw):
    x = tt.tracer(torch.randn(4, 4), requires_grad=True)
    wider = tt.tracer(torch.randn(5, 4), requires_grad=True)  # a new path recorded on the third call

    def step(x):
        return (draw(x) * 2.0).sum()

    def run(fn):
        values = []
        for inputs in (x, x, wider, wider):
            x.grad = wider.grad = None
            loss = fn(inputs)
            loss.backward()
            values += [loss.item(), inputs.grad.sum().item()]
        return values + torch.rand(3).tolist()

    torch.manual_seed(5)
    eager = run(step)
    compiled = tt.compile(step, (x,))
    torch.manual_seed(5)
    assert run(compiled) == eager  # the first and third calls record (trace their rules)


def test_recording_leaves_another_threads_random_draws_alone():
    """A rule that draws nothing is traced without touching torch's generator: a thread drawing meanwhile gets the
    numbers it would get alone."""
    import threading

    x = tt.tracer(torch.randn(3, 3), requires_grad=True)
    torch.manual_seed(7)
    expected = [torch.rand(1).item() for _ in range(300)]
    torch.manual_seed(7)
    drawn: list = []
    drawer = threading.Thread(target=lambda: drawn.extend(torch.rand(1).item() for _ in range(300)))
    drawer.start()
    for k in range(20):  # new programs: each call records, tracing its rules
        tt.compile(lambda x, k=k: (torch.tanh(x * (k + 1.5)) @ x).sum(), (x,))(x)
    drawer.join()
    assert drawn == expected


def test_backward_code_shows_the_generated_function():
    compiled, x, w, b = _compiled_mlp()
    compiled(x, w, b).backward()
    source = compiled.backward_code
    assert source.startswith("def backward(S, G, free):") and "# Tanh" in source and "_c._refuse()" in source
    traced = [st for path in compiled.program.paths() for st in path if isinstance(st.code, StepCode)]
    assert {st.rule.__name__ for st in traced} >= {"Matmul", "Add", "Tanh", "Pow"}


def test_a_rule_branching_on_a_float_is_traced_for_the_float_it_had(monkeypatch):
    """CrossEntropy branches on label_smoothing == 0: its code holds for 0.0, checked on every backward (0.1 calls the
    rule; -0.0 too: not the same bits); each call equals eager torchtrace and torch autograd."""
    x, target = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 4, 2])
    w = tt.tracer(torch.randn(5, 5, dtype=torch.float64), requires_grad=True)

    def loss(x, w, target, smoothing):
        return F.cross_entropy(x @ w, target, label_smoothing=smoothing)

    compiled = tt.compile(loss, (x, w, target, 0.0))
    for smoothing in (0.0, 0.0, 0.1, 0.0, -0.0, 0.3):
        w.grad = None
        compiled(x, w, target, smoothing).backward()
        got, w.grad = w.grad, None
        loss(x, w, target, smoothing).backward()
        assert torch.equal(got, w.grad)
        plain = w.detach().as_subclass(torch.Tensor).clone().requires_grad_()
        loss(x, plain, target, smoothing).backward()
        torch.testing.assert_close(got, plain.grad, rtol=1e-12, atol=1e-12)
    cross_entropy = [st for path in compiled.program.paths() for st in path if st.rule.__name__ == "CrossEntropy"]
    assert cross_entropy[0].code.fixed_floats == (0.0,)
    assert "_same_floats(S[1].floats" in compiled.backward_code


def test_a_numpy_float_stays_its_rules_call_and_is_read_each_call(generated_runs):
    import numpy as np

    x = tt.tracer(torch.randn(3, 3), requires_grad=True)

    def loss(x, slope):
        return (F.leaky_relu(x, slope) * slope).sum()

    compiled = tt.compile(loss, (x, np.float64(0.1)))
    for slope in (np.float64(0.1), np.float64(0.3), np.float64(0.3)):
        x.grad = None
        compiled(x, slope).backward()
        got, x.grad = x.grad, None
        loss(x, slope).backward()
        assert torch.equal(got, x.grad)
    assert all(isinstance(st.code, str) and "numpy" in st.code for st in compiled.program.paths()[0][:2])
    assert generated_runs[0] >= 2
