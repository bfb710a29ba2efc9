"""The hook and utility surface a PyTorch user relies on, against torch autograd, eager and through tt.compile.

Every test runs one program twice: on a plain float64 torch model (torch autograd) and on a ported twin (tracers),
eagerly and, where marked, as a compiled function called several times (calls after the first replay the recorded
program). Values, gradients, what the hooks saw and how often they ran must agree within 1e-12 (most are equal bit
for bit): module forward (pre-)hooks with kwargs and return values, full backward (pre-)hooks that read and replace
gradients on modules used twice, with several inputs / outputs and inputs that need no gradient, Tensor.register_hook,
post-accumulate-grad hooks, retain_grad, grad_fn hooks, handles' remove(), gradient clipping, parametrizations,
parameters_to_vector, state_dict round trips, freezing, zero_grad and gradient accumulation.
"""
import copy
from typing import Any, Callable, List

import pytest
import torch
import torch.nn.modules.module as torch_module
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.nn.utils import (
    clip_grad_norm_,
    clip_grad_value_,
    parameters_to_vector,
    parametrizations,
    vector_to_parameters,
)

import torchtrace as tt
from torchtrace.port import port

D = torch.float64
TOL = 1e-12

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def plain(t: Any) -> Any:
    return None if t is None else torch.Tensor.detach(t).as_subclass(torch.Tensor).clone()


def torch_leaf(v: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return v.clone().requires_grad_(requires_grad)


def tracer_leaf(v: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return tt.tracer(v.clone(), requires_grad=requires_grad)


def assert_same(ours: List[Any], theirs: List[Any], tol: float = TOL) -> None:
    """Two flat lists of tensors / None / plain values, item by item (None where torch has None)."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(b, torch.Tensor) or isinstance(a, torch.Tensor):
            assert a is not None and b is not None, (i, a, b)
            a, b = plain(a), plain(b)
            assert a.shape == b.shape and a.dtype == b.dtype, (i, a.shape, b.shape, a.dtype, b.dtype)
            assert torch.allclose(a, b, rtol=0, atol=tol), (i, (a - b).abs().max())
        else:
            assert a == b, (i, a, b)


def flat(items: Any) -> List[Any]:
    out: List[Any] = []
    for item in items:
        out.extend(flat(item) if isinstance(item, (list, tuple)) else [item])
    return out


def grads(module: nn.Module) -> List[Any]:
    return [plain(p.grad) for p in module.parameters()]


def both(build: Callable[[], nn.Module]):
    torch.manual_seed(0)
    model = build().to(D)
    return model, port(copy.deepcopy(model))


# ---------------------------------------------------------------------------------------------- module hooks


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(3, 4)

    def forward(self, x, y, scale=1.0):
        return self.a(x) * scale, self.b(y).tanh()


def _kwargs_hooks_run(model: nn.Module, make: Callable, compiled: bool) -> List[Any]:
    seen: List[Any] = []

    def pre(module, args, kwargs):
        seen.append(kwargs["scale"])
        return (args[0] * 2, args[1]), {"scale": kwargs["scale"] + 1}

    def after(module, args, kwargs, out):
        return out[0] + args[1].sum(), out[1] * 3

    def bw_pre(module, grad_output):
        seen.append([plain(g) for g in grad_output])
        return grad_output[0] * 2, None if grad_output[1] is None else grad_output[1] + 1

    def bw(module, grad_input, grad_output):
        seen.append([plain(g) for g in (*grad_input, *grad_output)])
        return grad_input[0] * 0.5, grad_input[1]

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    model.register_full_backward_pre_hook(bw_pre)
    model.register_full_backward_hook(bw)

    def loss_of(x, y):
        a, b = model(x, y, scale=0.5)
        return a.pow(2).sum() + b.sum()

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, 3, generator=g, dtype=D), torch.randn(2, 3, generator=g, dtype=D)) for _ in range(3)]
    return _two_input_steps(model, loss_of, data, make, compiled, seen)


@pytest.mark.parametrize("compiled", [False, True])
def test_forward_hooks_with_kwargs_and_replacing_backward_hooks_on_a_module_of_two_inputs_and_outputs(compiled):
    model, ported = both(TwoInTwoOut)
    assert_same(_kwargs_hooks_run(ported, tracer_leaf, compiled), _kwargs_hooks_run(model, torch_leaf, False))


def _used_twice_run(model: nn.Module, make: Callable, x_requires_grad: bool, remove: bool, compiled: bool):
    seen: List[Any] = []
    layer = model[0]

    def bw(module, grad_input, grad_output):
        seen.append(["post", *[plain(g) for g in (*grad_input, *grad_output)]])
        return tuple(None if g is None else g * 2 for g in grad_input)

    def bw_pre(module, grad_output):
        seen.append(["pre", *[plain(g) for g in grad_output]])
        return (grad_output[0] + 1,)

    handles = [layer.register_full_backward_hook(bw), layer.register_full_backward_pre_hook(bw_pre)]

    def loss_of(x):
        h = layer(x).tanh()
        return layer(h[:, :3]).sin().pow(2).sum()  # the layer used twice

    g = torch.Generator().manual_seed(2)
    data = [torch.randn(2, 3, generator=g, dtype=D) for _ in range(4)]
    fn = tt.compile(loss_of, (make(data[0], x_requires_grad),)) if compiled else loss_of
    out: List[Any] = []
    for step, x0 in enumerate(data):
        if remove and step == 2:
            for handle in handles:
                handle.remove()
        model.zero_grad()
        seen.clear()
        x = make(x0, x_requires_grad)
        fn(x).backward()
        out += [plain(x.grad), *grads(model), *flat(seen)]
    return out


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("remove", [False, True])
@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_full_backward_hooks_of_a_module_used_twice_with_and_without_input_gradient(x_requires_grad, remove,
                                                                                    compiled):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 3)))
    theirs = _used_twice_run(model, torch_leaf, x_requires_grad, remove, False)
    assert_same(_used_twice_run(ported, tracer_leaf, x_requires_grad, remove, compiled), theirs)


class Ident(nn.Module):
    def forward(self, x):
        return x


class PassThrough(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, y):
        return self.lin(x), y  # y leaves unchanged


class KeywordInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, *, y):
        return self.lin(x) * y  # a keyword tensor: no entry in grad_input, as torch's


class IntegerOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        return h, h.argmax(-1)


class MaskInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, mask):
        return self.lin(x) * mask


class ListInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, xs):
        return self.lin(xs[0]) + xs[1]


class DictOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return {"a": self.lin(x), "b": x * 2}


EDGE_MODULES = {
    "identity": (Ident, lambda m, x, y: (m(x) * y).sum()),
    "pass-through output": (PassThrough, lambda m, x, y: (lambda a, b: (a * b).sum() + b.pow(2).sum())(*m(x, y))),
    "same tensor twice": (PassThrough, lambda m, x, y: (lambda a, b: (a * b).sum())(*m(x, x))),
    "keyword tensor": (KeywordInput, lambda m, x, y: m(x, y=y).pow(2).sum()),
    "integer output": (IntegerOutput, lambda m, x, y: m(x)[0].pow(2).sum()),
    "mask needing no gradient": (MaskInput, lambda m, x, y: m(x, (y > 0).to(x.dtype)).pow(2).sum()),
    "list input": (ListInput, lambda m, x, y: m([x, y]).pow(2).sum()),
    "dict output": (DictOutput, lambda m, x, y: (lambda d: (d["a"] * d["b"]).sum())(m(x))),
}


def _edge_module_run(kind: str, model: nn.Module, make: Callable, compiled: bool) -> List[Any]:
    seen: List[Any] = []

    def bw_pre(module, grad_output):
        seen.append(["pre", *[plain(g) for g in grad_output]])
        return tuple(None if g is None else g * 2 for g in grad_output)

    def bw(module, grad_input, grad_output):
        seen.append(["post", *[plain(g) for g in (*grad_input, *grad_output)]])
        return tuple(None if g is None else g - 1 for g in grad_input)

    model.register_full_backward_pre_hook(bw_pre)
    model.register_full_backward_hook(bw)
    program = EDGE_MODULES[kind][1]
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(2, 3, generator=g, dtype=D), torch.randn(2, 3, generator=g, dtype=D)) for _ in range(3)]

    def loss_of(x, y):
        return program(model, x, y)

    return _two_input_steps(model, loss_of, data, make, compiled, seen)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kind", list(EDGE_MODULES))
def test_full_backward_hooks_on_modules_of_unusual_inputs_and_outputs(kind, compiled):
    model, ported = both(EDGE_MODULES[kind][0])
    assert_same(_edge_module_run(kind, ported, tracer_leaf, compiled), _edge_module_run(kind, model, torch_leaf, False))


def _global_hooks_run(model: nn.Module, make: Callable) -> List[Any]:
    seen: List[Any] = []
    handles = [
        torch_module.register_module_full_backward_hook(lambda m, gi, go: seen.append(plain(go[0]))),
        torch_module.register_module_forward_hook(lambda m, a, o: o * 1.5 if isinstance(m, nn.Tanh) else None),
        torch_module.register_module_full_backward_pre_hook(
            lambda m, go: (go[0] * 2,) if isinstance(m, nn.Linear) else None),
    ]
    try:
        out: List[Any] = []
        for step in range(3):
            x = make(torch.randn(2, 3, generator=torch.Generator().manual_seed(step), dtype=D))
            loss = model(x).pow(2).sum()
            loss.backward()
            out += [plain(loss), plain(x.grad), *grads(model)]
            model.zero_grad()
        return out + seen
    finally:
        for handle in handles:
            handle.remove()


def test_global_module_hooks_act_on_ported_modules_as_on_torchs():
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert_same(_global_hooks_run(ported, tracer_leaf), _global_hooks_run(model, torch_leaf))


# ------------------------------------------------------------------------- tensor and grad_fn hooks, retain_grad


HANDLES: List[Any] = []  # hooks a program registers on the leaf w, removed after each call


def _fan_out(x, w, log):
    h = x * w
    h.register_hook(lambda g: (log.append(plain(g)), g * 2)[1])  # once, on the sum of both uses
    return (h * h).sum() + h.sum()


def _view_hook(x, w, log):
    h = x * w
    v = h[0]
    v.register_hook(lambda g: g * 3)
    h.register_hook(lambda g: log.append(plain(g)))
    return v.exp().sum() + h.sum()


def _retain_then_in_place(x, w, log):
    h = x * w
    h.retain_grad()
    h.register_hook(lambda g: (log.append(plain(g)), g + 1)[1])  # on the version before mul_
    h.mul_(3)
    h.register_hook(lambda g: (log.append(plain(g)), g * 2)[1])  # on the version after
    log.append(h)  # its .grad, read after backward: the gradient of the newest version
    return (h ** 2).sum()


def _retained_view_changed_in_place(x, w, log):
    h = x * w
    v = h[:, 0]
    v.retain_grad()
    v.add_(1)
    h.retain_grad()
    log.extend([v, h])
    return (h ** 2).sum()


def _root_hook(x, w, log):
    out = (x * w).sum()
    out.register_hook(lambda g: g * 5)
    out.retain_grad()
    log.append(out)
    return out


def _grad_fn_and_tensor_hooks(x, w, log):
    y = (x * w).sin()
    y.register_hook(lambda g: (log.append(plain(g)), g * 2)[1])
    y.grad_fn.register_prehook(lambda go: (log.append(plain(go[0])), (go[0] + 1,))[1])
    y.grad_fn.register_hook(lambda gi, go: log.append([plain(gi[0]), plain(go[0])]))
    return y.sum() * 3


def _chunks(x, w, log):
    a, b = (x * w).chunk(2, dim=1)
    a.register_hook(lambda g: g * 2)
    b.retain_grad()
    log.append(b)
    return (a * b).sum() + b.sum()


def _unbind(x, w, log):
    parts = (x * w).unbind(0)
    parts[1].register_hook(lambda g: g * -1)
    return sum(p.pow(2).sum() for p in parts)


def _leaf_hooks(x, w, log):
    HANDLES.append(w.register_hook(lambda g: (log.append(plain(g)), g * 2)[1]))
    HANDLES.append(w.register_hook(lambda g: (log.append(plain(g)), g + 1)[1]))
    return (x * w).sum() + (w ** 2).sum()


TENSOR_HOOK_PROGRAMS = {f.__name__[1:]: f for f in (_fan_out, _view_hook, _retain_then_in_place,
                                                    _retained_view_changed_in_place, _root_hook,
                                                    _grad_fn_and_tensor_hooks, _chunks, _unbind, _leaf_hooks)}


def _tensor_hooks_run(name: str, make: Callable, compiled: bool) -> List[Any]:
    g = torch.Generator().manual_seed(4)
    x0, w0 = torch.randn(2, 4, generator=g, dtype=D), torch.randn(2, 4, generator=g, dtype=D)
    x, w = make(x0), make(w0)
    log: List[Any] = []
    program = TENSOR_HOOK_PROGRAMS[name]
    fn = tt.compile(lambda x: program(x, w, log), (x,)) if compiled else (lambda x: program(x, w, log))
    out: List[Any] = []
    for _ in range(3):
        log.clear()
        x.grad = w.grad = None
        loss = fn(x)
        loss.backward()
        out += [plain(loss), plain(x.grad), plain(w.grad)]
        out += [plain(e.grad) if isinstance(e, torch.Tensor) and e.requires_grad else e for e in flat(log)]
        while HANDLES:  # the leaf's hooks, registered anew on each call, removed
            HANDLES.pop().remove()
    return out


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", list(TENSOR_HOOK_PROGRAMS))
def test_tensor_hooks_retain_grad_and_grad_fn_hooks_as_torch(name, compiled):
    assert_same(_tensor_hooks_run(name, tracer_leaf, compiled), _tensor_hooks_run(name, torch_leaf, False))


def _accumulate_grad_node_run(make: Callable) -> List[Any]:
    g = torch.Generator().manual_seed(5)
    w, x = make(torch.randn(3, generator=g, dtype=D)), make(torch.randn(3, generator=g, dtype=D))
    y = (w * x).exp()
    accumulate = y.grad_fn.next_functions[0][0].next_functions[0][0]
    log: List[Any] = []
    accumulate.register_prehook(lambda go: (log.append(plain(go[0])), (go[0] * 2,))[1])
    accumulate.register_hook(lambda gi, go: log.append([len(gi), plain(go[0])]))
    y.sum().backward()
    return [plain(w.grad), plain(x.grad), *flat(log)]


def test_hooks_on_a_leafs_accumulate_grad_node_as_torch():
    assert_same(_accumulate_grad_node_run(tracer_leaf), _accumulate_grad_node_run(torch_leaf))


def _hooks_under_grad_and_inputs(model: nn.Module, make: Callable, how: str) -> List[Any]:
    log: List[Any] = []
    model[2].register_full_backward_hook(lambda m, gi, go: (log.append([plain(g) for g in (*gi, *go)]),
                                                              (gi[0] * 2,))[1])
    model[0].register_full_backward_pre_hook(lambda m, go: (log.append(plain(go[0])), (go[0] + 0.5,))[1])
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: log.append(["acc", plain(p.grad)]))
    model[0].weight.register_hook(lambda g: g * 3)
    x = make(torch.randn(5, 3, generator=torch.Generator().manual_seed(6), dtype=D))
    h = model[1](model[0](x))
    h.retain_grad()
    loss = model[2](h).pow(2).sum()
    out: List[Any] = []
    if how == "autograd.grad":  # no .grad filled, no post-accumulate hook; tensor and module hooks run
        out += list(torch.autograd.grad(loss, [model[0].weight, x], retain_graph=True))
        out += [plain(h.grad), plain(model[0].weight.grad), plain(x.grad)]
        out += list(torch.autograd.grad(loss, [h]))
        out += [plain(h.grad)]
    elif how == "backward(inputs=...)":
        loss.backward(inputs=[model[2].weight, h], retain_graph=True)
        out += [plain(h.grad), plain(x.grad), *grads(model)]
        loss.backward(inputs=[x, model[0].bias])
        out += [plain(h.grad), plain(x.grad), *grads(model)]
    elif how == "retain_graph twice":
        loss.backward(retain_graph=True)
        loss.backward()
        out += [plain(h.grad), plain(x.grad), *grads(model)]
    return out + flat(log)


@pytest.mark.parametrize("how", ["autograd.grad", "backward(inputs=...)", "retain_graph twice"])
def test_hooks_and_retain_grad_under_autograd_grad_inputs_and_a_second_backward(how):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert_same(_hooks_under_grad_and_inputs(ported, tracer_leaf, how),
                _hooks_under_grad_and_inputs(model, torch_leaf, how))


def _hooks_changing_between_calls(model: nn.Module, make: Callable, compiled: bool) -> List[Any]:
    """Forward hooks read a Python counter, a backward hook acts on some calls only, the compiled function itself
    registers hooks or retain_grad on alternate calls: every call must do what its own Python says."""
    state = {"k": 0}
    log: List[Any] = []
    model[0].register_forward_hook(lambda m, a, o: o * (1 + 0.1 * state["k"]))
    model[1].register_forward_pre_hook(lambda m, a: (a[0] * 2,) if state["k"] % 2 else None)
    model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * state["k"],) if state["k"] % 3 == 1 else None)

    def f(x):
        h = model[1](model[0](x))
        if state["k"] % 2 == 0:
            h.retain_grad()
            h.register_hook(lambda g: g * -1)
        else:
            h.register_hook(lambda g: log.append(plain(g)))
        return model[2](h).pow(2).sum(), h

    g = torch.Generator().manual_seed(7)
    data = [make(torch.randn(5, 3, generator=g, dtype=D)) for _ in range(7)]
    fn = tt.compile(f, (data[0],)) if compiled else f
    out: List[Any] = []
    for step, x in enumerate(data):
        state["k"] = step
        loss, h = fn(x)
        loss.backward()
        out += [plain(loss), plain(h.grad), plain(x.grad), *grads(model)]
        model.zero_grad()
    return out + log


@pytest.mark.parametrize("compiled", [False, True])
def test_hooks_that_change_between_calls(compiled):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert_same(_hooks_changing_between_calls(ported, tracer_leaf, compiled),
                _hooks_changing_between_calls(model, torch_leaf, False))


def _post_accumulate_run(model: nn.Module, make: Callable, kind: str) -> List[Any]:
    log: List[Any] = []
    if kind == "optimizer in backward":
        def step_and_clear(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(step_and_clear)
    else:  # a tied layer: its hooks run once per backward, on the whole sum
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: log.append(plain(p.grad)))
    out: List[Any] = []
    for step in range(3):
        x = make(torch.randn(2, 3, generator=torch.Generator().manual_seed(step), dtype=D))
        loss = model(x).pow(2).sum()
        loss.backward()
        out += [plain(loss), plain(x.grad), *grads(model), *[plain(p) for p in model.parameters()]]
        model.zero_grad()
    return out + log


@pytest.mark.parametrize("kind", ["optimizer in backward", "tied layer"])
def test_post_accumulate_grad_hooks(kind):
    def build():
        if kind == "tied layer":
            shared = nn.Linear(3, 3)
            return nn.Sequential(shared, nn.Tanh(), shared)
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    model, ported = both(build)
    assert_same(_post_accumulate_run(ported, tracer_leaf, kind), _post_accumulate_run(model, torch_leaf, kind))


# -------------------------------------------------------------------------------------- utilities while training


CLIPS = {
    "norm": lambda m: clip_grad_norm_(m.parameters(), 0.5),
    "inf norm": lambda m: clip_grad_norm_(m.parameters(), 0.5, norm_type=float("inf")),
    "1-norm, no foreach": lambda m: clip_grad_norm_(m.parameters(), 0.5, norm_type=1.0, foreach=False),
    "value": lambda m: clip_grad_value_(m.parameters(), 0.05),
    "total norm then clip": lambda m: (lambda n: (torch.nn.utils.clip_grads_with_norm_(m.parameters(), 0.3, n), n)[1])(
        torch.nn.utils.get_total_norm([p.grad for p in m.parameters()], 2.0)),
    "a missing grad, foreach": lambda m: (setattr(m[2].bias, "grad", None),
                                          clip_grad_norm_(m.parameters(), 0.3, foreach=True))[1],
}


def _clip_run(model: nn.Module, make: Callable, clip: str) -> List[Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(8)
    out: List[Any] = []
    for step in range(4):
        x = make(torch.randn(4, 3, generator=g, dtype=D), False)
        (model(x).pow(2).sum() * 10).backward()
        out += [plain(CLIPS[clip](model)), plain(parameters_to_vector(model.parameters()))]
        out += [plain(parameters_to_vector([p.grad for p in model.parameters() if p.grad is not None]))]
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
        if step == 1:
            vector_to_parameters(parameters_to_vector(model.parameters()) * 0.9, model.parameters())
    return out + [type(p).__name__ for p in model.parameters()]


@pytest.mark.parametrize("clip", list(CLIPS))
def test_gradient_clipping_and_parameter_vectors_while_training(clip):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)))
    assert_same(_clip_run(ported, tracer_leaf, clip), _clip_run(model, torch_leaf, clip), tol=1e-10)


class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = nn.Parameter(torch.tensor(1.5, dtype=D))

    def forward(self, X):
        return X * self.k


PARAMETRIZE = {
    "orthogonal": lambda m: parametrizations.orthogonal(m[0]),
    "orthogonal householder": lambda m: parametrizations.orthogonal(m[0], orthogonal_map="householder"),
    "orthogonal cayley": lambda m: parametrizations.orthogonal(m[0], orthogonal_map="cayley"),
    "weight_norm": lambda m: (parametrizations.weight_norm(m[0]), parametrizations.weight_norm(m[2], dim=None)),
    "old weight_norm": lambda m: torch.nn.utils.weight_norm(m[0]),
    "spectral_norm": lambda m: (parametrizations.spectral_norm(m[0]),
                                parametrizations.spectral_norm(m[2], n_power_iterations=3)),
    "old spectral_norm": lambda m: torch.nn.utils.spectral_norm(m[0]),
    "custom symmetric": lambda m: parametrize.register_parametrization(m[0], "weight", Symmetric()),
    "custom with a parameter, chained": lambda m: (parametrize.register_parametrization(m[2], "weight", Scaled()),
                                                   parametrize.register_parametrization(m[2], "weight", nn.Identity())),
}


def _parametrized_run(model: nn.Module, make: Callable, cached: bool, remove: bool) -> List[Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(9)
    out: List[Any] = []
    for step in range(3):
        if remove and step == 2:
            for layer in model:
                for name in list(getattr(layer, "parametrizations", {})):
                    parametrize.remove_parametrizations(layer, name, leave_parametrized=True)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = make(torch.randn(5, 4, generator=g, dtype=D), False)
        if cached:
            with parametrize.cached():
                loss = model(x).pow(2).sum() + model(x * 2).sum()
        else:
            loss = model(x).pow(2).sum()
        loss.backward()
        out += [plain(loss), *grads(model)]
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        out.append(plain(model[0].weight))
    return out + [n for n, _ in model.named_parameters()]


@pytest.mark.parametrize("port_first", [False, True])
@pytest.mark.parametrize("kind", list(PARAMETRIZE))
def test_parametrizations_train_as_torchs(kind, port_first):
    """Parametrized before porting, or a ported model parametrized (its random draws made from the same seed)."""
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)).to(D)

    model, ported = build(), port(build())
    for m in (model, ported) if port_first else (model,):
        torch.manual_seed(11)
        PARAMETRIZE[kind](m)
    if not port_first:
        ported = build()
        torch.manual_seed(11)
        PARAMETRIZE[kind](ported)
        port(ported)
    cached = kind == "custom symmetric"
    remove = kind in ("orthogonal", "weight_norm", "custom with a parameter, chained")
    assert_same(_parametrized_run(ported, tracer_leaf, cached, remove),
                _parametrized_run(model, torch_leaf, cached, remove), tol=1e-10)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x).tanh()
        return self.b(self.a(h).sin() + h)  # a used twice


def _hooked_training(model: nn.Module, make: Callable, compiled: bool, x_requires_grad: bool) -> List[Any]:
    log: List[Any] = []
    model.a.register_forward_pre_hook(lambda m, args: (args[0] * 1.5,))
    model.a.register_forward_hook(lambda m, args, out: out + 0.1)
    model.b.register_full_backward_pre_hook(lambda m, go: (go[0] * 2,))
    model.a.register_full_backward_hook(
        lambda m, gi, go: (log.append([plain(gi[0]), plain(go[0])]), (None if gi[0] is None else gi[0] * 0.5,))[1])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_of(x):
        out = model(x)
        out.register_hook(lambda g: g * 3)
        return out.pow(2).sum()

    g = torch.Generator().manual_seed(10)
    data = [make(torch.randn(3, 4, generator=g, dtype=D), x_requires_grad) for _ in range(4)]
    fn = tt.compile(loss_of, (data[0],)) if compiled else loss_of
    log.clear()
    out: List[Any] = []
    for step, x in enumerate(data):
        loss = fn(x)
        loss.backward()
        out += [plain(clip_grad_norm_(model.parameters(), 1.0)), plain(loss), *grads(model), plain(x.grad)]
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
    return out + flat(log)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("x_requires_grad", [False, True])
@pytest.mark.parametrize("kind", ["plain", "orthogonal", "weight_norm", "spectral_norm"])
def test_hooked_parametrized_training_compiled_and_eager(kind, x_requires_grad, compiled):
    def build():
        torch.manual_seed(0)
        m = Net().to(D)
        {"plain": lambda: None, "orthogonal": lambda: parametrizations.orthogonal(m.a),
         "weight_norm": lambda: parametrizations.weight_norm(m.a),
         "spectral_norm": lambda: parametrizations.spectral_norm(m.b)}[kind]()
        return m

    assert_same(_hooked_training(port(build()), tracer_leaf, compiled, x_requires_grad),
                _hooked_training(build(), torch_leaf, False, x_requires_grad), tol=1e-10)


def _changes_mid_training(model: nn.Module, make: Callable, compiled: bool, change: str) -> List[Any]:
    g = torch.Generator().manual_seed(11)
    data = [make(torch.randn(5, 3, generator=g, dtype=D), False) for _ in range(6)]

    def loss_of(x):
        return model(x).pow(2).sum()

    fn = tt.compile(loss_of, (data[0],)) if compiled else loss_of
    handles: List[Any] = []
    out: List[Any] = []
    for step, x in enumerate(data):
        if change == "freeze" and step == 2:
            model[0].weight.requires_grad_(False)
            model[0].weight.grad = None
        if change == "freeze" and step == 4:
            model[0].weight.requires_grad_(True)
        if change in ("load_state_dict", "load_state_dict(assign=True)") and step == 2:
            state = {k: v.clone() * 0.5 for k, v in model.state_dict().items()}
            model.load_state_dict(state, assign=change.endswith("(assign=True)"))
        if change == "hooks added, then removed":
            if step == 1:
                handles += [model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 10,)),
                            model[0].weight.register_hook(lambda g: g * 7),
                            model[1].register_forward_hook(lambda m, a, o: o * 2)]
            if step == 3:
                for handle in handles:
                    handle.remove()
        if change == "accumulate":
            fn(x).backward()
            fn(x * 2).backward()
        else:
            fn(x).backward()
        out += [*grads(model), *[type(p.grad).__name__ for p in model.parameters()]]
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.05 * p.grad
        if change != "accumulate" or step % 2:
            model.zero_grad(set_to_none=step % 3 == 0)
    return out + [plain(p) for p in model.parameters()]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("change", ["freeze", "load_state_dict", "load_state_dict(assign=True)",
                                    "hooks added, then removed", "accumulate"])
def test_training_changes_between_calls(change, compiled):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert_same(_changes_mid_training(ported, tracer_leaf, compiled, change),
                _changes_mid_training(model, torch_leaf, False, change), tol=1e-10)


def _state_round_trips(model: nn.Module, make: Callable, how: str, ported: bool) -> List[Any]:
    def fresh():
        torch.manual_seed(1)
        m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(D)
        return port(m) if ported else m

    g = torch.Generator().manual_seed(12)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    out: List[Any] = []
    for step in range(5):
        if step == 2:
            if how == "model and optimizer into fresh objects":
                state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
                model = fresh()
                model.load_state_dict(state)
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                opt.load_state_dict(opt_state)
            elif how == "keep_vars, assign":
                state = model.state_dict(keep_vars=True)
                model = fresh()
                model.load_state_dict(state, assign=True)
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
            elif how == "float32 state into float64":
                model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
            elif how == "float() then double()":
                model.float()
                model.double()
        x = make(torch.randn(5, 3, generator=g, dtype=D), False)
        loss = model(x).pow(2).sum()
        loss.backward()
        out += [plain(loss), *grads(model)]
        opt.step()
        opt.zero_grad(set_to_none=False)
        out += [plain(p) for p in model.parameters()]
    state = model.state_dict()
    return out + sorted(state) + [type(v).__name__ for v in state.values()]


@pytest.mark.parametrize("how", ["model and optimizer into fresh objects", "keep_vars, assign",
                                 "float32 state into float64", "float() then double()"])
def test_state_dict_round_trips_during_training(how):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert_same(_state_round_trips(ported, tracer_leaf, how, True), _state_round_trips(model, torch_leaf, how, False),
                tol=1e-10)


def _grad_semantics(make: Callable, module: nn.Module) -> List[Any]:
    w = make(torch.randn(3, generator=torch.Generator().manual_seed(13), dtype=D))
    out: List[Any] = []
    (w * 2).sum().backward()
    first = w.grad
    (w * 3).sum().backward()
    out += [w.grad is first, plain(w.grad), type(w.grad) is torch.Tensor]  # accumulated in place, same object
    w.grad.zero_()
    (w * 3).sum().backward()
    out += [w.grad is first]
    mine = torch.ones(3, dtype=D)
    w.grad = mine
    (w * 3).sum().backward()
    out += [w.grad is mine, plain(mine)]  # a .grad the user set is accumulated into
    w.grad = None
    (w ** 2).sum().backward(create_graph=True)
    graph_grad = w.grad
    out += [graph_grad.requires_grad, graph_grad.grad_fn is not None]
    (w ** 2).sum().backward(create_graph=True)
    out += [w.grad is graph_grad, plain(w.grad)]  # not accumulated in place: a new tensor, as torch's
    low = make(torch.randn(3, generator=torch.Generator().manual_seed(14), dtype=torch.float32))
    (low.double() * 2).sum().backward()
    out += [low.grad.dtype, plain(low.grad)]
    x = make(torch.randn(4, 3, generator=torch.Generator().manual_seed(15), dtype=D), False)
    module(x).sum().backward()
    grad, weight = module.weight.grad, module.weight
    module.float()  # .grad converted with the parameter, the same objects kept
    out += [module.weight.grad.dtype, module.weight is weight, module.weight.grad is grad]
    (module(x.float()) ** 2).sum().backward(create_graph=True)
    graph_grad = module.weight.grad
    module.zero_grad(set_to_none=False)  # detached and zeroed in place
    out += [module.weight.grad is graph_grad, module.weight.grad.requires_grad, plain(module.weight.grad)]
    module.requires_grad_(False)
    out += [[p.requires_grad for p in module.parameters()], module(x.float()).requires_grad]
    return out


def test_grad_identity_dtype_and_zero_grad_semantics():
    model, ported = both(lambda: nn.Linear(3, 2))
    assert_same(_grad_semantics(tracer_leaf, ported), _grad_semantics(torch_leaf, model))


def _whole_step(model: nn.Module, make: Callable, compiled: bool, variant: str) -> List[Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    log: List[Any] = []
    model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,))
    model[0].weight.register_post_accumulate_grad_hook(lambda p: log.append(plain(p.grad)))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if variant == "accumulate, clip norm":
            (model(x * 0.5) - y).abs().mean().backward()
        if variant == "clip value":
            clip_grad_value_(model.parameters(), 0.01)
            n = parameters_to_vector([p.grad for p in model.parameters()]).norm()
        else:
            n = clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        return loss.detach(), n

    g = torch.Generator().manual_seed(16)
    data = [(make(torch.randn(5, 3, generator=g, dtype=D), False), make(torch.randn(5, 1, generator=g, dtype=D), False))
            for _ in range(5)]
    fn = tt.compile(step, data[0]) if compiled else step
    out: List[Any] = []
    for x, y in data:
        loss, n = fn(x, y)
        out += [plain(loss), plain(n), *grads(model), *[plain(p) for p in model.parameters()]]
    return out + log


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("variant", ["clip norm", "clip value", "accumulate, clip norm"])
def test_a_whole_step_with_hooks_and_clipping(variant, compiled):
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1)))
    assert_same(_whole_step(ported, tracer_leaf, compiled, variant), _whole_step(model, torch_leaf, False, variant))


# ---------------------------------------------------------------------------------------- known divergences


def _clamped_broadcast_gradient(make: Callable, compiled: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(17)
    x, b = make(torch.randn(4, 3, generator=g, dtype=D)), make(torch.randn(3, generator=g, dtype=D))

    def f(x):
        y = x + b  # b broadcast over the rows
        y.grad_fn.register_hook(lambda gi, go: (gi[0], gi[1].clamp(-1, 1)))
        return (y * y).sum()

    fn = tt.compile(f, (x,)) if compiled else f
    for _ in range(3):
        b.grad = None
        fn(x).backward()
    return plain(b.grad)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_grad_fn_post_hook_sees_a_broadcast_inputs_gradient_reduced_as_torchs(compiled):
    theirs = _clamped_broadcast_gradient(torch_leaf, False)
    assert bool((theirs.abs() <= 1).all())  # torch clamps the summed gradient
    assert_same([_clamped_broadcast_gradient(tracer_leaf, compiled)], [theirs])


def _post_hook_arity(make: Callable, op: Callable) -> List[Any]:
    x = make(torch.randn(2, 3, generator=torch.Generator().manual_seed(18), dtype=D))
    y = op(x)
    y.grad_fn.register_hook(lambda gi, go: (gi[0] * 10,))  # torch's node has one input here
    y.sum().backward()
    return [plain(x.grad)]


@pytest.mark.xfail(strict=True, reason="grad_fn.register_hook's grad_inputs hold one entry per argument of the call "
                   "(a Python number, an int exponent, a clamp bound, a bool condition, a list of tensors as one "
                   "entry) where torch's node has one per differentiable tensor input of the overload: x.pow(2) "
                   "gives (gx, None) where torch gives (gx,), so torch's hook is refused (autograd/grad_fn_hooks.py)")
@pytest.mark.parametrize("op", [lambda x: x.pow(2), lambda x: torch.clamp(x, min=0.1)], ids=["pow", "clamp"])
def test_a_grad_fn_post_hook_gets_one_entry_per_tensor_input_as_torchs(op):
    assert_same(_post_hook_arity(tracer_leaf, op), _post_hook_arity(torch_leaf, op))


def _plain_leaf_into_hooked_ported_module(model: nn.Module) -> List[Any]:
    seen: List[Any] = []
    model.register_full_backward_hook(lambda m, gi, go: seen.append(plain(gi[0])))
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(19), dtype=D, requires_grad=True)
    model(x).pow(2).sum().backward()
    return [plain(x.grad), *grads(model), *seen]


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason="a ported module with a full backward hook, called on "
                   "a plain torch leaf that requires grad: torch's Module._call_impl wraps the input in "
                   "BackwardHookFunction (torch autograd) before the ported forward turns plain leaves into tracers "
                   "(nn/module.py: call_in_module), so the input meets the tracer weight as a torch-autograd result "
                   "and dispatch refuses it (torch: runs). Without the hook, or on a tt.nn module, it runs.")
def test_a_plain_leaf_into_a_ported_module_with_a_full_backward_hook():
    model, ported = both(lambda: nn.Sequential(nn.Linear(3, 3)))
    assert_same(_plain_leaf_into_hooked_ported_module(ported), _plain_leaf_into_hooked_ported_module(model))


def test_hook_type_errors_match_torch():
    """A tensor hook returning another dtype is refused by both (torch's message, with torchtrace's advice)."""
    for make in (torch_leaf, tracer_leaf):
        w = make(torch.randn(3, dtype=D))
        h = w * 2
        h.register_hook(lambda g: g.float())
        with pytest.raises(RuntimeError, match="has changed the type of value"):
            h.exp().sum().backward()


def _two_input_steps(model: nn.Module, loss_of: Callable, data: list, make: Callable, compiled: bool,
                     seen: list) -> List[Any]:
    """loss_of(x, y).backward() for each (x, y) of data, eager or compiled: losses, input and model gradients and what
    the hooks saw, per step."""
    fn = tt.compile(loss_of, tuple(make(v) for v in data[0])) if compiled else loss_of
    out: List[Any] = []
    for x0, y0 in data:
        model.zero_grad()
        seen.clear()
        x, y = make(x0), make(y0)
        loss = fn(x, y)
        loss.backward()
        out += [plain(loss), plain(x.grad), plain(y.grad), *grads(model), *flat(seen)]
    return out
