"""Torch callables whose floating outputs carry no gradient: they pass through without a rule."""
import torch

from torchtrace.autograd.dispatch import NON_DIFFERENTIABLE

T = torch.Tensor

NON_DIFFERENTIABLE.update([
    torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like,
    torch.randint_like, T.new_zeros, T.new_ones, T.new_empty, T.new_full, T.new_tensor, T.detach,
    torch.detach,
    T.data.__get__, T.__deepcopy__, T.__reduce_ex__, torch.Tensor.__array__,
    T.new, T.new_empty_strided,  # constructors: x.new(2, 3) is a new tensor of x's dtype and device, no gradient
    torch.histc, torch.linspace, torch.logspace,  # torch marks their outputs as carrying no gradient
])
