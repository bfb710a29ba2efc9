"""Dropout rules (F.dropout, dropout1d/2d/3d, alpha_dropout, feature_alpha_dropout and their torch.* forms) and modules.

Every call reseeds torch's generator, so the tracer run, the torch autograd run and each finite-difference
evaluation draw the same mask.
"""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
from torchtrace.nn.dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout

pytestmark = pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input")

torch.manual_seed(0)
X, X3, X4 = torch.randn(4, 5), torch.randn(2, 3, 4), torch.randn(2, 3, 2, 3)


def seeded(fn, seed=7):
    def run(*args):
        torch.manual_seed(seed)
        return fn(*args)

    return run


@pytest.mark.parametrize("fn, x", [
    (lambda x: F.dropout(x), X),
    (lambda x: F.dropout(x, 0.2), X),
    (lambda x: F.dropout(x, p=0.8, training=True), X3),
    (lambda x: F.dropout(x, 0.0), X),
    (lambda x: F.dropout(x, 1.0), X),
    (lambda x: F.dropout(x, 0.5, False), X),  # eval: identity
    (lambda x: F.dropout(input=x, p=0.4), X),
    (lambda x: torch.dropout(x, 0.3, True), X),
    (lambda x: torch.dropout(x, 0.3, train=False), X),
    (lambda x: F.dropout1d(x, 0.5), X3),
    (lambda x: F.dropout1d(x, 0.5), X3[0]),  # unbatched (C, L)
    (lambda x: F.dropout2d(x, 0.5), X4),
    (lambda x: F.dropout2d(x, 0.5), X3),  # 3-D: torch's channel-wise 1-D behaviour
    (lambda x: F.dropout3d(x, 0.5), X4.unsqueeze(2)),
    (lambda x: torch.feature_dropout(x, 0.5, True), X4),
    (lambda x: F.dropout(x, 0.5), non_contiguous(X)),
    (lambda x: F.dropout(x, 0.5), X.double()),
    (lambda x: F.dropout(x, 0.5), torch.tensor(1.5)),  # 0-d
    (lambda x: F.dropout(x, 0.5) * x, X),  # input used twice
    (lambda x: F.dropout(F.dropout(x, 0.3), 0.3), X),  # two independent masks
])
def test_dropout_functions(fn, x):
    check_op(seeded(fn), x)


@pytest.mark.parametrize("seed", [0, 1, 123])
@pytest.mark.parametrize("fn, x", [
    (lambda x: F.dropout(x, 0.3), torch.randn(50)),
    (lambda x: F.dropout(x, 0.5, True), torch.randn(6, 7).double()),
    (lambda x: F.dropout2d(x, 0.4), torch.randn(4, 5, 2, 2)),
    (lambda x: F.dropout1d(x, 0.6), torch.randn(3, 8, 2)),
])
def test_same_mask_as_torch_under_the_same_seed(fn, x, seed):
    torch.manual_seed(seed)
    ours = fn(tt.tracer(x, requires_grad=True))
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    theirs = fn(x)
    after_theirs = torch.rand(3)
    assert torch.equal(ours.as_subclass(torch.Tensor), theirs)  # bit for bit
    assert torch.equal(after_ours, after_theirs)  # and the generator advanced by as much


@pytest.mark.parametrize("ours, theirs, x", [
    (lambda: Dropout(), lambda: torch.nn.Dropout(), X),
    (lambda: Dropout(0.25), lambda: torch.nn.Dropout(0.25), X3),
    (lambda: Dropout1d(0.5), lambda: torch.nn.Dropout1d(0.5), X3),
    (lambda: Dropout2d(0.5), lambda: torch.nn.Dropout2d(0.5), X4),
    (lambda: Dropout3d(0.5), lambda: torch.nn.Dropout3d(0.5), X4.unsqueeze(2)),
])
def test_modules_match_torch_in_train_and_eval(ours, theirs, x):
    layer, twin = ours(), theirs()
    assert repr(layer).replace("inplace=True", "inplace=False") == repr(twin)
    for train in (True, False):
        layer.train(train)
        twin.train(train)
        torch.manual_seed(11)
        inputs = tt.tracer(x, requires_grad=True)
        out = layer(inputs)
        torch.manual_seed(11)
        expected_input = x.clone().requires_grad_(True)
        expected = twin(expected_input)
        assert torch.equal(out.as_subclass(torch.Tensor), expected.detach())
        out.backward(torch.ones_like(x))
        expected.backward(torch.ones_like(x))
        assert torch.equal(inputs.grad, expected_input.grad)  # m / (1 - p), or ones in eval
        assert (out is inputs) == (expected is expected_input)  # eval: torch hands back the input itself
        assert out is inputs or out.grad_fn.module is layer


def test_gradient_is_the_mask_over_keep_probability():
    x = tt.tracer(torch.randn(1000, dtype=torch.float64), requires_grad=True)
    y = F.dropout(x, 0.25)
    y.sum().backward()
    kept = y.as_subclass(torch.Tensor) != 0
    assert set(x.grad.unique().tolist()) == {0.0, 1 / 0.75}
    assert torch.equal(x.grad != 0, kept)
    assert 0.6 < kept.float().mean().item() < 0.9


def test_same_seed_reproduces_and_other_seed_differs():
    x = tt.tracer(torch.randn(200), requires_grad=True)
    first, again, other = (seeded(lambda t: F.dropout(t, 0.5), seed)(x) for seed in (3, 3, 4))
    assert torch.equal(first.as_subclass(torch.Tensor), again.as_subclass(torch.Tensor))
    assert not torch.equal(first.as_subclass(torch.Tensor), other.as_subclass(torch.Tensor))


def test_eval_mode_draws_no_random_numbers():
    layer = Dropout(0.5).eval()
    torch.manual_seed(5)
    out = layer(tt.tracer(X, requires_grad=True))
    drawn = torch.rand(2)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(2))
    assert torch.equal(out.as_subclass(torch.Tensor), X)


@pytest.mark.parametrize("fn", [lambda x: F.dropout(x, 0.0), lambda x: F.dropout(x, 0.5, training=False),
                                lambda x: torch.dropout(x, 0.0, train=True), lambda x: F.alpha_dropout(x, 0.0, True),
                                lambda x: F.dropout2d(x, 0.3, training=False)])
def test_p_zero_and_eval_are_the_identity_with_no_mask(fn):
    x = tt.tracer(X4.double(), requires_grad=True)
    code = tt.compile(lambda t: fn(t).sum(), (x,)).code
    calls = [line for line in code.splitlines() if " = " in line and not line.strip().startswith("#")]
    assert not any("like(" in line or "dropout" in line for line in calls), calls  # no mask is made
    y = fn(x)
    assert torch.equal(y.as_subclass(torch.Tensor), X4.double())
    (grad,) = tt.grad((y * y).sum(), [x], create_graph=True)
    assert torch.equal(grad.as_subclass(torch.Tensor), 2 * X4.double())
    (second,) = tt.grad(grad.sum(), [x])
    assert torch.equal(second.as_subclass(torch.Tensor), torch.full_like(X4.double(), 2.0))


def test_inplace_flag_changes_a_non_leaf_as_torch_does():
    leaf, expected_leaf = tt.tracer(X3, requires_grad=True), X3.clone().requires_grad_(True)
    x, expected = leaf * 1.5, expected_leaf * 1.5
    torch.manual_seed(3)
    Dropout(0.25, inplace=True)(x)
    torch.manual_seed(3)
    torch.nn.Dropout(0.25, inplace=True)(expected)
    assert torch.equal(x.as_subclass(torch.Tensor), expected.detach())
    (x * x).sum().backward()
    (expected * expected).sum().backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)


def test_inplace_flag_on_a_leaf_that_requires_grad_raises():
    with pytest.raises(RuntimeError, match="a leaf tracer that requires grad is used in an in-place operation"):
        F.dropout(tt.tracer(X, requires_grad=True), 0.5, inplace=True)


@pytest.mark.parametrize("fn, error, message", [
    (lambda x: F.dropout(x, 1.5), ValueError, "dropout probability has to be between 0 and 1, but got 1.5"),
    (lambda x: F.dropout2d(x, -0.1), ValueError, "dropout probability has to be between 0 and 1"),
    (lambda x: F.dropout1d(x, 0.5), RuntimeError, "dropout1d: Expected 2D or 3D input"),
    (lambda x: F.dropout(x * 1, 1.5, inplace=True), ValueError, "dropout probability has to be between 0 and 1"),
    (lambda x: torch.dropout_(x * 1, 1.5, True), RuntimeError, "dropout probability has to be between 0 and 1"),
])
def test_torchs_argument_errors(fn, error, message):
    with pytest.raises(error, match=message):
        fn(X4.clone().requires_grad_())  # torch's own error, which torchtrace must raise too
    with pytest.raises(error, match=message):
        fn(tt.tracer(X4, requires_grad=True))


def test_double_backward():
    double_backward_matches(seeded(lambda x: torch.tanh(F.dropout(x * x, 0.4))), X.double())


# --- alpha dropout (F.alpha_dropout, F.feature_alpha_dropout, torch.alpha_dropout, torch.feature_alpha_dropout)

ALPHA_CALLS = [
    lambda x: F.alpha_dropout(x, 0.3, True),
    lambda x: F.alpha_dropout(x, p=0.5, training=True),
    lambda x: F.alpha_dropout(x),  # training=False by default: identity
    lambda x: F.alpha_dropout(x, 0.0, True),
    lambda x: F.alpha_dropout(x, 1.0, True),  # everything dropped: the gradient is 0
    lambda x: F.feature_alpha_dropout(x, 0.5, True),
    lambda x: F.feature_alpha_dropout(x, 0.5, False),
    lambda x: torch.alpha_dropout(x, 0.4, True),
    lambda x: torch.alpha_dropout(x, 0.4, train=False),
    lambda x: torch.feature_alpha_dropout(x, 0.4, True),
]


@pytest.mark.parametrize("fn", ALPHA_CALLS)
@pytest.mark.parametrize("x", [X3, X4.double(), non_contiguous(X3[0])])
def test_alpha_dropout_functions(fn, x):
    check_op(seeded(fn), x)


@pytest.mark.parametrize("seed", [0, 1, 123])
@pytest.mark.parametrize("fn, x", [
    (lambda x: F.alpha_dropout(x, 0.3, True), torch.randn(50)),
    (lambda x: F.alpha_dropout(x, 0.5, True), torch.randn(6, 7).double().t()),
    (lambda x: F.feature_alpha_dropout(x, 0.4, True), torch.randn(4, 5, 2, 2)),
    (lambda x: F.alpha_dropout(x, 1.0, True), torch.randn(5)),
])
def test_alpha_dropout_same_values_as_torch_under_the_same_seed(fn, x, seed):
    torch.manual_seed(seed)
    ours = fn(tt.tracer(x, requires_grad=True))
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    theirs = fn(x)
    after_theirs = torch.rand(3)
    assert torch.equal(ours.as_subclass(torch.Tensor), theirs)  # bit for bit: the same mask and affine map
    assert torch.equal(after_ours, after_theirs)


def test_alpha_dropout_gradient_is_a_times_the_mask():
    p = 0.2
    x = tt.tracer(torch.randn(2000, dtype=torch.float64), requires_grad=True)
    F.alpha_dropout(x, p, True).sum().backward()
    a = (1.7580993408473766 ** 2 * p + 1) ** -0.5 * (1 - p) ** -0.5
    values = x.grad.unique()
    assert len(values) == 2 and values[0] == 0 and values[1] == pytest.approx(a)
    assert 0.75 < (x.grad != 0).double().mean().item() < 0.85


@pytest.mark.parametrize("ours, theirs, x", [
    (lambda: AlphaDropout(0.3), lambda: torch.nn.AlphaDropout(0.3), X3),
    (lambda: FeatureAlphaDropout(0.5), lambda: torch.nn.FeatureAlphaDropout(0.5), X4),
])
def test_alpha_dropout_modules_match_torch_in_train_and_eval(ours, theirs, x):
    test_modules_match_torch_in_train_and_eval(ours, theirs, x)


def test_alpha_dropout_double_backward():
    double_backward_matches(seeded(lambda x: torch.tanh(F.alpha_dropout(x * x, 0.4, True))), X.double())
