"""Forward mode through tt.nn layers and ported torch models: one pass of tangent rules, equal to torch.func.jvp
and to finite differences (float64)."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtrace as tt
from torchtrace.forward import table


def small_cnn(track_running_stats=True):
    """(torch.func.jvp refuses the in-place update of running statistics in training: the training case has none.)"""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=track_running_stats),
                         nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 3, 3), nn.GroupNorm(1, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(3, 5), nn.LogSoftmax(-1))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 10)
        self.drop = nn.Dropout(0.1)

    def forward(self, tokens, extra):
        h = self.norm(self.embed(tokens) + extra)
        q, k, v = self.qkv(h).chunk(3, -1)
        h = h + self.drop(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return nn.functional.cross_entropy(self.out(h).flatten(0, 1), tokens.flatten())


def mlp_loss():
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    target = torch.tensor([0, 2, 1, 1])
    uniform = torch.ones(4, 3, dtype=torch.float64) / 3
    return model, lambda out: (nn.functional.cross_entropy(out, target)
                               + nn.functional.mse_loss(out.softmax(-1), uniform))


CASES = {
    "cnn (train: batch statistics)": lambda: (small_cnn(False).double().train(), (torch.randn(3, 2, 8, 8).double(),)),
    "cnn (eval: running statistics)": lambda: (small_cnn().double().eval(), (torch.randn(3, 2, 8, 8).double(),)),
    "transformer block (eval)": lambda: (TinyTransformer().double().eval(),
                                         (torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8).double())),
}


def functional(model, params, inputs):
    """f(*parameter values, float input) -> output, the model run with those parameter values."""
    names = [name for name, _ in params]

    def f(*values):
        state = dict(zip(names, values[:len(names)]))
        floats = iter(values[len(names):])
        args = [next(floats) if x.is_floating_point() else x for x in inputs]
        return torch.func.functional_call(model, state, tuple(args))

    return f


@pytest.mark.parametrize("case", sorted(CASES))
def test_ported_model_jvp_equals_torch_func_jvp_and_finite_differences(case):
    torch.manual_seed(0)
    model, inputs = CASES[case]()
    params = list(model.named_parameters())
    primals = tuple(p.detach() for _, p in params) + tuple(x for x in inputs if x.is_floating_point())
    tangents = tuple(torch.randn_like(p) for p in primals)
    f = functional(model, params, inputs)
    state = {name: b.clone() for name, b in model.named_buffers()}
    theirs = torch.func.jvp(f, primals, tangents)
    model.load_state_dict(state, strict=False)
    tt.port(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no op may need its backward transposed
        value, ours, report = tt.jvp(f, primals, tangents, report=True)
    assert set(report.values()) == {"tangent rule"}
    torch.testing.assert_close(value, theirs[0])
    torch.testing.assert_close(ours, theirs[1])
    if not model.training:  # eval mode changes no buffer: finite differences can rerun it
        eps = 1e-6
        plus = f(*(p + eps * t for p, t in zip(primals, tangents)))
        minus = f(*(p - eps * t for p, t in zip(primals, tangents)))
        torch.testing.assert_close(ours, ((plus - minus) / (2 * eps)).as_subclass(torch.Tensor), rtol=1e-5, atol=1e-6)


def test_training_loss_of_an_mlp_in_one_pass():
    torch.manual_seed(0)
    model, loss = mlp_loss()
    model = model.double()
    x = torch.randn(4, 6, dtype=torch.float64)
    v = torch.randn_like(x)
    f = lambda t: loss(model(t).to(torch.float64))  # noqa: E731  (a dtype conversion on the path)
    theirs = torch.func.jvp(f, (x,), (v,))[1]
    tt.port(model)
    value, jv, report = tt.jvp(f, (x,), (v,), report=True)
    assert set(report.values()) == {"tangent rule"}
    torch.testing.assert_close(jv, theirs)
    eps = 1e-6
    with tt.no_grad():
        fd = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
    torch.testing.assert_close(jv, fd.as_subclass(torch.Tensor), rtol=1e-5, atol=1e-7)


def test_hessian_vector_product_forward_over_reverse():
    """tt.jvp of tt.grad(create_graph=True): the backward's own ops carry tangents too."""
    torch.manual_seed(0)
    x, v = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    f = lambda t: (t.sin() * t.exp()).sum() + t.pow(3).prod()  # noqa: E731
    _, hv = tt.jvp(lambda t: tt.grad(f(t), t, create_graph=True)[0], (x,), (v,))
    torch.testing.assert_close(hv, torch.func.jvp(torch.func.grad(f), (x,), (v,))[1])


def test_every_tangent_rule_names_a_registered_gradient_rule():
    import torchtrace.autograd.views  # noqa: F401  (its rules are registered by name only)

    known = set(table.our_rules())
    assert set(table.TANGENTS) - known == set(), "tangent rules for unknown gradient rules (renamed?)"
    assert all(table.MATH[name] for name in table.TANGENTS)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_weights_and_smoothing_on_k_dim_inputs_has_torch_funcs_tangent(reduction):
    """(N, C, d1, d2) logits with class weights and label smoothing: the 'mean' denominator read each target's weight
    with gather, which wants a 1-D target (it raised "Index tensor must have the same number of dimensions"); now the
    tangent of torch.func.jvp, also for 2-D inputs and all-zero weights."""
    torch.manual_seed(0)
    x, v = torch.randn(2, 4, 3, 2, dtype=torch.float64), torch.randn(2, 4, 3, 2, dtype=torch.float64)
    target = torch.tensor([[[0, 1], [2, 3], [1, 1]], [[3, 2], [0, 0], [2, 1]]])
    for weight in (torch.tensor([1.0, 0.0, 2.0, 0.5], dtype=torch.float64), torch.zeros(4, dtype=torch.float64)):
        for inputs in ((x, v, target), (x[:, :, 0, 0], v[:, :, 0, 0], target[:, 0, 0])):
            def f(z, t=inputs[2]):
                return F.cross_entropy(z, t, weight=weight, ignore_index=2, label_smoothing=0.1, reduction=reduction)

            ours = tt.jvp(f, (inputs[0],), (inputs[1],))[1]
            theirs = torch.func.jvp(f, (inputs[0],), (inputs[1],))[1]
            torch.testing.assert_close(ours.as_subclass(torch.Tensor), theirs, rtol=1e-12, atol=1e-14, equal_nan=True)
