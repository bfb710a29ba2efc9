"""The same models and layers as tests/test_port.py, on a CUDA device: torchtrace's gradients on CUDA tracers equal
torch autograd's on CUDA tensors (float64), twenty Adam steps track torch.optim, and tt.compile's replay equals
eager. Skipped where torch sees no CUDA device (CI has none): `python -m torchtrace ops --coverage --device cuda`
runs PyTorch's OpInfo samples there, and bench/*.py --device cuda times it.

TORCHTRACE_TEST_DEVICE=cpu runs this file on the CPU (to check the file itself on a machine without a GPU).
"""
import os

import pytest
import torch
import torch.nn as nn
from test_port import LAYERS, MODELS, batch, check_adam_steps, check_layer, check_model, plain, twins

import torchtrace as tt

DEVICE = os.environ.get("TORCHTRACE_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("name", MODELS)
def test_model_forward_and_gradients_match_torch_on_the_device(name):
    check_model(name, DEVICE)


@pytest.mark.parametrize("name", ["mlp", "lenet", "gpt"])
def test_twenty_adam_steps_track_torch_on_the_device(name):
    """On CUDA both optimizers take torch's multi-tensor (foreach) path by default."""
    check_adam_steps(name, DEVICE, atol=1e-7)


# torch's multi-layer RNNs on CUDA run cuDNN, which draws the dropout between layers from its own generator state;
# torchtrace runs the layers as torch calls and draws that mask with F.dropout (same distribution, other draws).
CUDNN_DRAWS = {"bidirectional-GRU-dropout"}


@pytest.mark.parametrize("name", LAYERS)
def test_common_layers_differentiate_like_torch_on_the_device(name):
    if DEVICE == "cuda" and name in CUDNN_DRAWS:
        pytest.skip("cuDNN draws this dropout mask from its own generator state")
    check_layer(name, DEVICE)


@pytest.mark.parametrize("name", ["mlp", "lenet", "gpt"])
def test_compiled_training_equals_eager_on_the_device(name):
    """Five SGD steps through tt.compile (recorded once, then replayed) against the same steps run eagerly."""
    build, kind = MODELS[name]
    compiled_model, _ = twins(build, device=DEVICE)
    eager_model, _ = twins(build, device=DEVICE)

    def loss_of(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(model(x), target)

    x, target, loss_fn = batch(kind, device=DEVICE)
    compiled_loss = tt.compile(loss_of, (compiled_model, x, target))
    for step in range(5):
        x, target, loss_fn = batch(kind, seed=step, device=DEVICE)
        for model, run in ((compiled_model, compiled_loss), (eager_model, loss_of)):
            model.zero_grad()
            run(model, x, target).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
    assert compiled_loss.replayed == 4 and len(compiled_loss.program.paths()) == 1
    for (name_c, p_c), (name_e, p_e) in zip(compiled_model.named_parameters(), eager_model.named_parameters()):
        assert name_c == name_e
        torch.testing.assert_close(plain(p_c), plain(p_e), rtol=0, atol=0, msg=name_c)


DROPOUTS = {
    "F.dropout": lambda x: torch.nn.functional.dropout(x, 0.4, True),
    "F.dropout(inplace=True)": lambda x: torch.nn.functional.dropout(x, 0.4, True, inplace=True),
    "torch.dropout_": lambda x: torch.dropout_(x, 0.4, True),
    "F.dropout2d(inplace=True)": lambda x: torch.nn.functional.dropout2d(x, 0.4, True, inplace=True),
}


@pytest.mark.parametrize("form", DROPOUTS)
def test_dropout_draws_torchs_mask_on_the_device(form):
    """On CUDA torch draws out-of-place dropout with a fused kernel and in-place dropout with bernoulli_: each form
    drops exactly the elements torch's same form drops after the same seed, and the gradient is that mask's."""
    x = torch.rand(4, 6, 5, 5, dtype=torch.float64, device=DEVICE) + 0.5
    results = []
    for leaf in (x.clone().requires_grad_(), tt.as_tracer(x.clone(), requires_grad=True)):
        torch.manual_seed(11)
        y = DROPOUTS[form](leaf * 1.0)
        (y * x).sum().backward()
        results.append((plain(y.detach()), plain(leaf.grad)))
    (y_torch, g_torch), (y_ours, g_ours) = results
    assert torch.equal(y_ours, y_torch) and torch.equal(g_ours, g_torch)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4), (2, 3, 5)])
@pytest.mark.parametrize("pivot", [True, False])
def test_lu_gradients_with_and_without_pivoting(shape, pivot):
    """torch.linalg.lu(A, pivot=False) exists on CUDA only (P is then empty and A = L U); elsewhere torchtrace
    refuses it with torch's own error."""
    if not pivot and DEVICE != "cuda":
        for leaf in (torch.eye(3).requires_grad_(), tt.as_tracer(torch.eye(3), requires_grad=True)):
            with pytest.raises(RuntimeError, match="LU without pivoting is not implemented"):
                torch.linalg.lu(leaf, pivot=False)
        return
    a = torch.randn(shape, dtype=torch.float64, device=DEVICE, generator=None) + 3 * torch.eye(
        *shape[-2:], dtype=torch.float64, device=DEVICE)
    weights = [torch.randn(t.shape, dtype=torch.float64, device=DEVICE) for t in torch.linalg.lu(a, pivot=pivot)[1:]]
    grads = []
    for leaf in (a.clone().requires_grad_(), tt.as_tracer(a.clone(), requires_grad=True)):
        _, lower, upper = torch.linalg.lu(leaf, pivot=pivot)
        ((lower * weights[0]).sum() + (upper * weights[1]).sum()).backward()
        grads.append(plain(leaf.grad))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-10)
