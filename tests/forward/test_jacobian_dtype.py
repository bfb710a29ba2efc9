"""tt.jacobian's dtype where input and output dtypes differ is torch's: a reverse-mode Jacobian (rows, gradients of
the inputs) in the input's dtype, as torch.autograd.functional.jacobian and jacrev; a forward-mode one (columns,
tangents of the outputs) in the output's, as jacfwd and the functional jacobian's forward-mode strategy."""
import pytest
import torch

import torchtrace as tt


@pytest.mark.parametrize("into", [torch.float32, torch.float64])
def test_a_jacobian_across_dtypes_has_torchs_dtype_and_values(into):
    x = torch.tensor([0.5, -1.0], dtype=torch.float64 if into == torch.float32 else torch.float32)

    def f(a):
        return (a * a).to(into) * 3

    reverse, forward = tt.jacobian(f, x, mode="reverse"), tt.jacobian(f, x, mode="forward")
    expected_reverse = torch.autograd.functional.jacobian(f, x)
    expected_forward = torch.func.jacfwd(f)(x)
    assert reverse.dtype == expected_reverse.dtype == x.dtype and forward.dtype == expected_forward.dtype == into
    torch.testing.assert_close(reverse, expected_reverse)
    torch.testing.assert_close(forward, expected_forward)
    torch.testing.assert_close(reverse.double(), torch.diag(6 * x.double()))
