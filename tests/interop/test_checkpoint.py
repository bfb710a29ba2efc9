"""torch.utils.checkpoint on tracers recomputes in backward and gives torch's gradients (both flavours)."""
import pytest
import torch
import torch.utils.checkpoint as ckpt

import torchtrace as tt


class Block(torch.nn.Module):
    def __init__(self, width: int = 6):
        super().__init__()
        self.lin, self.norm = torch.nn.Linear(width, width), torch.nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.lin(x)))


class Net(torch.nn.Module):
    def __init__(self, reentrant=None, sequential=False):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block(), Block())
        self.head = torch.nn.Linear(6, 1)
        self.reentrant, self.sequential = reentrant, sequential

    def forward(self, x):
        if self.reentrant is None:
            h = self.blocks(x)
        elif self.sequential:
            h = ckpt.checkpoint_sequential(self.blocks, 2, x, use_reentrant=self.reentrant)
        else:
            h = x
            for block in self.blocks:
                h = ckpt.checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


def grads_both_ways(reentrant, sequential=False):
    torch.manual_seed(0)
    theirs = Net(reentrant, sequential).double()
    ours = Net(reentrant, sequential).double()
    ours.load_state_dict(theirs.state_dict())
    ours = tt.port(ours)
    x = torch.randn(5, 6, dtype=torch.float64)
    xt = tt.tracer(x, requires_grad=True)
    xp = x.clone().requires_grad_()
    ours(xt).pow(2).sum().backward()
    theirs(xp).pow(2).sum().backward()
    return ours, theirs, xt, xp


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("sequential", [False, True])
def test_block_with_parameters_matches_torch(reentrant, sequential):
    ours, theirs, xt, xp = grads_both_ways(reentrant, sequential)
    torch.testing.assert_close(xt.grad, xp.grad)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.as_subclass(torch.Tensor), q.grad, msg=name)


def graph_nodes(t):
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return seen


@pytest.mark.parametrize("reentrant", [True, False])
def test_the_block_graph_is_not_kept(reentrant):
    torch.manual_seed(0)
    net = tt.port(Net(reentrant).double())
    x = tt.tracer(torch.randn(2, 6, dtype=torch.float64))
    kept = sorted(n.name for n in graph_nodes(net(x)) if n.name != "AccumulateGrad")
    assert kept == ["CheckpointBackward"] * 3 + ["LinearFunctionBackward"]  # the blocks' own nodes are gone


def test_small_mlp_function_and_tt_grad():
    torch.manual_seed(1)
    w1, w2 = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    x = torch.randn(5, 4, dtype=torch.float64)

    def mlp(h, a, b):
        return torch.relu(h @ a) @ b

    for reentrant in (True, False):
        ta, tb, tx = (tt.tracer(t, requires_grad=True) for t in (w1, w2, x))
        ours = tt.grad(ckpt.checkpoint(mlp, tx, ta, tb, use_reentrant=reentrant).sin().sum(), [tx, ta, tb])
        pa, pb, px = (t.clone().requires_grad_() for t in (w1, w2, x))
        theirs = torch.autograd.grad(mlp(px, pa, pb).sin().sum(), [px, pa, pb])
        for o, t in zip(ours, theirs):
            torch.testing.assert_close(o.as_subclass(torch.Tensor), t)


def test_dropout_is_recomputed_with_the_same_mask():
    w = tt.tracer(torch.randn(6, 6, dtype=torch.float64), requires_grad=True)
    x = tt.tracer(torch.randn(4, 6, dtype=torch.float64))

    def block(h):
        return torch.nn.functional.dropout(h @ w, 0.5, training=True)

    torch.manual_seed(3)
    ckpt.checkpoint(block, x, use_reentrant=True).sum().backward()
    ours = w.grad.clone()
    w.grad = None
    torch.manual_seed(3)
    block(x).sum().backward()
    torch.testing.assert_close(ours, w.grad)


def test_closure_over_a_non_leaf_tracer_is_still_correct():
    a = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    h = a.exp()
    out = ckpt.checkpoint(lambda x: (x * h).sum(), a * 2, use_reentrant=False)
    out.backward()
    pa = a.detach().as_subclass(torch.Tensor).clone().requires_grad_()
    ph = pa.exp()
    (pa * 2 * ph).sum().backward()
    torch.testing.assert_close(a.grad.as_subclass(torch.Tensor), pa.grad)


def test_plain_tensors_use_torch_checkpoint():
    x = torch.randn(3, requires_grad=True)
    y = ckpt.checkpoint(torch.sin, x, use_reentrant=False)
    assert type(y) is torch.Tensor and y.grad_fn is not None


def test_double_backward_through_a_checkpoint():
    x0 = torch.randn(4, dtype=torch.float64)
    w0 = torch.randn(4, dtype=torch.float64)

    def block(h, w):
        return torch.sin(h * w).exp()

    x, w = tt.tracer(x0, requires_grad=True), tt.tracer(w0, requires_grad=True)
    gx, gw = tt.grad(ckpt.checkpoint(block, x, w, use_reentrant=True).sum(), [x, w], create_graph=True)
    ours = tt.grad((gx * gw).sum(), [x, w])
    px, pw = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    tx, tw = torch.autograd.grad(block(px, pw).sum(), [px, pw], create_graph=True)
    theirs = torch.autograd.grad((tx * tw).sum(), [px, pw])
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o.as_subclass(torch.Tensor), t)


def test_hf_style_call_with_none_arguments_and_tuple_output():
    """transformers calls checkpoint(layer.__call__, hidden, mask, None, False, use_reentrant=...) -> a tuple."""
    lin = torch.nn.Linear(3, 3).double()
    ours_lin = tt.port(torch.nn.Linear(3, 3).double())
    ours_lin.load_state_dict(lin.state_dict())

    def layer(module):
        def call(hidden, mask, cache, use_cache):
            assert cache is None and use_cache is False
            return (torch.tanh(module(hidden)) * mask, None)
        return call

    x0, mask = torch.randn(2, 3, dtype=torch.float64), torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    for reentrant in (True, False):
        ours_lin.zero_grad()
        out, none = ckpt.checkpoint(layer(ours_lin), tt.tracer(x0), mask, None, False, use_reentrant=reentrant)
        assert none is None
        out.sum().backward()
        lin.zero_grad()
        layer(lin)(x0, mask, None, False)[0].sum().backward()
        for p, q in zip(ours_lin.parameters(), lin.parameters()):
            torch.testing.assert_close(p.grad.as_subclass(torch.Tensor), q.grad)


def test_double_backward_with_a_parameter_used_before_the_block_is_refused():
    w = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    x = tt.tracer(torch.randn(3, dtype=torch.float64))
    out = ckpt.checkpoint(lambda h: (h * w).sin(), x * w, use_reentrant=False)
    with pytest.raises(tt.UnsupportedOperationError, match="^torch.utils.checkpoint: create_graph=True through"):
        tt.grad(out.sum(), w, create_graph=True)
    (g,) = tt.grad(ckpt.checkpoint(lambda h: (h * w).sin(), x * w, use_reentrant=False).sum(), w)
    pw, px = w.detach().as_subclass(torch.Tensor).clone().requires_grad_(), x.as_subclass(torch.Tensor)
    torch.testing.assert_close(g.as_subclass(torch.Tensor), torch.autograd.grad(((px * pw) * pw).sin().sum(), pw)[0])


@pytest.mark.parametrize("reentrant", [True, False])
def test_torchs_own_checkpoint_imported_before_torchtrace_is_still_correct(reentrant):
    """`from torch.utils.checkpoint import checkpoint` done before torchtrace loads keeps torch's function: the
    reentrant flavour still recomputes (its CheckpointFunction is diverted), the other records the block as usual."""
    original = ckpt.checkpoint.__wrapped__
    w = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    x = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    out = original(lambda h: (h * w).sin(), x * 2, use_reentrant=reentrant)
    assert (out.grad_fn.name == "CheckpointBackward") == reentrant
    out.sum().backward()
    pw, px = (t.detach().as_subclass(torch.Tensor).clone().requires_grad_() for t in (w, x))
    (px * 2 * pw).sin().sum().backward()
    torch.testing.assert_close(w.grad.as_subclass(torch.Tensor), pw.grad)
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), px.grad)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_block_checkpointed_under_autocast_is_recomputed_under_it(reentrant):
    """The forward runs under bf16 autocast, the backward outside it: the recomputation casts as the forward did
    (torch's checkpoint restores the autocast state), so the gradients are those of the function the forward computed.
    It ran in float32: w.grad = 1 + 2^-10 (x's float32 value) where torch, and the block without checkpoint, give 1
    (x's bf16 copy); in a linear-tanh-linear block the gradients were 0.077 apart on a scale of 8.7."""
    torch.manual_seed(0)
    cases = [((torch.tensor([[1 + 2 ** -10]]), torch.tensor([[1.0]])), lambda a, b: a @ b),
             ((torch.randn(4, 6), torch.randn(5, 6)), lambda a, b: torch.tanh(a @ b.t()) @ b)]
    for inputs, block in cases:
        grads = []
        for make, run in ((lambda t: tt.as_tracer(t.clone(), requires_grad=True), True),
                          (lambda t: t.clone().requires_grad_(), True),
                          (lambda t: tt.as_tracer(t.clone(), requires_grad=True), False)):
            x, w = (make(t) for t in inputs)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = x * 1
                out = ckpt.checkpoint(block, h, w, use_reentrant=reentrant) if run else block(h, w)
            (out.float() ** 2).sum().backward()
            grads.append([t.grad.as_subclass(torch.Tensor) for t in (x, w)])
        for ours, theirs, plain in zip(*grads):  # checkpointed = torch's checkpointed = unchecked, bit for bit
            assert torch.equal(ours, theirs) and torch.equal(ours, plain)
        if inputs[0].numel() == 1:
            assert grads[0][1].item() == 2.0  # w.grad = 2 (x w) x with x's bf16 copy, 1 (not 1 + 2^-9)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_block_reading_a_non_leaf_through_a_closure_draws_its_random_numbers_once(reentrant):
    """Such a block is recorded as usual (run again after the run that finds what it reads): from the random state
    the first run began with, so dropout's mask and the random stream after it are torch's."""
    def run(make):
        torch.manual_seed(0)
        x, w = make(torch.randn(3, 4, dtype=torch.float64)), make(torch.randn(4, 4, dtype=torch.float64))
        w2 = w * 2
        y = ckpt.checkpoint(lambda a: torch.nn.functional.dropout(a @ w2, 0.5, True), x, use_reentrant=reentrant)
        after = torch.rand(3)
        y.sum().backward()
        return y.detach().as_subclass(torch.Tensor), after, w.grad

    ours, theirs = run(lambda t: tt.tracer(t, requires_grad=True)), run(lambda t: t.requires_grad_(True))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_a_block_returning_a_dict_or_nested_lists_returns_them_with_the_checkpoints_results():
    def block(a):
        return {"p": a.sin(), "rest": [a.exp(), 3]}

    def run(make):
        x = make(torch.tensor([0.3, -0.2], dtype=torch.float64))
        out = ckpt.checkpoint(block, x, use_reentrant=False)
        (out["p"] * out["rest"][0]).sum().backward()
        return out["rest"][1], x.grad

    (n_ours, g_ours), (n_theirs, g_theirs) = run(lambda t: tt.tracer(t, requires_grad=True)), run(
        lambda t: t.requires_grad_(True))
    assert n_ours == n_theirs == 3
    torch.testing.assert_close(g_ours, g_theirs)


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("reentrant", [True, False])
def test_an_unported_torch_modules_parameters_get_their_gradients_through_a_checkpoint(reentrant, create_graph):
    """The block's reads were watched for leaf tracers only: a plain torch module's parameters (torch's
    requires_grad) got no gradient, silently (.grad None), and second derivatives through them were wrong."""
    torch.manual_seed(4)
    block = Block().double()  # plain torch: not ported
    x0 = torch.randn(3, 6, dtype=torch.float64)

    def gradients(x, checkpointed, grad):
        y = ckpt.checkpoint(block, x, use_reentrant=reentrant) if checkpointed else block(x)
        params = [block.lin.weight, block.norm.bias]
        first = grad((y ** 2).sum(), [x, *params], create_graph=create_graph)
        if not create_graph:
            return first
        return grad(sum((g * g).sum() for g in first), [x, *params])

    ours = gradients(tt.tracer(x0, requires_grad=True), True, tt.grad)
    theirs = gradients(x0.clone().requires_grad_(), False, torch.autograd.grad)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach().as_subclass(torch.Tensor), b)
    block.zero_grad(set_to_none=True)
    (ckpt.checkpoint(block, tt.tracer(x0, requires_grad=True), use_reentrant=reentrant) ** 2).sum().backward()
    torch.testing.assert_close(block.lin.weight.grad, theirs[1] if not create_graph else
                               torch.autograd.grad((block(x0) ** 2).sum(), block.lin.weight)[0])
