"""Checked replay: whatever the function's Python reads or does, every compiled call gives eager's result.

Each test builds two identical worlds (same seed), runs one through tt.compile and one eagerly on the same
calls with the same changes between them, and compares every output, gradient, parameter and side effect.
These are the reads a list of guards could not enumerate: class attributes, properties, config objects,
generators, default arguments, filled containers, torch's global flags, unnamed modules, `.data`, slices.
"""
import collections
import io
import threading
import types
import warnings
from contextlib import redirect_stdout

import pytest
import torch
import torch.nn.functional as F
from helpers import Cube
from torch import nn

import torchtrace as tt
from torchtrace.port import port


def plain(t):
    return torch.Tensor.detach(t).as_subclass(torch.Tensor)


def same(a, b, exact=True):
    """Equal tensors (bit for bit unless exact=False), recursively through containers and objects."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.requires_grad == b.requires_grad
        if exact:
            assert torch.equal(plain(a), plain(b)) or (plain(a).isnan() == plain(b).isnan()).all(), (a, b)
        else:
            torch.testing.assert_close(plain(a), plain(b), rtol=1e-12, atol=1e-14)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            same(a[k], b[k], exact)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y, exact)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        same(vars(a), vars(b), exact)
    else:
        assert a == b, (a, b)


def twins(build, calls, exact=True):
    """build() -> (fn, leaves, between(i)); run compiled and eager over `calls` argument tuples, compare all.

    Returns the compiled function (to look at its program)."""
    results = []
    compiled = None
    for side in ("compiled", "eager"):
        torch.manual_seed(0)
        fn, leaves, between = build()
        if side == "compiled":
            fn = compiled = tt.compile(fn, calls[0])
        seen = []
        for i, args in enumerate(calls):
            for p in leaves:
                p.grad = None
            torch.manual_seed(100 + i)
            out = fn(*args)
            loss = out if isinstance(out, torch.Tensor) else out[0] if isinstance(out, (tuple, list)) else None
            if loss is not None and loss.requires_grad:
                (loss * 1.5).sum().backward()
            seen.append((out, [None if p.grad is None else plain(p.grad).clone() for p in leaves],
                         [plain(p).clone() for p in leaves]))
            between(i)
        results.append(seen)
    for ours, eager in zip(*results):
        same(ours, eager, exact)
    return compiled


def nothing(i):
    pass


def leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tt.as_tracer(torch.randn(*shape, generator=g, dtype=torch.float64), requires_grad=True)


X = [(torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i)),) for i in range(5)]

# --- Python state read in ways no guard list enumerates -----------------------------------------------------

SCALE = 2.0


class Model(nn.Module):
    factor = 1.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    @property
    def scale(self):
        return SCALE * self.factor

    @staticmethod
    def shift():
        return SCALE - 1

    def forward(self, x):
        return (self.lin(x) * self.scale + self.shift()).tanh().sum()


def test_class_attributes_properties_and_staticmethods_reading_a_global():
    def build():
        m = port(Model().double())

        def between(i):
            global SCALE
            SCALE = 2.0 + i
            Model.factor = -1.0 if i == 2 else 0.5

        return m, list(m.parameters()), between

    try:
        twins(build, X)
    finally:
        globals()["SCALE"] = 2.0
        Model.factor = 1.0


def test_config_objects_namespaces_and_callable_objects():
    class Scaler:
        def __init__(self):
            self.k = 3.0

        def __call__(self, t):
            return t * self.k

    def build():
        cfg = types.SimpleNamespace(SCALE=1.5, act=torch.tanh, power=2)
        module = types.ModuleType("config")  # a config module: module.SHIFT
        module.SHIFT = 0.25
        scaler = Scaler()
        w = leaf(4, 2)

        def fn(x):
            return scaler(cfg.act(x @ w * cfg.SCALE + module.SHIFT) ** cfg.power).sum()

        def between(i):
            module.SHIFT *= -3
            cfg.SCALE = -cfg.SCALE * 1.5
            cfg.act = torch.sigmoid if i % 2 else torch.tanh
            cfg.power = 3 if i == 1 else 2
            scaler.k += 1

        return fn, [w], between

    twins(build, X)


def test_dicts_mixing_tensors_and_floats_and_nested_lists_of_tensors():
    def build():
        w = leaf(4, 2)
        return (lambda x, opts, pairs: ((x @ w) * opts["s"] + opts["b"] * pairs[1][0]).sum() + pairs[0][1].sum(),
                [w], nothing)

    calls = [(x, {"s": float(i) - 1.5, "b": leaf(2, seed=i)}, [[leaf(1), leaf(3, seed=i)], [leaf(2, seed=9 - i)]])
             for i, (x,) in enumerate(X)]
    twins(build, calls)


def test_generators_iterators_and_mutable_default_arguments():
    def build():
        w = leaf(4, 2)
        scales = iter([0.5, -1.0, 2.0, 3.0, -0.0, 7.0])

        def counter():
            n = 0
            while True:
                n += 1
                yield n

        count = counter()

        def fn(x, seen=[]):  # noqa: B006  (the default list is the point)
            seen.append(len(seen))
            return (x @ w * next(scales) + next(count) + len(seen)).sum(), list(seen)

        return fn, [w], nothing

    twins(build, X)


def test_containers_the_function_fills_and_prints_happen_on_every_call():
    outputs = []
    for side in ("compiled", "eager"):
        torch.manual_seed(0)
        w = leaf(4, 2)
        log, stats = [], collections.defaultdict(int)

        def fn(x, log, stats):
            loss = (x @ w).relu().sum()
            log.append(loss)
            stats["n"] += 1
            print(f"call {stats['n']}: {float(loss):.4f}")
            return loss

        run = tt.compile(fn, (X[0][0], log, stats)) if side == "compiled" else fn
        printed = io.StringIO()
        with redirect_stdout(printed):
            for (x,) in X:
                run(x, log, stats)
        sum(log).backward()  # the logged losses are live tracers, as eager's
        outputs.append((printed.getvalue(), dict(stats), plain(w.grad), [plain(t) for t in log]))
    assert outputs[0][0] == outputs[1][0] and outputs[0][0].count("call") == len(X)
    same(outputs[0][1:], outputs[1][1:])


@pytest.mark.parametrize("flag", ["autocast", "anomaly", "deterministic"])
def test_torch_global_state_queries_are_asked_on_every_call(flag):
    query = {"autocast": lambda: torch.is_autocast_enabled("cpu"), "anomaly": torch.is_anomaly_enabled,
             "deterministic": torch.are_deterministic_algorithms_enabled}[flag]
    setter = {"autocast": None, "anomaly": torch.set_anomaly_enabled,
              "deterministic": torch.use_deterministic_algorithms}[flag]

    def build():
        w = leaf(4, 2)
        return (lambda x: (x @ w * (3.0 if query() else -1.0)).sum()), [w], nothing

    compiled = None
    for state in (False, True, False):
        if setter is not None:
            setter(state)
        try:
            compiled = twins(build, X[:2]) if compiled is None else compiled
            torch.manual_seed(0)
            fn, _, _ = build()
            same(compiled(X[2][0]).detach(), fn(X[2][0]).detach())
        finally:
            if setter is not None:
                setter(False)


def test_enable_grad_inside_a_function_called_under_no_grad():
    w = leaf(4, 2)

    def fn(x):
        with torch.enable_grad():
            return (x @ w).sum()

    compiled = tt.compile(fn, X[0])
    for (x,) in X:
        with torch.no_grad():
            out = compiled(x)
        assert out.requires_grad and not out.is_leaf
        w.grad = None
        out.backward()
        w_grad = plain(w.grad).clone()
        w.grad = None
        with torch.no_grad():
            fn(x).backward()
        assert torch.equal(w_grad, plain(w.grad))


def test_autograd_attributes_read_inside_are_answered_as_eager():
    def build():
        w = leaf(4, 2)
        frozen = tt.as_tracer(torch.ones(2, dtype=torch.float64))

        def fn(x):
            h = x @ w
            kinds = (h.requires_grad, h.is_leaf, h.grad_fn is None, w.is_leaf, frozen.requires_grad,
                     w.grad is None)
            if h.requires_grad and not h.is_leaf:
                h = h * 2
            return (h + frozen).sum(), kinds

        def between(i):
            w.grad = torch.ones(4, 2, dtype=torch.float64) if i % 2 else None

        return fn, [w], between

    twins(build, X)


# --- training: parameters, .grad, optimizers, schedulers -------------------------------------------------------


def mlp(seed=0):
    torch.manual_seed(seed)
    return port(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double())


def step_fn(model, optimizer, scheduler=None, set_to_none=True):
    def step(x, y):
        optimizer.zero_grad(set_to_none=set_to_none)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss

    return step


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 1, generator=g, dtype=torch.float64))
            for _ in range(n)]


@pytest.mark.parametrize("optimizer", ["adam", "cosine", "sgd-keep-grads", "torch-adamw"])
def test_a_training_step_compiles_to_one_program_and_trains_bit_for_bit_as_eager(optimizer):
    data = batches(20 if optimizer == "cosine" else 8)
    finals = []
    for side in ("compiled", "eager"):
        model = mlp()
        scheduler = None
        if optimizer == "adam":
            opt = tt.optim.Adam(model.parameters(), lr=0.01)
        elif optimizer == "torch-adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        elif optimizer == "cosine":
            opt = tt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
        else:
            opt = tt.optim.SGD(model.parameters(), lr=0.1)
        step = step_fn(model, opt, scheduler, set_to_none=optimizer != "sgd-keep-grads")
        if side == "compiled":
            step = compiled = tt.compile(step, data[0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            losses = [plain(step(*b)) for b in data]
        finals.append((losses, [plain(p) for p in model.parameters()], [plain(p.grad) for p in model.parameters()]))
    same(finals[0], finals[1])
    assert len(compiled.program.paths()) == 1 and compiled.replayed == len(data) - 1


def test_grad_recreated_by_zero_grad_set_to_none_between_calls():
    """A leaf's .grad set, kept, replaced or removed between calls: each call adds into what is there now."""
    def build():
        w = leaf(4, 2)

        def fn(x):
            return (x @ w).sum() * -3.5

        def between(i):
            w.grad = [None, torch.full((4, 2), 2.0, dtype=torch.float64), None, w.grad, None][i]

        return fn, [], between

    calls = X
    results = []
    for side in ("compiled", "eager"):
        torch.manual_seed(0)
        fn, _, between = build()
        w = fn.__closure__[0].cell_contents
        run = tt.compile(fn, calls[0]) if side == "compiled" else fn
        grads = []
        for i, (x,) in enumerate(calls):
            run(x).backward()
            grads.append(plain(w.grad).clone())
            between(i)
        results.append(grads)
    same(results[0], results[1])


def test_unnamed_same_class_modules_in_lists_keep_their_own_parameters():
    def forward_only():
        torch.manual_seed(0)
        ensemble = [port(nn.Linear(4, 1).double()) for _ in range(3)]
        return (lambda x: sum(m(x).sum() for m in ensemble)), [p for m in ensemble for p in m.parameters()], nothing

    twins(forward_only, X)

    def build():
        torch.manual_seed(0)
        ensemble = [port(nn.Linear(4, 1).double()) for _ in range(3)]
        heads = port(nn.ModuleList([nn.Linear(4, 2) for _ in range(3)]).double())
        params = [p for m in (*ensemble, heads) for p in m.parameters()]
        opt = tt.optim.SGD(params, lr=0.1)

        def fn(x):
            opt.zero_grad()
            loss = sum(m(x).sum() for m in ensemble) + sum(h(x).pow(2).sum() for h in heads)
            loss.backward()
            opt.step()
            return loss.detach()

        return fn, params, nothing

    twins(build, X)


def test_parameter_data_assigned_and_requires_grad_set_inside():
    def build():
        w = leaf(4, 2)
        x_flags = []

        def fn(x):
            x = x.clone()
            x.requires_grad = len(x_flags) % 2 == 0
            x_flags.append(x.requires_grad)
            loss = (x @ w).square().sum()
            loss.backward()
            with torch.no_grad():
                w.data -= 0.01 * w.grad
            w.grad = None
            return loss.detach()

        return fn, [w], nothing

    twins(build, [(tt.as_tracer(x),) for (x,) in X])


def test_outputs_of_any_python_type_hold_this_calls_tensors():
    Pair = collections.namedtuple("Pair", "a b")

    class Box:
        def __init__(self, value):
            self.value = value

    def build():
        w = leaf(4, 2)

        def fn(x):
            h = x @ w
            d = collections.defaultdict(list)
            d["h"].append(h)
            return h.sum(), types.SimpleNamespace(h=h), Box(h * 2), Pair(h, 3), d

        return fn, [w], nothing

    twins(build, X)


def test_a_number_divided_by_a_tensor_is_eagers_bit_for_bit():
    def build():
        w = tt.as_tracer(torch.rand(1000) + 0.5, requires_grad=True)
        return (lambda x: (3.0 / (w * x)).sum()), [w], nothing

    twins(build, [(torch.rand(1000) + 0.5,) for _ in range(3)])


def test_slices_and_ellipsis_arguments():
    def build():
        w = leaf(4, 6)
        return (lambda x, s: (x @ w)[:, s].sum() + (x @ w)[..., 1:5:2].sum()), [w], nothing

    twins(build, [(X[i][0], slice(i % 3, 5)) for i in range(4)])


def test_a_compiled_call_inside_tt_recording_and_inside_another_compiled_function():
    w = leaf(4, 2)
    inner = tt.compile(lambda x: (x @ w).tanh(), X[0])
    outer = tt.compile(lambda x: inner(x).sum() * 2, X[0])
    expected = []
    for (x,) in X:
        w.grad = None
        (x @ w).tanh().sum().mul(2).backward()
        expected.append(plain(w.grad).clone())
    for i, (x,) in enumerate(X):
        w.grad = None
        with tt.recording():
            inner(x).sum().mul(2).backward()
        assert torch.equal(plain(w.grad), expected[i])
        w.grad = None
        outer(x).backward()
        assert torch.equal(plain(w.grad), expected[i])


def test_a_model_run_by_another_thread_meanwhile_is_not_part_of_the_program():
    model, other = mlp(0), mlp(1)
    step = tt.compile(lambda x: model(x).sum(), (batches(1)[0][0],))
    done = threading.Event()

    def elsewhere():
        while not done.is_set():
            other(torch.randn(5, 4, dtype=torch.float64)).sum().backward()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    try:
        for x, _ in batches(6):
            for p in model.parameters():
                p.grad = None
            step(x).backward()
            got = [plain(p.grad).clone() for p in model.parameters()]
            for p in model.parameters():
                p.grad = None
            model(x).sum().backward()
            same(got, [plain(p.grad) for p in model.parameters()])
    finally:
        done.set()
        thread.join()
    assert len(step.program.paths()) == 1


# --- divergence: nothing runs twice -----------------------------------------------------------------------------


def test_a_branch_on_a_value_diverges_mid_call_and_joins_the_trie():
    def build():
        w = leaf(4, 2)
        drop = nn.Dropout(0.5)
        effects = []

        def fn(x):
            h = drop(x @ w)  # a random draw before the branch: made once, as eager's
            effects.append(1)
            if h.sum() > 0:
                h = h.exp()
            else:
                h = h.sin() * 3
            return h.sum(), len(effects)

        return fn, [w], nothing

    calls = [(x * s,) for s in (1.0, -1.0) for (x,) in X[:3]]
    compiled = twins(build, calls)
    assert len(compiled.program.paths()) == 2


def test_a_value_dependent_shape_becomes_an_eager_node_of_what_it_computed():
    def build():
        w = leaf(6)
        return (lambda x: (w * x)[x > 0].square().sum()), [w], nothing

    twins(build, [(torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(i)),)
                  for i in range(5)])


def test_changing_numbers_never_diverge():
    def build():
        w = leaf(4, 2)
        state = {"lr": 0.5}

        def between(i):
            state["lr"] *= -0.7

        return (lambda x: (x @ w * state["lr"] - state["lr"] / 3).sum()), [w], between

    compiled = twins(build, X)
    assert len(compiled.program.paths()) == 1 and compiled.replayed == len(X) - 1


def test_weight_tying_is_checked_both_ways():
    def build():
        a, b = leaf(4, 4, seed=1), leaf(4, 4, seed=2)
        pair = {"first": a, "second": a}

        def between(i):
            pair["second"] = b if i % 2 == 0 else a

        return (lambda x: (x @ pair["first"] @ pair["second"]).sum()), [a, b], between

    compiled = twins(build, X)
    assert len(compiled.program.paths()) == 2


def test_in_place_changes_of_recorded_values_run_inside_the_program():
    def build():
        w = leaf(4, 2)

        def fn(x):
            h = x @ w
            h[0] = 0.0
            h += 1
            h.relu_()
            return (h * h).sum()

        return fn, [w], nothing

    compiled = twins(build, X)
    assert compiled.replayed == len(X) - 1


def test_an_in_place_change_of_a_saved_value_raises_as_eager():
    w = leaf(4)

    def fn(x):
        h = (x * w).exp()
        out = h.sum()
        with torch.no_grad():
            h.mul_(2)
        return out

    compiled = tt.compile(fn, (torch.randn(4),))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="modified by an in-place operation|modified in place"):
            compiled(torch.randn(4, dtype=torch.float64)).backward()


def _inside_values(x, w, seen):
    """h and k are made inside and read again inside; a hook doubles h's gradient, k's gradient is kept."""
    h = x * w
    h.register_hook(lambda g: seen.append(plain(g).clone()) or g * 2)
    k = h.tanh()
    k.retain_grad()
    loss = (k * h).sum() + (k * k * w).sum()
    return h, k, loss


def test_hooks_and_retain_grad_on_values_read_again_inside_see_the_whole_gradient():
    w = leaf(3, 4)
    compiled = tt.compile(lambda x, seen: _inside_values(x, w, seen), (X[0][0], []))
    for (x,) in X:
        results = []
        for fn in (compiled, lambda x, seen: _inside_values(x, w, seen)):
            w.grad, seen = None, []
            h, k, loss = fn(x, seen)
            loss.backward()
            results.append((seen, plain(k.grad), plain(w.grad)))
        same(results[0], results[1])
        w_ = plain(w).clone().requires_grad_()  # torch autograd, the same hook and retain_grad
        seen_ = []
        h, k, loss = _inside_values(x, w_, seen_)
        loss.backward()
        torch.testing.assert_close(results[0][0], seen_)
        torch.testing.assert_close(results[0][1], k.grad)
        torch.testing.assert_close(results[0][2], w_.grad)
    assert compiled.replayed == len(X) - 1


def test_tt_grad_of_values_made_and_read_again_inside():
    w = leaf(3, 4)

    def fn(x, w):
        h = x * w
        k = h.exp()
        return h, k, (k * h).sum() + k.sum()

    compiled = tt.compile(fn, (X[0][0], w))
    for (x,) in X:
        results = []
        for f in (compiled, fn):
            h, k, loss = f(x, w)
            results.append([plain(g) for g in tt.grad(loss, [h, k, w])])
        same(results[0], results[1])
        w_ = plain(w).clone().requires_grad_()
        h, k, loss = fn(x, w_)
        torch.testing.assert_close(results[0], list(torch.autograd.grad(loss, [h, k, w_])))
    assert compiled.replayed == len(X) - 1


def _penalised(x, w):
    """A loss whose rules save their own results (tanh, exp, sigmoid) and read w twice."""
    return ((x * w).tanh() * w).exp().sum() + (x @ w.t()).sigmoid().sum()


def test_second_derivatives_through_a_compiled_call():
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    w = tt.as_tracer(w0.clone(), requires_grad=True)
    compiled = tt.compile(_penalised, (tt.as_tracer(X[0][0], requires_grad=True), w))

    def penalty(f, x, w):
        """|d loss / dx|^2: a gradient penalty, whose gradient needs loss's second derivatives."""
        x = tt.as_tracer(x.clone(), requires_grad=True) if f is not None else x.clone().requires_grad_()
        loss = (f or _penalised)(x, w)
        grad_x, = (tt.grad if f is not None else torch.autograd.grad)(loss, [x], create_graph=True)
        return (grad_x * grad_x).sum()

    for (x,) in X[:4]:
        results = []
        for f in (compiled, _penalised):
            w.grad = None
            penalty(f, x, w).backward()
            results.append(plain(w.grad).clone())
        same(results[0], results[1], exact=False)
        w_ = w0.clone().requires_grad_()
        penalty(None, x, w_).backward()
        torch.testing.assert_close(results[0], w_.grad, rtol=1e-10, atol=1e-12)
        numeric = torch.zeros_like(w0)  # central differences of the penalty itself
        for k in range(w0.numel()):
            step = torch.zeros(w0.numel(), dtype=torch.float64)
            step[k] = 1e-6
            up, down = (penalty(None, x, (w0 + s * step.view(3, 4)).requires_grad_()).item() for s in (1, -1))
            numeric.view(-1)[k] = (up - down) / 2e-6
        torch.testing.assert_close(results[0], numeric, rtol=1e-5, atol=1e-6)
    assert compiled.replayed == 3


PROBE_SCALE = 2.0


class GlobalScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)

    @property
    def scale(self):
        return PROBE_SCALE

    @staticmethod
    def shift():
        return PROBE_SCALE + 1

    def forward(self, x):
        return (self.lin(x) * self.scale + self.shift()).sum()


def test_a_property_and_a_staticmethod_read_after_a_global_changed():
    model = port(GlobalScaled())
    compiled = tt.compile(model, (torch.randn(2, 3),))
    x = torch.randn(2, 3)
    compiled(x)
    globals()["PROBE_SCALE"] = 5.0
    try:
        assert torch.equal(plain(compiled(x)), plain(model(x)))
    finally:
        globals()["PROBE_SCALE"] = 2.0


def test_a_config_module_attribute_changed_between_calls():
    config = types.ModuleType("config")
    config.SCALE = 1.0
    w = leaf(3)
    compiled = tt.compile(lambda x: (x * w * config.SCALE).sum(), (torch.randn(3),))
    x = torch.randn(3, dtype=torch.float64)
    compiled(x)
    config.SCALE = 4.0
    assert torch.equal(plain(compiled(x)), plain((x * w * config.SCALE).sum()))


def test_an_ensemble_of_unnamed_modules_called_from_a_function():
    torch.manual_seed(0)
    ensemble = [port(nn.Linear(3, 1)) for _ in range(3)]
    x = torch.randn(2, 3)
    compiled = tt.compile(lambda v: sum(m(v).sum() for m in ensemble), (x,))
    compiled(x)
    assert torch.equal(plain(compiled(x)), plain(sum(m(x).sum() for m in ensemble)))


def test_a_call_that_once_handed_back_its_input_and_now_makes_a_tensor():
    """Dropout with p=0 hands back its input; with p=0.3 it draws a mask: each call follows its own, as eager."""
    def build():
        w = leaf(4, 5)
        drop = nn.Dropout(0.0)

        def between(i):
            drop.p = [0.0, 0.3, 0.3, 0.0, 0.5, 0.3][i]

        return (lambda x: (drop(x @ w) ** 2).sum()), [w], between

    compiled = twins(build, [X[i % 5] for i in range(6)])
    assert len(compiled.program.paths()) == 2


def test_calls_under_autocast_run_as_eager_with_their_backward_in_autocast():
    w = tt.as_tracer(torch.randn(4, 3), requires_grad=True)
    compiled = tt.compile(lambda x: (x @ w).float().sum(), (torch.randn(2, 4),))
    x = torch.randn(2, 4)
    compiled(x)  # records outside autocast
    results = []
    for fn in (compiled, lambda v: (v @ w).float().sum()):
        w.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x)
        out.backward()
        results.append((plain(out), plain(w.grad)))
    same(results[0], results[1])


def test_many_threads_calling_one_compiled_function_get_eagers_results():
    model = mlp(0)
    step = tt.compile(lambda x: model(x).square().sum(), (batches(1)[0][0],))
    data = [x for x, _ in batches(12)]
    expected = [plain(model(x).square().sum()) for x in data]
    got = [None] * len(data)

    def work(i):
        got[i] = plain(step(data[i] * (1 if i % 2 else -1) * (1 if i % 2 else -1)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    same(got, expected)


# --- the fast path of a matched call: positional arguments checked one by one, plans kept on statements ------------

def test_positional_numbers_and_flags_read_on_every_call():
    def build():
        w = leaf(3, 4)
        knobs = {"shift": 1, "scale": 0.5, "dim": 1}

        def between(i):
            knobs["shift"] = [1, 2, 1, 3, 1][i]
            knobs["scale"] = [0.5, -2.0, 0.5, 1e-3, 7.0][i]
            knobs["dim"] = [1, 1, 0, 1, 0][i]

        def fn(x):
            h = torch.roll(x * w, knobs["shift"], knobs["dim"]) * knobs["scale"]
            return (h.cumsum(knobs["dim"]) * h).sum()

        return fn, [w], between

    twins(build, X)


def test_the_same_tensor_for_two_parameters_then_two_tensors():
    a, b = leaf(3, 4, seed=1), leaf(3, 4, seed=2)
    calls = [(X[0][0], a, b), (X[1][0], a, a), (X[2][0], b, a), (X[3][0], a, b), (X[4][0], b, b)]

    def build():
        return (lambda x, p, q: (x * p * q + p).sum()), [a, b], nothing

    compiled = twins(build, calls)
    assert len(compiled.program.paths()) == 2  # p and q one tensor, or two


def test_a_tensor_made_without_gradient_inside_is_a_new_leaf_on_each_call():
    def build():
        w = leaf(3, 4)

        def fn(x):
            mask = (x > 0).to(x.dtype)  # records nothing: a leaf of this call
            scale = torch.ones(3, 4, dtype=x.dtype) * 2
            return ((x * w) * mask * scale).sum()

        return fn, [w], nothing

    compiled = twins(build, X)
    assert compiled.replayed == len(X) - 1


def test_keyword_and_positional_spellings_of_one_call_alternate():
    def build():
        w = leaf(3, 4)
        spelling = {"keyword": True}

        def between(i):
            spelling["keyword"] = not spelling["keyword"]

        def fn(x):
            h = x * w
            s = h.sum(dim=1) if spelling["keyword"] else h.sum(1)
            return (s * s).sum() + torch.add(h, w, alpha=0.5).sum()

        return fn, [w], between

    twins(build, X)


def test_a_rule_registered_between_calls_is_the_one_that_runs(monkeypatch):
    calls = []

    class CountedCube(Cube):
        @staticmethod
        def backward(ctx, grad):
            calls.append(1)
            return Cube.backward(ctx, grad)

    from torchtrace.autograd.function import RULES
    w = leaf(3, 4)
    compiled = tt.compile(lambda x: torch.sinh(x * w).sum(), X[0])
    for i, (x,) in enumerate(X):
        if i == 2:  # from now on torch.sinh records (and computes) a cube
            monkeypatch.setitem(RULES, torch.sinh, CountedCube)
        w.grad = None
        compiled(x).backward()
        got = plain(w.grad).clone()
        w.grad = None
        torch.sinh(x * w).sum().backward()
        same(got, plain(w.grad))
        w_ = plain(w).clone().requires_grad_()
        (torch.sinh(x * w_) if i < 2 else (x * w_) ** 3).sum().backward()
        torch.testing.assert_close(got, w_.grad)
    assert len(calls) == 2 * (len(X) - 2)  # the registered rule ran on every call after it was registered


def test_backward_twice_through_a_compiled_call_as_eager():
    w = leaf(3, 4)

    def fn(x):
        return ((x * w).exp() * w).sum()

    compiled = tt.compile(fn, X[0])
    compiled(X[0][0])
    outcomes = []
    for f in (compiled, fn):
        w.grad = None
        loss = f(X[1][0])
        loss.backward(retain_graph=True)
        loss.backward()
        grad = plain(w.grad).clone()
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
        outcomes.append(grad)
    same(outcomes[0], outcomes[1])
    w_ = plain(w).clone().requires_grad_()
    loss = ((X[1][0] * w_).exp() * w_).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(outcomes[0], w_.grad)


def test_finite_differences_agree_with_a_replayed_gradient():
    w = leaf(3, 4)

    def fn(x, v):
        return ((x * v).tanh() * v + (x / (1.5 + v * v))).sum()

    compiled = tt.compile(fn, (X[0][0], w))
    for (x,) in X[:3]:
        w.grad = None
        compiled(x, w).backward()
        numeric = torch.zeros(3, 4, dtype=torch.float64)
        base = plain(w).clone()
        for k in range(base.numel()):
            step = torch.zeros(base.numel(), dtype=torch.float64)
            step[k] = 1e-6
            step = step.view(3, 4)
            numeric.view(-1)[k] = (fn(x, base + step) - fn(x, base - step)).item() / 2e-6
        torch.testing.assert_close(plain(w.grad), numeric, rtol=1e-6, atol=1e-7)
    assert compiled.replayed == 2


def test_leaf_gradients_never_share_memory_with_a_users_tensor_or_each_other():
    w, v = leaf(3, 4, seed=1), leaf(3, 4, seed=2)

    def fn(x):
        return x + w + v  # Add's backward hands its incoming gradient on, as it is, to both leaves

    compiled = tt.compile(fn, X[0])
    for f in (compiled, compiled, fn):
        w.grad = v.grad = None
        g = torch.ones(3, 4, dtype=torch.float64)
        f(X[1][0]).backward(g)
        f(X[2][0]).backward(g)  # accumulates into .grad in place
        same(g, torch.ones(3, 4, dtype=torch.float64))
        same(plain(w.grad), torch.full((3, 4), 2.0, dtype=torch.float64))
        assert w.grad.untyped_storage().data_ptr() != v.grad.untyped_storage().data_ptr()
        assert w.grad.untyped_storage().data_ptr() != g.untyped_storage().data_ptr()


def test_a_training_step_with_a_gradient_penalty_inside_compiles_and_trains_as_eager():
    def build():
        model = mlp(0)
        optimizer = tt.optim.Adam(model.parameters(), lr=1e-2)

        def step(x, target):
            optimizer.zero_grad()
            x = tt.as_tracer(x.clone(), requires_grad=True)
            out = model(x)
            grad_x, = tt.grad(out.sum(), [x], create_graph=True)  # the rules' backward, recorded
            loss = F.mse_loss(out, target) + ((grad_x.norm(dim=1) - 1) ** 2).mean()
            loss.backward()
            optimizer.step()
            return loss.detach()

        return step, list(model.parameters()), nothing

    compiled = twins(build, batches(6))
    assert compiled.replayed == 5


def test_backward_between_statements_of_one_call_on_some_calls_only():
    def build():
        w = leaf(4, 2)
        calls = {"n": 0}

        def fn(x):
            calls["n"] += 1
            first = (x @ w).tanh().sum()
            if calls["n"] % 2:  # no torch call differs: the backward alone splits the compiled node
                first.backward()
            second = ((x * 2) @ w).exp().sum()
            return second + first.detach()

        return fn, [w], nothing

    compiled = twins(build, X)
    assert compiled.replayed == len(X) - 1
