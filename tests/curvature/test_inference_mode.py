"""The transforms differentiate inside torch.inference_mode, as torch.func's do (nothing would record there: every
derivative was a silent 0)."""
import torch

import torchtrace as tt

D = torch.float64


def cube_sum(a):
    return (a ** 3).sum()


def test_hvp_hessian_jvp_and_jacobian_inside_inference_mode_equal_torch_func():
    x, v = torch.tensor([1.0, 2.0, 3.0], dtype=D), torch.tensor([1.0, -1.0, 0.5], dtype=D)
    with torch.inference_mode():
        expected_hvp = torch.func.jvp(torch.func.grad(cube_sum), (x,), (v,))[1]
        expected_hessian = torch.func.hessian(cube_sum)(x)
        expected_jvp = torch.func.jvp(torch.sin, (x,), (v,))[1]
        expected_jacobian = torch.func.jacrev(torch.sin)(x)
        for method in ("forward-over-reverse", "reverse-over-reverse"):
            assert torch.allclose(tt.hvp(cube_sum, x, v, method=method), expected_hvp)
        assert torch.allclose(tt.hessian(cube_sum, x), expected_hessian)
        assert torch.allclose(tt.jvp(torch.sin, (x,), (v,))[1], expected_jvp)
        for mode in ("forward", "reverse"):
            assert torch.allclose(tt.jacobian(torch.sin, x, mode=mode), expected_jacobian)
    assert torch.allclose(expected_hvp, 6 * x * v) and torch.allclose(expected_jacobian, torch.diag(torch.cos(x)))


def test_spectrum_inside_inference_mode_equals_outside():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double())
    data = (torch.randn(8, 3, dtype=D), torch.randn(8, 1, dtype=D))

    def loss_fn(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1])

    outside = tt.spectrum(loss_fn, model, data, k=2).eigenvalues
    with torch.inference_mode():
        inside = tt.spectrum(loss_fn, model, data, k=2).eigenvalues
    assert torch.allclose(inside, outside) and bool((outside.abs() > 1e-3).all())
