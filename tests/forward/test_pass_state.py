"""tt.jacobian(mode="forward") and tt.hessian (forward-over-reverse) run f once per input element: every pass starts
from the random and module state the first started from, so the columns belong to one forward pass (dropout drew a
new mask per column; BatchNorm's running statistics moved once per column)."""
import copy

import torch

import torchtrace as tt


def test_forward_mode_jacobian_of_a_dropout_model_is_reverse_modes():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Dropout(0.5)).double())
    x = torch.randn(4, dtype=torch.float64)
    torch.manual_seed(3)
    reverse = tt.jacobian(model, x).as_subclass(torch.Tensor)
    after_reverse = torch.rand(1)
    torch.manual_seed(3)
    forward = tt.jacobian(model, x, mode="forward").as_subclass(torch.Tensor)
    after_forward = torch.rand(1)
    torch.testing.assert_close(forward, reverse, rtol=0, atol=1e-15)
    assert (reverse == 0).all(dim=1).any()  # a dropped output: the case where masks per column differed
    assert torch.equal(after_forward, after_reverse)  # the generator moved as one pass moves it


def test_forward_mode_jacobian_updates_batchnorm_statistics_once_as_torch():
    torch.manual_seed(0)
    theirs = torch.nn.BatchNorm1d(3).double()
    ours = tt.port(copy.deepcopy(theirs))
    x = torch.randn(4, 3, dtype=torch.float64)
    expected = torch.autograd.functional.jacobian(theirs, x)
    ours_jacobian = tt.jacobian(ours, x, mode="forward").as_subclass(torch.Tensor)
    torch.testing.assert_close(ours_jacobian, expected)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 1
    torch.testing.assert_close(ours.running_mean.as_subclass(torch.Tensor), theirs.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(ours.running_var.as_subclass(torch.Tensor), theirs.running_var, rtol=0, atol=0)


def test_a_hessian_through_dropout_is_the_same_by_both_methods():
    torch.manual_seed(0)
    w = torch.randn(5, dtype=torch.float64)

    def f(x):
        return (torch.nn.functional.dropout(x * w, 0.5, True).tanh() ** 2).sum()

    x = torch.randn(5, dtype=torch.float64)
    torch.manual_seed(7)
    by_rows = tt.hessian(f, x, method="reverse-over-reverse").as_subclass(torch.Tensor)
    torch.manual_seed(7)
    by_columns = tt.hessian(f, x, method="forward-over-reverse").as_subclass(torch.Tensor)
    torch.testing.assert_close(by_columns, by_rows, rtol=1e-12, atol=1e-12)
