"""F.scaled_dot_product_attention's rule and MultiheadAttention: against torch autograd, finite differences
(float64) and torch.nn.MultiheadAttention with identical weights."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from torch.func import functional_call

import torchtrace as tt
from torchtrace.nn.attention import AttentionWeights, MultiheadAttention

torch.manual_seed(0)
sdpa = F.scaled_dot_product_attention
Q, K, V = torch.randn(2, 3, 2), torch.randn(2, 4, 2), torch.randn(2, 4, 3)  # 3 queries, 4 keys
QH, KH, VH = torch.randn(1, 2, 3, 2), torch.randn(1, 2, 4, 2), torch.randn(1, 2, 4, 3)  # with a heads dim
ALLOWED = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
NONE_IN_ROW_1 = ALLOWED & torch.tensor([[True], [False], [True]])  # query 1 attends to nothing
BIAS = torch.randn(3, 4)


@pytest.mark.parametrize("fn, inputs", [
    (lambda q, k, v: sdpa(q, k, v), (Q, K, V)),
    (lambda q, k, v: sdpa(q, k, v), (QH, KH, VH)),
    (lambda q, k, v: sdpa(q, k, v), (torch.randn(3, 2), torch.randn(4, 2), torch.randn(4, 2))),  # no batch
    (lambda q, k, v: sdpa(q, k, v), (Q, K[:1], V[:1])),  # keys and values broadcast over the batch
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), (Q, K[:, :3], V[:, :3])),
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), (Q, K, V)),  # more keys than queries
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), (torch.randn(2, 4, 2), Q, torch.randn(2, 3, 2))),  # fewer
    (lambda q, k, v: sdpa(q, k, v, ALLOWED), (Q, K, V)),
    (lambda q, k, v: sdpa(q, k, v, attn_mask=ALLOWED.expand(2, 3, 4)), (QH, KH, VH)),
    (lambda q, k, v: sdpa(q, k, v, NONE_IN_ROW_1), (Q, K, V)),  # a fully masked row gives 0 (and no gradient)
    (lambda q, k, v, m: sdpa(q, k, v, m), (Q, K, V, BIAS)),  # the float mask gets a gradient (summed over batch)
    (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), (QH, KH, VH, torch.randn(1, 1, 3, 4))),
    (lambda q, k, v, m: sdpa(q, k, v, m), (Q, K, V, torch.randn(4))),  # a mask broadcast over the queries
    (lambda q, k, v, m: sdpa(q, k, v, m + torch.where(ALLOWED, 0.0, -math.inf)), (Q, K, V, BIAS)),
    (lambda q, k, v: sdpa(q, k, v, scale=0.3), (Q, K, V)),
    (lambda q, k, v, m: sdpa(q, k, v, m, 0.0, False, scale=2.0), (Q, K, V, BIAS)),
    (lambda q, k, v: sdpa(query=q, key=k, value=v, attn_mask=ALLOWED, is_causal=False), (Q, K, V)),
    (lambda q, k, v: sdpa(q, k, v, enable_gqa=True), (torch.randn(1, 4, 3, 2), KH, VH)),  # 2 query heads per kv head
    (lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True), (torch.randn(1, 4, 3, 2), KH, VH)),
    (lambda q, k, v: sdpa(q, k, v), (non_contiguous(Q), non_contiguous(K), non_contiguous(V))),
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), (Q.double(), K.double(), V.double())),
    (lambda x, v: sdpa(x, x, v), (K, V)),  # one tensor as query and key
    (lambda q, k, v: sdpa(q, k, v) * 2 + sdpa(q, k, v).sum(-1, keepdim=True), (Q, K, V)),  # fan-out
])
def test_scaled_dot_product_attention(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda q, k: AttentionWeights.apply(q, k), (Q, K)),
    (lambda q, k: AttentionWeights.apply(q, k, ALLOWED, False, 0.5), (Q, K)),
    (lambda q, k: AttentionWeights.apply(q, k, None, True), (Q, K)),
    (lambda q, k, m: AttentionWeights.apply(q, k, m), (QH, KH, torch.randn(3, 4))),
])
def test_attention_weights(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), (Q, K, V)),
    (lambda q, k, v, m: sdpa(q, k, v, m), (Q, K, V, BIAS)),
    (lambda q, k, v: sdpa(q, k, v, NONE_IN_ROW_1, scale=0.7), (Q, K, V)),
    (lambda q, k, v: sdpa(q, k, v, enable_gqa=True), (torch.randn(1, 4, 3, 2), KH, VH)),
])
def test_scaled_dot_product_attention_double_backward(fn, inputs):
    double_backward_matches(fn, *inputs)


def _dropped_attention(q, k, v, p, mask=None, is_causal=False, scale=None):
    """sdpa with dropout written out, drawing its mask as the rule does: F.dropout of ones of the weights' shape."""
    weights = AttentionWeights.apply(q, k, mask, is_causal, scale) if isinstance(q, tt.tracer) else None
    scores = q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.size(-1)))
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, -1) if weights is None else weights
    return (weights * torch.nn.functional.dropout(torch.ones_like(weights.detach()), p, True)) @ v


@pytest.mark.parametrize("options, message", [
    ({"dropout_p": 0.5, "is_causal": True, "attn_mask": torch.ones(3, 3, dtype=torch.bool)},
     "Explicit attn_mask should not be set when is_causal=True"),
    ({"dropout_p": 1.5}, "dropout probability has to be between 0 and 1, but got 1.5"),
])
def test_sdpa_dropout_refuses_what_torch_refuses(options, message):
    for q in (Q.double(), tt.tracer(Q.double(), requires_grad=True)):
        with pytest.raises(RuntimeError, match=message):
            sdpa(q, q, q, **options)


@pytest.mark.parametrize("p", [0.4, 1.0])
def test_sdpa_dropout_draws_what_torchs_own_kernel_draws(p):
    """On the CPU torch's math kernel runs dropout on the weights: after the same seed torchtrace drops the same
    weights and leaves the generator where torch leaves it (p = 1 draws nothing)."""
    results = []
    for make in (lambda x: x, lambda x: tt.tracer(x, requires_grad=True)):
        torch.manual_seed(3)
        out = sdpa(make(Q.double()), make(K.double()), make(V.double()), dropout_p=p)
        results.append((out.detach().as_subclass(torch.Tensor), torch.rand(4)))
    (theirs, after_theirs), (ours, after_ours) = results
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)  # the same weights dropped (else O(1) apart)
    assert torch.equal(after_ours, after_theirs)


@pytest.mark.parametrize("p, options, inputs", [
    (0.3, {}, (Q, K, V)),
    (0.5, {"scale": 0.7}, (Q.double(), K.double(), V.double())),
    (0.2, {"mask": BIAS}, (Q, K, V)),
    (1.0, {}, (Q, K, V)),  # everything dropped: zero output, zero gradients
])
def test_sdpa_dropout_uses_one_mask_for_forward_and_backward(p, options, inputs):
    """The rule's mask is drawn from torch's RNG; the same draw spelled out under torch autograd gives the same
    output and gradients (forward and backward use the same mask)."""
    mask = options.get("mask")
    ours = [tt.tracer(x, requires_grad=True) for x in inputs]
    torch.manual_seed(9)
    out = sdpa(*ours, mask, dropout_p=p, scale=options.get("scale"))
    g = torch.randn(out.shape, dtype=out.dtype)
    out.backward(g)
    theirs = [x.clone().requires_grad_(True) for x in inputs]
    torch.manual_seed(9)
    expected = _dropped_attention(*theirs, p, mask, scale=options.get("scale"))
    expected.backward(g)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), expected.detach())
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)


def test_sdpa_dropout_is_random_and_recorded():
    q = tt.tracer(Q, requires_grad=True)
    first, second = sdpa(q, K, V, dropout_p=0.5), sdpa(q, K, V, dropout_p=0.5)
    assert first.grad_fn.name == "ScaledDotProductAttentionBackward"
    assert not torch.equal(first.as_subclass(torch.Tensor), second.as_subclass(torch.Tensor))
    out = sdpa(tt.tracer(Q), K, V, dropout_p=0.1)  # nothing to differentiate: torch's own kernel runs
    assert isinstance(out, tt.tracer) and out.shape == (2, 3, 3) and out.grad_fn is None


def test_sdpa_dropout_gqa_and_causal_double_backward():
    torch.manual_seed(2)
    assert tt.gradcheck(lambda q, k, v: sdpa(q, k, v, dropout_p=0.0, is_causal=True, enable_gqa=True),
                        torch.randn(1, 4, 3, 2).double(), KH.double(), VH.double())
    q = tt.tracer(torch.randn(1, 4, 3, 2), requires_grad=True)
    out = sdpa(q, KH, VH, dropout_p=0.4, is_causal=True, enable_gqa=True)
    (grad,) = tt.grad(out.sum(), [q], create_graph=True)
    tt.grad((grad * grad).sum(), [q])  # a second derivative through the same saved mask


def test_sdpa_node_and_plain_tensors():
    q = tt.tracer(Q, requires_grad=True)
    assert sdpa(q, K, V).grad_fn.name == "ScaledDotProductAttentionBackward"
    torch.testing.assert_close(AttentionWeights.apply(Q, K, ALLOWED), torch.softmax(
        (Q @ K.transpose(-2, -1) / math.sqrt(2)).masked_fill(~ALLOWED, -math.inf), -1))


def twins(**options):
    """Our MultiheadAttention and torch's, built after the same seed: they must hold equal weights."""
    torch.manual_seed(11)
    ours = MultiheadAttention(**options)
    torch.manual_seed(11)
    theirs = torch.nn.MultiheadAttention(**options)
    return ours, theirs


def check_against_torch(options: dict, call, *inputs, train: bool = False) -> tt.check:
    """tt.check of call(module, *inputs): our layer on tracers, torch's on tensors, with the same parameters."""
    ours, theirs = twins(**options)
    ours.train(train), theirs.train(train)

    def fn(params, *xs):
        module = ours if isinstance(xs[0], tt.tracer) else theirs
        torch.manual_seed(5)  # the same dropout draws for both
        return call(lambda *args, **kwargs: functional_call(module, params, args, kwargs), *xs)

    return tt.check(fn, dict(ours.named_parameters()), *inputs, atol=1e-5)


X, Y = torch.randn(5, 3, 8), torch.randn(4, 3, 8)  # (L, N, E): 5 queries, 4 keys, batch 3, embed 8
KPM = torch.tensor([[False, False, True, True], [False] * 4, [False, True, False, True]])
BOOL_2D = torch.tensor([[False, True, False, False]] * 5)
CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(5)
E8 = dict(embed_dim=8, num_heads=2)


@pytest.mark.parametrize("options, call, inputs", [
    (E8, lambda m, x: m(x, x, x), (X,)),  # self-attention, averaged weights
    (E8, lambda m, x: m(x, x, x, need_weights=False), (X,)),
    (E8, lambda m, x, y: m(x, y, y, average_attn_weights=False), (X, Y)),
    (E8, lambda m, x, y, z: m(x, y, z, need_weights=False), (X, Y, torch.randn(4, 3, 8))),
    ({**E8, "batch_first": True}, lambda m, x: m(x, x, x), (X.transpose(0, 1),)),
    ({**E8, "batch_first": True}, lambda m, x, y: m(x, y, y, need_weights=False),
     (X.transpose(0, 1), Y.transpose(0, 1))),
    (E8, lambda m, x, y: m(x, y, y, key_padding_mask=KPM), (X, Y)),
    (E8, lambda m, x, y: m(x, y, y, key_padding_mask=KPM, need_weights=False), (X, Y)),
    (E8, lambda m, x, y: m(x, y, y, key_padding_mask=torch.randn(3, 4)), (X, Y)),
    (E8, lambda m, x, y: m(x, y, y, attn_mask=BOOL_2D), (X, Y)),
    (E8, lambda m, x, y: m(x, y, y, attn_mask=torch.randn(6, 5, 4), need_weights=False), (X, Y)),
    (E8, lambda m, x, y: m(x, y, y, attn_mask=BOOL_2D, key_padding_mask=KPM, need_weights=False), (X, Y)),
    (E8, lambda m, x: m(x, x, x, attn_mask=CAUSAL, is_causal=True), (X,)),
    (E8, lambda m, x: m(x, x, x, attn_mask=CAUSAL, is_causal=True, need_weights=False), (X,)),
    (E8, lambda m, x, y: m(x, y, y, key_padding_mask=KPM[1]), (X[:, 0], Y[:, 0])),  # unbatched
    ({**E8, "batch_first": True}, lambda m, x: m(x, x, x, need_weights=False), (X[:, 0],)),
    ({**E8, "bias": False}, lambda m, x, y: m(x, y, y), (X, Y)),
    ({**E8, "kdim": 3, "vdim": 6}, lambda m, x, k, v: m(x, k, v, key_padding_mask=KPM),
     (X, torch.randn(4, 3, 3), torch.randn(4, 3, 6))),
    ({**E8, "add_bias_kv": True}, lambda m, x, y: m(x, y, y, attn_mask=BOOL_2D, key_padding_mask=KPM), (X, Y)),
    ({**E8, "add_zero_attn": True}, lambda m, x, y: m(x, y, y, key_padding_mask=KPM, need_weights=False), (X, Y)),
    ({**E8, "add_bias_kv": True, "add_zero_attn": True}, lambda m, x, y: m(x, y, y, attn_mask=BOOL_2D), (X, Y)),
    (dict(embed_dim=6, num_heads=3), lambda m, x: m(x, x, x), (torch.randn(2, 4, 6).double(),)),
    (dict(embed_dim=8, num_heads=1), lambda m, x, y: m(x, y, y), (X, Y)),
    (E8, lambda m, x, mask: m(x, x, x, attn_mask=mask), (X, torch.randn(5, 5))),  # a float mask with a gradient
])
def test_multihead_attention_equals_torch(options, call, inputs):
    if inputs[0].dtype == torch.float64:
        options = {**options, "dtype": torch.float64}
    assert check_against_torch(options, call, *inputs).ok


@pytest.mark.parametrize("options, call, inputs", [
    ({**E8, "dropout": 0.4}, lambda m, x, y: m(x, y, y), (X, Y)),
    ({**E8, "dropout": 0.4, "batch_first": True}, lambda m, x, y: m(x, y, y, key_padding_mask=KPM, need_weights=False),
     (X.transpose(0, 1), Y.transpose(0, 1))),
])
def test_multihead_attention_dropout(options, call, inputs):
    assert check_against_torch(options, call, *inputs, train=True).ok  # dropped weights: torch's draws
    assert check_against_torch(options, call, *inputs, train=False).ok  # eval: no dropout


def test_multihead_attention_gradcheck_float64():
    layer = MultiheadAttention(4, 2, add_bias_kv=True, dtype=torch.float64)
    params = dict(layer.named_parameters())
    check_op(lambda p, x, y: functional_call(layer, p, (x, y, y), {"key_padding_mask": KPM[:2, :3]}), params,
             torch.randn(2, 2, 4, dtype=torch.float64), torch.randn(3, 2, 4, dtype=torch.float64))


def test_multihead_attention_double_backward():
    layer = MultiheadAttention(4, 2, dtype=torch.float64)
    names = [name for name, _ in layer.named_parameters()]
    params = [p.as_subclass(torch.Tensor).detach() for p in layer.parameters()]
    double_backward_matches(lambda x, *ps: functional_call(layer, dict(zip(names, ps)), (x, x, x),
                                                           {"need_weights": False})[0],
                            torch.randn(3, 2, 4, dtype=torch.float64), *params)


def test_multihead_attention_module_backward_equals_torch():
    ours, theirs = twins(embed_dim=8, num_heads=2, batch_first=True)
    x = torch.randn(3, 5, 8)
    out, weights = ours(tt.tracer(x), tt.tracer(x), tt.tracer(x))
    twin_out, twin_weights = theirs(x, x, x)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), twin_out.detach())
    torch.testing.assert_close(weights.as_subclass(torch.Tensor), twin_weights.detach())
    (out.pow(2).sum() + weights.pow(2).sum()).backward()
    (twin_out.pow(2).sum() + twin_weights.pow(2).sum()).backward()
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("options", [E8, {**E8, "bias": False}, {**E8, "kdim": 3, "vdim": 5},
                                     {**E8, "add_bias_kv": True}])
def test_multihead_attention_same_seed_and_state_dict_both_ways(options):
    ours, theirs = twins(**options)
    names = [name for name, _ in theirs.named_parameters()]
    assert [name for name, _ in ours.named_parameters()] == names
    assert all(isinstance(p, tt.nn.Parameter) for p in ours.parameters())
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(p.as_subclass(torch.Tensor), q.detach()), name
    state = ours.state_dict()
    assert all(type(value) is torch.Tensor for value in state.values())
    fresh = torch.nn.MultiheadAttention(**options)
    fresh.load_state_dict(state)
    mine = MultiheadAttention(**options)
    mine.load_state_dict(theirs.state_dict())
    for p, q in zip(mine.parameters(), fresh.parameters()):
        assert torch.equal(p.as_subclass(torch.Tensor), q.detach())


def test_multihead_attention_errors():
    layer = MultiheadAttention(8, 2)
    x = tt.tracer(X, requires_grad=True)
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        layer(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="The shape of the 2D attn_mask is"):
        layer(x, x, x, attn_mask=torch.zeros(4, 4))
    with pytest.raises(RuntimeError, match="attn_mask's dimension 4 is not supported"):
        layer(x, x, x, attn_mask=torch.zeros(1, 6, 5, 5))
    with pytest.raises(AssertionError, match="only bool and floating types of key_padding_mask"):
        layer(x, x, x, key_padding_mask=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(AssertionError, match="Expected key_padded_mask.shape.1. to be 5, but got 4"):
        layer(x, x, x, key_padding_mask=KPM)
    with pytest.raises(AssertionError, match="was expecting embedding dimension of 8"):
        layer(tt.randn(5, 3, 6), tt.randn(5, 3, 6), tt.randn(5, 3, 6))
    with pytest.raises(AssertionError, match="2-D .unbatched. or 3-D"):
        layer(x, x[0], x[0])


def test_multihead_attention_refuses_what_torch_refuses_with_its_message():
    """Each case raises in torch too (checked here): key and value of different shapes; a float mask of another dtype
    than the query where the weights are computed (need_weights=False promotes it, in both)."""
    key = X.double()
    torch_layer, ours = torch.nn.MultiheadAttention(8, 2).double(), MultiheadAttention(8, 2).double()
    for call, error, message in [
            (lambda m, q: m(q, key[:, :1], key), AssertionError, "key shape .* does not match value shape"),
            (lambda m, q: m(q, key[:4], key), AssertionError, "key shape .* does not match value shape"),
            (lambda m, q: m(q, key, key, attn_mask=torch.zeros(5, 5)), RuntimeError, "query's dtype"),
            (lambda m, q: m(q, key, key, key_padding_mask=torch.zeros(3, 5)), RuntimeError, "query's dtype")]:
        with pytest.raises(error):
            call(torch_layer, key)
        with pytest.raises(error, match=message):
            call(ours, tt.tracer(key, requires_grad=True))
    separate = MultiheadAttention(8, 2, kdim=4, vdim=6).double()
    with pytest.raises(AssertionError, match="key's sequence and batch dims"):
        separate(key, key[:4, :, :4], key[..., :6])
    promoted = ours(tt.tracer(key, requires_grad=True), key, key, attn_mask=torch.zeros(5, 5), need_weights=False)
    torch_layer.load_state_dict(ours.state_dict())
    expected = torch_layer(key, key, key, attn_mask=torch.zeros(5, 5), need_weights=False)[0]
    torch.testing.assert_close(promoted[0].as_subclass(torch.Tensor).detach(), expected.detach())


@pytest.mark.parametrize("mask_kind", ["key_padding_mask", "attn_mask"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_on_a_fully_masked_query_gives_torchs_nan_or_zeros(need_weights, mask_kind):
    """torch computes MultiheadAttention's weights with softmax when they are asked for: a query whose keys are all
    masked gets NaN weights, output and gradients; without them it runs sdpa, whose fully masked rows are zeros.
    torchtrace gave zeros in both cases (finite numbers where torch's are NaN)."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(4, 2).double()
    ours = tt.port(copy.deepcopy(theirs))
    q = torch.randn(3, 2, 4, dtype=torch.float64)
    padding = torch.tensor([[True, True, True], [False, True, False]])
    options = ({"key_padding_mask": padding} if mask_kind == "key_padding_mask" else
               {"attn_mask": torch.tensor([[True] * 3, [False, True, False], [False] * 3])})
    results = []
    for model, x in ((ours, tt.tracer(q.clone(), requires_grad=True)), (theirs, q.clone().requires_grad_())):
        out, weights = model(x, x, x, need_weights=need_weights, **options)
        out.sum().backward()
        results.append([t.as_subclass(torch.Tensor).detach() for t in (out, x.grad, model.in_proj_weight.grad,
                                                                         *([weights] if need_weights else []))])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, equal_nan=True)
    assert results[1][0].isnan().any() == need_weights  # the case is the one torch answers with NaN
