"""A compiled call never replays a stale value: the function's Python runs on every call, whatever it observes.

Each test compiles a function, changes what it observes, and compares the compiled call with eager
torchtrace (values and gradients). These were the guard model's cases; now they are plain Python.
"""
import collections
import dataclasses
import random
import threading
import warnings

import numpy as np
import pytest
import torch

import torchtrace as tt

ONES, NEG = torch.ones(3), -torch.ones(3)


def plain(t):
    return t.detach().as_subclass(torch.Tensor)


def assert_replays_eager(fn, first, later, params=()):
    """Compile on `first`, then every input in `later`: output and parameter gradients equal eager's."""
    compiled = tt.compile(fn, first)
    compiled(*first)
    for args in later:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(*args)
        got_grads = _grads(got, params)
        expected = fn(*args)
        torch.testing.assert_close(plain(got), plain(expected), rtol=0, atol=0)
        for g, e in zip(got_grads, _grads(expected, params)):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
    return compiled


def _grads(out, params):
    if not params:
        return []
    for p in params:
        p.grad = None
    out.sum().backward()
    return [plain(p.grad) for p in params]


@pytest.mark.parametrize("read", [
    lambda x: torch.equal(x, torch.ones(3)),
    lambda x: x.equal(torch.ones(3)),
    lambda x: torch.allclose(x, torch.ones(3)),
    lambda x: 1.0 in x,
    lambda x: torch.is_nonzero(x.sum() > 0),
    lambda x: f"{x.sum():.1f}" == "3.0",
    lambda x: len(torch.where(x > 0)[0]) == 3,
    lambda x: repr(x.sum()).startswith("tensor(3"),
], ids=["torch.equal", "Tensor.equal", "allclose", "in", "is_nonzero", "format", "len-where", "repr"])
def test_every_python_read_of_tensor_data_runs_whatever_api_reads_it(read):
    w = tt.randn(3, requires_grad=True)
    assert_replays_eager(lambda x: (x * w).exp() if read(x) else (x * w).sin(), (ONES,), [(NEG,), (ONES,)], [w])


def test_a_value_read_through_numpy_is_read_on_every_call():
    w = tt.randn(3, requires_grad=True)
    assert_replays_eager(lambda x: x * w * float(np.asarray(x).sum()), (ONES,), [(NEG,), (ONES * 3,)], [w])


def test_a_shape_that_follows_from_values_is_followed_for_any_op():
    assert_replays_eager(lambda x: x * torch.where(x > 0)[0].shape[0], (ONES,), [(torch.tensor([1.0, -1, 1]),)])


def test_a_replaced_parameter_submodule_or_new_hook_is_seen():
    model = tt.nn.Sequential(tt.nn.Linear(3, 2), tt.nn.Tanh())
    compiled = assert_replays_eager(lambda x: model(x), (ONES,), [(ONES,)])
    model[0].weight = tt.nn.Parameter(tt.randn(2, 3))
    torch.testing.assert_close(plain(compiled(ONES)), plain(model(ONES)), rtol=0, atol=0)
    model[0].load_state_dict({"weight": torch.randn(2, 3), "bias": torch.randn(2)}, assign=True)
    torch.testing.assert_close(plain(compiled(ONES)), plain(model(ONES)), rtol=0, atol=0)
    model[1] = tt.nn.Sigmoid()
    torch.testing.assert_close(plain(compiled(ONES)), plain(model(ONES)), rtol=0, atol=0)
    handle = model[0].register_forward_hook(lambda m, i, o: o * 10)
    torch.testing.assert_close(plain(compiled(ONES)), plain(model(ONES)), rtol=0, atol=0)
    handle.remove()
    model[0].register_forward_pre_hook(lambda m, i: (i[0] * 2,))
    torch.testing.assert_close(plain(compiled(ONES)), plain(model(ONES)), rtol=0, atol=0)


def test_a_module_passed_as_an_argument_is_checked_like_one_the_code_names():
    layer = tt.nn.Linear(3, 3)
    compiled = tt.compile(lambda x, m: x @ m.weight.T, (ONES, layer))  # its weight is read, it is not called
    layer.weight = tt.nn.Parameter(tt.randn(3, 3))
    torch.testing.assert_close(plain(compiled(ONES, layer)), plain(ONES @ layer.weight.T), rtol=0, atol=0)


class Scaled(tt.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tt.nn.Linear(3, 3)
        self.scale = 2.0
        self.drop = tt.nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale


def test_module_attributes_training_flags_and_dropout_p_are_guards():
    model = Scaled()
    compiled = tt.compile(model, (ONES,))
    for change in (lambda: setattr(model, "scale", 3.0), lambda: setattr(model.drop, "p", 0.5), model.eval,
                   model.train):
        change()
        torch.manual_seed(0)
        got = compiled(ONES)
        torch.manual_seed(0)
        torch.testing.assert_close(plain(got), plain(model(ONES)), rtol=0, atol=0)


SCALE = 2.0


def scaled_by_global(x):
    return x * SCALE


def test_globals_and_closure_cells_the_code_names_are_guards():
    global SCALE
    compiled = tt.compile(scaled_by_global, (ONES,))
    SCALE = 3.0
    try:
        torch.testing.assert_close(compiled(ONES), ONES * 3)
    finally:
        SCALE = 2.0
    factor, table = 2.0, [1.0]

    def f(x):
        return x * factor * table[0]

    compiled = tt.compile(f, (ONES,))
    factor = 5.0
    torch.testing.assert_close(compiled(ONES), ONES * 5)
    table[0] = 7.0  # a list the function names, changed in place
    torch.testing.assert_close(compiled(ONES), ONES * 35)


def test_a_helper_functions_globals_are_guards_too():
    compiled = tt.compile(lambda x: scaled_by_global(x) + 1, (ONES,))
    global SCALE
    SCALE = -1.0
    try:
        torch.testing.assert_close(compiled(ONES), ONES * 0)
    finally:
        SCALE = 2.0


def test_an_optimizers_hyperparameters_and_state_the_code_reads_are_guards():
    w = tt.tracer(torch.ones(3), requires_grad=True)
    optimizer = tt.optim.SGD([w], lr=0.1, momentum=0.9)
    optimizer.state[w]["momentum_buffer"] = torch.full((3,), 2.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    def f(x):
        group = optimizer.param_groups[0]
        return x * group["lr"] + group["momentum"] * optimizer.state[w]["momentum_buffer"]

    compiled = tt.compile(f, (ONES,))
    changes = [lambda: optimizer.param_groups[0].update(lr=0.3), lambda: scheduler.step(),
               lambda: optimizer.param_groups[0].update(momentum=0.5),
               lambda: optimizer.state[w].update(momentum_buffer=torch.full((3,), -1.0)),
               lambda: optimizer.state[w]["momentum_buffer"].mul_(3)]
    for change in changes:
        change()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(plain(compiled(ONES)), plain(f(ONES)), rtol=0, atol=0)


@dataclasses.dataclass
class Config:
    k: float
    ids: set


def test_arguments_are_keyed_by_value_never_by_id():
    def f(x, config, flags):
        return x * config.k * len(config.ids) + flags["shift"]

    compiled = tt.compile(f, (ONES, Config(2.0, {1}), {"shift": 1.0}))
    for args in [(ONES, Config(3.0, {1, 2}), {"shift": 1.0}), (ONES, Config(2.0, {1}), {"shift": -0.0})]:
        torch.testing.assert_close(compiled(*args), f(*args))
    negative_zero = tt.compile(lambda x, c: x / c, (ONES, 0.0))
    assert torch.equal(negative_zero(ONES, -0.0), ONES / -0.0)

    class Opaque:  # any object: nothing is keyed on arguments
        k, ids = 5.0, (1,)

    torch.testing.assert_close(compiled(ONES, Opaque(), {"shift": 2.0}), f(ONES, Opaque(), {"shift": 2.0}))


def test_state_carried_on_a_module_between_calls_is_carried_as_eager():
    class Stateful(tt.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = tt.nn.Linear(3, 3)
            self.h = torch.zeros(3)

        def forward(self, x):
            out = self.lin(x + self.h)
            self.h = out.detach()
            return out

    model, twin = Stateful(), Stateful()
    twin.load_state_dict(model.state_dict())
    twin.h = model.h.clone()
    compiled = tt.compile(model, (ONES,))
    for _ in range(4):
        torch.testing.assert_close(plain(compiled(ONES)), plain(twin(ONES)), rtol=0, atol=0)


@pytest.mark.parametrize("draw", [
    lambda x: x * random.random(),
    lambda x: x * float(np.random.rand()),
    lambda x: (torch.manual_seed(3), x * torch.rand(3))[1],
    lambda x: _replayed_draw(x),
    lambda x: _forked(x),
], ids=["random", "numpy", "manual_seed", "set_rng_state", "fork_rng"])
def test_random_state_set_or_drawn_outside_torch_calls_draws_as_eager(draw):
    compiled = tt.compile(draw, (ONES,))
    for seed in (1, 2, 3):
        torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)
        got = compiled(ONES)
        torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)
        torch.testing.assert_close(got, draw(ONES), rtol=0, atol=0)


def _replayed_draw(x):
    state = torch.get_rng_state()
    first = torch.rand(3)
    torch.set_rng_state(state)
    return x * first * torch.rand(3)  # the same numbers twice: replayed code would draw two sets


def _forked(x):
    with torch.random.fork_rng():
        return x * torch.rand(3)


@pytest.mark.parametrize("change", [
    lambda x: x.register_hook(lambda g: g * 2),
    lambda x: x.retain_grad(),
])
def test_hooks_registered_on_inputs_inside_work_as_eager(change):
    def f(x):
        change(x)
        return (x * 3).sum()

    w = tt.randn(3, requires_grad=True)
    compiled = tt.compile(f, (w * 1,))
    compiled(w * 1).backward()
    w.grad = None
    x = w * 1
    compiled(x).backward()
    got = plain(w.grad)
    w.grad = None
    f(w * 1).backward()
    torch.testing.assert_close(got, plain(w.grad))


def test_requires_grad_set_on_an_input_inside_works_as_eager():
    def f(x):
        x.requires_grad_()
        return (x * 3).sum()

    compiled = tt.compile(f, (tt.ones(3),))
    for _ in range(3):
        x = tt.ones(3)
        compiled(x).backward()
        torch.testing.assert_close(plain(x.grad), torch.full((3,), 3.0))


def test_detach_inside_the_function_follows_each_calls_values():
    w = tt.randn(3, requires_grad=True)

    def f(x):  # a GAN's fake.detach(), a DQN target: a value computed here, cut from the graph
        target = (x * w).detach()
        return (w - target) ** 2

    assert_replays_eager(f, (ONES,), [(NEG,), (ONES * 2,)], [w])


def test_namedtuple_and_dataclass_outputs_hold_this_calls_tensors():
    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Out:
        loss: torch.Tensor
        logits: torch.Tensor

    pair = tt.compile(lambda x: Pair(x * 2, x * 3), (ONES,))
    torch.testing.assert_close(pair(NEG).b, NEG * 3)
    assert isinstance(pair(NEG), Pair)
    out = tt.compile(lambda x: Out((x * x).sum(), x + 1), (ONES,))
    torch.testing.assert_close(out(NEG).logits, NEG + 1)


def test_negative_zero_is_not_zero():
    compiled = tt.compile(lambda x: (1 / (x * 0.0), 1 / (x * -0.0)), (ONES,))
    positive, negative = compiled(ONES)
    assert torch.equal(positive, torch.full((3,), float("inf")))
    assert torch.equal(negative, torch.full((3,), float("-inf")))


def test_two_modules_called_from_one_function_keep_their_own_parameters():
    encoder, decoder = tt.nn.Linear(3, 3), tt.nn.Linear(3, 3)
    compiled = tt.compile(lambda x: decoder(encoder(x).tanh()), (ONES,))
    assert 'params["decoder.weight"]' in compiled.code
    assert_replays_eager(lambda x: decoder(encoder(x).tanh()), (ONES,), [(NEG,)],
                         [encoder.weight, decoder.weight, decoder.bias])


@pytest.mark.parametrize("momentum", [0.1, None])  # None: the update reads the count it changed
def test_a_call_diverging_half_way_updates_buffers_once(momentum):
    norm = tt.port(torch.nn.BatchNorm1d(3, momentum=momentum))
    twin = torch.nn.BatchNorm1d(3, momentum=momentum)

    def f(x):
        y = norm(x)
        return y * 2 if y.sum() > 0 else y * 3

    first = torch.randn(4, 3)
    compiled = tt.compile(f, (first,))
    compiled(first)
    twin(first)
    for seed in range(3):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)) + 3 * (-1) ** seed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(x)
        twin(x)
    assert int(norm.num_batches_tracked) == int(twin.num_batches_tracked) == 4
    torch.testing.assert_close(plain(norm.running_mean), twin.running_mean)


def test_a_compiled_call_inside_a_compiled_function_applies_once():
    w = tt.randn(3, requires_grad=True)
    inner = tt.compile(lambda x: x * w + 1, (ONES,))
    outer = tt.compile(lambda x: inner(x).exp().sum(), (ONES,))
    assert_replays_eager(lambda x: inner(x).exp().sum(), (ONES,), [(NEG,)], [w])
    torch.testing.assert_close(plain(outer(NEG)), plain((NEG * w + 1).exp().sum()))


def test_a_nan_in_a_saved_value_is_not_taken_for_an_in_place_change():
    w = tt.tracer(torch.tensor([1.0, float("nan"), 2.0]), requires_grad=True)
    compiled = tt.compile(lambda x: (x * w).exp().sum(), (ONES,))
    compiled(ONES.double()).backward()  # a new kind of input: traced again, and this call's result is the eager one
    torch.testing.assert_close(plain(w.grad), (ONES * w.detach()).exp().as_subclass(torch.Tensor), equal_nan=True)


def test_other_threads_module_forwards_are_not_recorded():
    mine, theirs = tt.nn.Linear(3, 3), tt.nn.Linear(3, 3)
    started, stop = threading.Event(), threading.Event()

    def busy():
        started.set()
        while not stop.is_set():
            theirs(ONES)

    thread = threading.Thread(target=busy)
    thread.start()
    started.wait()
    try:
        for _ in range(5):
            compiled = tt.compile(lambda x: mine(x).sum(), (ONES,))
            for _ in range(2):
                torch.testing.assert_close(plain(compiled(ONES)), plain(mine(ONES).sum()))
            assert [len(path) for path in compiled.program.paths()] == [2]  # linear and sum: nothing of theirs
    finally:
        stop.set()
        thread.join()


def test_verify_compares_compiled_and_eager_on_the_first_calls(monkeypatch):
    runs = []
    w = tt.randn(3, requires_grad=True)

    def f(x):
        runs.append(1)
        return (x * w).sin()

    compiled = tt.compile(f, (ONES,), verify=2)
    for _ in range(3):
        compiled(ONES)
    assert len(runs) == 2 * 3 + 1  # each verified call ran f eagerly and compiled before its own run
    broken = tt.compile(f, (ONES,))
    broken(tt.ones(3, requires_grad=True))  # records the program the check then replays
    from torchtrace.compiler import segment

    monkeypatch.setattr(segment.Segment, "backward", lambda self, grads: tuple(None for _ in self.node.edges))
    with pytest.raises(tt.GradientMismatch, match="gradient of input x"):
        broken.check(tt.ones(3, requires_grad=True))  # a compiled backward that lost its gradients is caught


def test_an_input_the_last_call_changed_in_place_is_differentiated_through_that_call_as_eager_and_torch():
    """y.mul_(h1) made y a value of the second call's graph (its first replay); the third call, given the same y,
    sends a gradient into that call's add, which saved nothing and runs again in eager and torch. The compiled call's
    statement refused it as freed by the second backward."""
    def f(x, y):
        h1 = y.exp() + x
        y.mul_(h1)
        h1.add_(1.0)
        return (h1 * h1).sum()

    results = {}
    for side in ("torch", "eager", "compiled"):
        torch.manual_seed(0)
        fn, seen = None, []
        for call in range(3):
            if call < 2:  # new inputs; the third call gets the second call's objects again
                x0, y0 = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
                x, y = (x0.clone().requires_grad_(), y0.clone()) if side == "torch" else (
                    tt.tracer(x0, requires_grad=True), tt.tracer(y0))
            fn = fn or (tt.compile(f, (x, y)) if side == "compiled" else f)
            loss = fn(x, y)
            loss.backward()
            seen.append((plain(loss), plain(x.grad)))
        results[side] = seen
    for side in ("eager", "compiled"):
        for ours, theirs in zip(results[side], results["torch"]):
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)


DATA_X, DATA_W = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)


def _returns_a_saved_value(x, w):
    a = torch.tanh(x @ w)
    return (a * a).sum(), a  # mul saves a, made earlier in the call


def _writes_data_inside(x, w):
    a = torch.tanh(x @ w)
    b = a * a
    a.data = torch.ones(4, 5, dtype=torch.float64)
    return (b * a).sum(), a


@pytest.mark.parametrize("fn", [_returns_a_saved_value, _writes_data_inside])
@pytest.mark.parametrize("after", ["kept", "deleted", "create_graph"])
def test_a_data_write_on_a_value_a_later_statement_saved_is_read_as_torch_reads_it(fn, after):
    """torch's saved input is the tensor itself: `a.data = v` after the call (or inside it) changes what mul's
    backward reads; compiled calls (recorded or replayed) give torch's gradient, as eager does."""
    def gradient(f, make):
        x, w = make(DATA_X), make(DATA_W)
        loss, a = f(x, w)
        a.data = torch.full((4, 5), 0.5, dtype=torch.float64)
        if after == "deleted":
            del a
        grad = tt.grad if isinstance(w, tt.tracer) else torch.autograd.grad
        (g,) = grad(loss, w, create_graph=after == "create_graph")
        return plain(g)

    expected = gradient(fn, lambda t: t.clone().requires_grad_(True))
    compiled = tt.compile(fn, (DATA_X, DATA_W))
    torch.testing.assert_close(gradient(fn, lambda t: tt.tracer(t.clone(), requires_grad=True)), expected)
    for _ in range(3):
        torch.testing.assert_close(gradient(compiled, lambda t: tt.tracer(t.clone(), requires_grad=True)), expected)
    assert compiled.replayed >= 2


def test_saved_tensors_hooks_entered_inside_the_function_pack_and_unpack_as_eager():
    """Each call from the hooked statement on runs eagerly (with a warning): pack runs as often as torch's, unpack's
    result is what backward reads (it doubles the saved values here), on every call."""
    from torch.autograd.graph import saved_tensors_hooks
    packs = [0]

    def pack(t):
        packs[0] += 1
        return t

    def f(x, w):
        a = torch.tanh(x @ w)
        with saved_tensors_hooks(pack, lambda t: t * 2):
            b = a * a
        return (torch.exp(b) * a).sum()

    def gradient(fn, make):
        packs[0] = 0
        x, w = make(DATA_X), make(DATA_W)
        grad = tt.grad if isinstance(w, tt.tracer) else torch.autograd.grad
        return plain(grad(fn(x, w), w)[0]), packs[0]

    expected, torch_packs = gradient(f, lambda t: t.clone().requires_grad_(True))
    compiled = tt.compile(f, (DATA_X, DATA_W))
    with pytest.warns(UserWarning, match="saved_tensors_hooks entered inside it"):
        got = [gradient(compiled, lambda t: tt.tracer(t.clone(), requires_grad=True)) for _ in range(4)]
    for g, n in got:
        torch.testing.assert_close(g, expected)
        assert n == torch_packs == 2
