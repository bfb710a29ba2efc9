"""Every model and layer tests/test_port.py checks eagerly, compiled: gradients and buffers as torch's."""
import pytest
import torch
from test_port import LAYERS, MODELS, assert_same_grads, assert_same_state, batch, plain, twins

import torchtrace as tt


@pytest.mark.parametrize("name", MODELS)
def test_compiled_models_match_torch_gradients_and_running_stats(name):
    build, kind = MODELS[name]
    model, twin = twins(build)
    x, target, loss_fn = batch(kind)
    step = tt.compile(lambda inputs, targets: loss_fn(model(inputs), targets), (x, target),
                      check_inputs=[batch(kind, seed=2)[:2]])
    # check_inputs ran the model compiled (recording the program) and eagerly, and put BatchNorm's statistics back
    assert_same_state(model, twin)
    for p in model.parameters():
        p.grad = None
    loss = step(x, target)
    assert loss._tt_node.name == "CompiledCallBackward"  # grad_fn is its statement's node
    loss.backward()
    expected = loss_fn(twin(x), target)
    expected.backward()
    torch.testing.assert_close(plain(loss), expected.detach(), rtol=1e-10, atol=1e-12)
    assert_same_grads(model, twin, atol=1e-9)
    assert_same_state(model, twin)


def _weighted_sum(out):
    tensors = [out] if isinstance(out, torch.Tensor) else [t for o in out for t in
                                                           ([o] if isinstance(o, torch.Tensor) else o)]
    return sum((t * 1.3).sum() for t in tensors if t.is_floating_point())


@pytest.mark.parametrize("name", LAYERS)
def test_compiled_layers_match_eager_torchtrace(name):
    build, inputs = LAYERS[name]
    torch.manual_seed(0)
    model, _ = twins(build)
    args, kwargs = inputs()
    step = tt.compile(lambda *a: _weighted_sum(model(*a, **kwargs)), args)
    torch.manual_seed(1)
    step(*args)  # records the program; the call below replays it
    params = list(model.parameters())
    for fn in (step, lambda *a: _weighted_sum(model(*a, **kwargs))):
        for p in params:
            p.grad = None
        torch.manual_seed(1)
        fn(*args).backward()
        if fn is step:
            got = [p.grad.clone() for p in params]
    for g, p in zip(got, params):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
