"""Gradient rules for functions of matrices: matrix_exp, matrix_power, matrix and operator norms, cond, multi_dot,
vecdot, vander, householder_product, ormqr, tensorinv / tensorsolve and linalg.diagonal.

Most of these are compositions of the rules in linalg_inverse.py and linalg_decompositions.py, and their
backward composes those rules' gradients: a spectral norm is a singular value (dA = g u_1 v_1^T), cond is a
product of two norms, tensorinv is inv of a reshaped tensor. Real matrices only.
"""
import math
import numbers
from typing import Any, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.linalg_inverse import eye, real_only, tril
from torchtrace.ops.reduction import Norm as VectorPNorm
from torchtrace.ops.reduction import VectorNorm
from torchtrace.ops.rule_tables import unary

T = torch.Tensor
linalg = torch.linalg


# ----------------------------------------------------------------------------------------------------------------
# the matrix exponential and powers

@register(linalg.matrix_exp, torch.matrix_exp, T.matrix_exp)
class MatrixExp(Function):
    """Y = exp(A)  ->  dA = top-right block of exp([[A^T, G], [0, A^T]])   (the Frechet derivative at A^T)"""

    @staticmethod
    def forward(ctx, A):
        real_only("torch.linalg.matrix_exp", A)
        ctx.save_for_backward(A)
        return linalg.matrix_exp(A)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        n = a.shape[-1]
        at = a.mT
        block = torch.cat([torch.cat([at, g], -1), torch.cat([torch.zeros_like(at), at], -1)], -2)
        return linalg.matrix_exp(block)[..., :n, n:]


def power_grad(a: torch.Tensor, k: int, g: torch.Tensor) -> torch.Tensor:
    """Y = A^k (k >= 1)  ->  dA = sum_{i<k} (A^T)^i G (A^T)^(k-1-i)"""
    powers = [eye(a.shape[-1], None, a).expand_as(a)]
    for _ in range(k - 1):
        powers.append(powers[-1] @ a)
    return sum(powers[i].mT @ g @ powers[k - 1 - i].mT for i in range(k))


@register(linalg.matrix_power, torch.matrix_power, T.matrix_power)
class MatrixPower(Function):
    """Y = A^k  ->  dA = sum_{i<k} (A^T)^i G (A^T)^(k-1-i);  k < 0: Y = B^|k|, B = A^-1, then dA = -A^-T dB A^-T
    with dB the rule for k > 0 applied to B"""

    @staticmethod
    def forward(ctx, A, n):
        real_only("torch.linalg.matrix_power", A)
        ctx.n = int(n)
        ctx.save_for_backward(A)
        return linalg.matrix_power(A, n)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        if ctx.n == 0:
            return torch.zeros_like(a)
        if ctx.n > 0:
            return power_grad(a, ctx.n, g)
        b = linalg.inv(a)
        return -(b.mT @ power_grad(b, -ctx.n, g) @ b.mT)


# ----------------------------------------------------------------------------------------------------------------
# matrix norms (over two dims) and the condition number

def split_evenly(values: torch.Tensor, largest: bool) -> torch.Tensor:
    """1/k at each of the k largest (smallest) entries along the last dim, as torch's amax / amin backward."""
    chosen = values.amax(-1, keepdim=True) if largest else values.amin(-1, keepdim=True)
    hits = (values == chosen).to(values.dtype)  # (a bool quotient would be float32 whatever the values' dtype)
    return hits / hits.sum(-1, keepdim=True)


def matrix_norm_grad(a: torch.Tensor, y: torch.Tensor, g: torch.Tensor, ord: Any) -> torch.Tensor:
    """Gradient of y = ||A||_ord over A's last two dims (y, g: one value per matrix; torch has checked ord)."""
    g2 = g.unsqueeze(-1).unsqueeze(-1)
    if ord == "fro":
        y2 = y.unsqueeze(-1).unsqueeze(-1)
        return g2 * torch.where(y2 == 0, 0.0, a / y2)  # y = 0 only at A = 0: gradient 0 (2nd: NaN), as torch
    if ord in ("nuc", 2, -2):
        u, s, vh = linalg.svd(a, full_matrices=False)
        if ord == "nuc":
            return u @ vh * g2
        weights = split_evenly(s, ord == 2) * g.unsqueeze(-1)
        return (u * weights.unsqueeze(-2)) @ vh
    summed = -2 if ord in (1, -1) else -1  # +-1: the extreme column sum of |A|; +-inf: the extreme row sum
    weights = split_evenly(a.abs().sum(summed), ord > 0) * g.unsqueeze(-1)
    return a.sign() * weights.unsqueeze(summed)


def norm_dims(dim: Sequence[int], ndim: int) -> Tuple[int, int]:
    return tuple(d % ndim for d in dim)


class MatrixNormBase(Function):
    """Shared by matrix_norm, linalg.norm and torch.norm(p='nuc'): the two dims moved to the end, then back."""

    @staticmethod
    def start(ctx: Any, a: torch.Tensor, ord: Any, dim: Sequence[int], keepdim: bool, dtype: Optional[torch.dtype],
              name: str) -> torch.Tensor:
        real_only(name, a)
        y = linalg.matrix_norm(a, ord, dim, keepdim, dtype=dtype)
        ctx.ord, ctx.dims, ctx.keepdim, ctx.dtype = ord, norm_dims(dim, a.dim()), keepdim, dtype
        ctx.save_for_backward(a, y)
        return y

    @staticmethod
    def grad(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        a, y = ctx.saved_tensors
        if ctx.dtype is not None:
            a = a.to(ctx.dtype)
        if ctx.keepdim:
            g, y = (t.squeeze(ctx.dims) for t in (g, y))
        moved = a.movedim(ctx.dims, (-2, -1))
        return matrix_norm_grad(moved, y, g, ctx.ord).movedim((-2, -1), ctx.dims)


@register(linalg.matrix_norm)
class MatrixNorm(MatrixNormBase):
    """y = ||A||  ->  dA = g A/y (fro), g U V^T (nuc), g u_i v_i^T (+-2, the extreme s_i), g sign(A) on the
    extreme column (+-1) or row (+-inf);  A = U diag(s) V^T its SVD with columns u_i and v_i"""

    @staticmethod
    def forward(ctx, A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
        return MatrixNormBase.start(ctx, A, ord, dim, keepdim, dtype, "torch.linalg.matrix_norm")

    @staticmethod
    def backward(ctx, g):
        return MatrixNormBase.grad(ctx, g)


def is_matrix_norm(x: torch.Tensor, ord: Any, dim: Any) -> bool:
    """torch.linalg.norm computes a matrix norm for a 2-tuple dim, or for a 2-D input with ord and no dim."""
    if dim is not None:
        return not isinstance(dim, numbers.Integral) and len(dim) == 2
    return ord is not None and x.dim() == 2


@register(linalg.norm)
class LinalgNorm(Function):
    """y = ||x||  ->  dx = g sign(x) |x|^(p-1) / y^(p-1) (a vector norm: one dim or all), or dx as matrix_norm's
    (two dims: g x/y for fro, g U V^T for nuc, ...);  x = U diag(s) V^T its SVD"""

    @staticmethod
    def forward(ctx, A, ord=None, dim=None, keepdim=False, *, dtype=None):
        ctx.matrix = is_matrix_norm(A, ord, dim)
        if ctx.matrix:
            return MatrixNormBase.start(ctx, A, "fro" if ord is None else ord, (-2, -1) if dim is None else dim,
                                        keepdim, dtype, "torch.linalg.norm")
        real_only("torch.linalg.norm", A)
        return VectorNorm.forward(ctx, A, 2 if ord is None else ord, dim, keepdim, dtype)

    @staticmethod
    def backward(ctx, g):
        return MatrixNormBase.grad(ctx, g) if ctx.matrix else VectorNorm.backward(ctx, g)


@register(torch.norm, T.norm)  # replaces VectorPNorm's registration (imported above, so registered first)
class Norm(VectorPNorm):
    """y = torch.norm(x, p)  ->  dx = g sign(x) |x|^(p-1) / y^(p-1) (vector p-norms, 'fro' = 2),  dx = g U V^T
    (p='nuc', a matrix norm, x = U diag(s) V^T its SVD)"""

    @staticmethod
    def forward(ctx, x, p="fro", dim=None, keepdim=False, dtype=None, *, out=None):
        ctx.matrix = p == "nuc"
        if ctx.matrix:
            return MatrixNormBase.start(ctx, x, "nuc", (-2, -1) if dim is None else dim, keepdim, dtype, "torch.norm")
        return VectorPNorm.forward(ctx, x, p, dim, keepdim, dtype, out=out)

    @staticmethod
    def backward(ctx, g):
        return MatrixNormBase.grad(ctx, g) if ctx.matrix else VectorPNorm.backward(ctx, g)


def one_hot(n: int, i: int, like: torch.Tensor) -> torch.Tensor:
    return eye(n, None, like)[i]


@register(linalg.cond)
class Cond(Function):
    """k = ||A|| ||A^-1||  ->  p=2: k = s_1/s_n, dA = U diag(g e_1/s_n - g s_1 e_n/s_n^2) V^T; else product rule;
    A = U diag(s) V^T its SVD, e_i = the unit vector i"""

    @staticmethod
    def forward(ctx, A, p=None):
        real_only("torch.linalg.cond", A)
        ctx.p = p
        ctx.save_for_backward(A)
        return linalg.cond(A, p)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        if ctx.p in (None, 2, -2):
            u, s, vh = linalg.svd(a, full_matrices=False)
            top, bottom = (0, -1) if ctx.p != -2 else (-1, 0)  # kappa = s[top] / s[bottom]
            k, num, den = s.shape[-1], s[..., top, None], s[..., bottom, None]
            weights = g.unsqueeze(-1) * (one_hot(k, top, s) / den - one_hot(k, bottom, s) * num / (den * den))
            return (u * weights.unsqueeze(-2)) @ vh
        inverse = linalg.inv(a)
        norm_a, norm_inverse = linalg.matrix_norm(a, ctx.p), linalg.matrix_norm(inverse, ctx.p)
        grad_a = matrix_norm_grad(a, norm_a, g * norm_inverse, ctx.p)
        grad_inverse = matrix_norm_grad(inverse, norm_inverse, g * norm_a, ctx.p)
        return grad_a - inverse.mT @ grad_inverse @ inverse.mT


# ----------------------------------------------------------------------------------------------------------------
# chains of products, vecdot

def chain_grads(matrices: List[torch.Tensor], g: torch.Tensor) -> List[torch.Tensor]:
    """Y = M_0 M_1 ... M_{k-1}  ->  dM_i = (M_0..M_{i-1})^T G (M_{i+1}..M_{k-1})^T  (1-D ends as a row / column)"""
    first_vector, last_vector = matrices[0].dim() == 1, matrices[-1].dim() == 1
    mats = list(matrices)
    if first_vector:
        mats[0] = mats[0].unsqueeze(0)
    if last_vector:
        mats[-1] = mats[-1].unsqueeze(-1)
        g = g.unsqueeze(-1)
    if first_vector:
        g = g.unsqueeze(-2)
    prefixes = [None]
    for m in mats[:-1]:
        prefixes.append(m if prefixes[-1] is None else prefixes[-1] @ m)
    grads: List[Optional[torch.Tensor]] = [None] * len(mats)
    suffix = None
    for i in range(len(mats) - 1, -1, -1):
        grad = g if suffix is None else g @ suffix.mT
        grads[i] = grad if prefixes[i] is None else prefixes[i].mT @ grad
        suffix = mats[i] if suffix is None else mats[i] @ suffix
    if first_vector:
        grads[0] = grads[0].squeeze(0)
    if last_vector:
        grads[-1] = grads[-1].squeeze(-1)
    return grads


@register(linalg.multi_dot)
class MultiDot(Function):
    """Y = M_0 M_1 ... M_{k-1}  ->  dM_i = (M_0..M_{i-1})^T G (M_{i+1}..M_{k-1})^T"""

    @staticmethod
    def forward(ctx, tensors):
        real_only("torch.linalg.multi_dot", *tensors)
        ctx.save_for_backward(*tensors)
        return linalg.multi_dot(tensors)

    @staticmethod
    def backward(ctx, g):
        return (chain_grads(list(ctx.saved_tensors), g),)


@register(torch.chain_matmul)
class ChainMatmul(Function):
    """Y = torch.chain_matmul(M_0, ..., M_{k-1})  ->  dM_i = (M_0..M_{i-1})^T G (M_{i+1}..M_{k-1})^T"""

    @staticmethod
    def forward(ctx, *matrices, out=None):
        real_only("torch.chain_matmul", *matrices)
        ctx.save_for_backward(*matrices)
        return linalg.multi_dot(matrices) if len(matrices) > 1 else matrices[0].clone()

    @staticmethod
    def backward(ctx, g):
        matrices = list(ctx.saved_tensors)
        return tuple(chain_grads(matrices, g)) if len(matrices) > 1 else g


@register(linalg.vecdot)
class Vecdot(Function):
    """z = sum_k x_k y_k (along dim)  ->  dx = g y, dy = g x"""

    @staticmethod
    def forward(ctx, x, y, *, dim=-1):
        real_only("torch.linalg.vecdot", x, y)
        ctx.dim = dim
        ctx.save_for_backward(x, y)
        return linalg.vecdot(x, y, dim=dim)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        g = g.unsqueeze(ctx.dim)
        return (g * y if ctx.needs_input_grad[0] else None), (g * x if ctx.needs_input_grad[1] else None)


# ----------------------------------------------------------------------------------------------------------------
# Vandermonde matrices

def vander_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """V_ij = x_i^j (j < N)  ->  dx_i = sum_{j>=1} g_ij j x_i^(j-1)"""
    n = g.shape[-1]
    if n <= 1:
        return torch.zeros_like(x)
    powers = linalg.vander(x, N=n - 1) if n > 2 else torch.ones_like(x).unsqueeze(-1)  # vander needs N > 1
    exponents = torch.arange(1, n, dtype=x.dtype, device=x.device)
    return (g[..., 1:] * exponents * powers).sum(-1)


@register(linalg.vander)
class Vander(Function):
    """V_ij = x_i^j  ->  dx_i = sum_j g_ij j x_i^(j-1)"""

    @staticmethod
    def forward(ctx, x, *, N=None):
        real_only("torch.linalg.vander", x)
        ctx.save_for_backward(x)
        return linalg.vander(x, N=N)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return vander_grad(x, g)


@register(torch.vander)
class LegacyVander(Function):
    """V_ij = x_i^(N-1-j) (or x_i^j with increasing=True)  ->  dx_i = sum_j g_ij d(x_i^p_j)"""

    @staticmethod
    def forward(ctx, x, N=None, increasing=False):
        real_only("torch.vander", x)
        ctx.increasing = increasing
        ctx.save_for_backward(x)
        return torch.vander(x, N, increasing)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return vander_grad(x, g if ctx.increasing else g.flip(-1))


# ----------------------------------------------------------------------------------------------------------------
# products of Householder reflectors

@register(linalg.householder_product, torch.orgqr, T.orgqr)
class HouseholderProduct(Function):
    """Q = H_1..H_k[:, :n], H_i = I - t_i v_i v_i^T  ->  dt_i = -v_i^T dH_i v_i, dv_i = -t_i (dH_i + dH_i^T) v_i"""

    @staticmethod
    def forward(ctx, A, tau):
        real_only("torch.linalg.householder_product", A, tau)
        ctx.save_for_backward(A, tau)
        return linalg.householder_product(A, tau)

    @staticmethod
    def backward(ctx, g):
        a, tau = ctx.saved_tensors
        m, n = a.shape[-2:]
        if tau.shape[-1] == 0:  # no reflectors: Q is the identity's first n columns
            return torch.zeros_like(a), torch.zeros_like(tau)
        g_full = torch.cat([g, g.new_zeros(g.shape[:-1] + (m - n,))], -1) if m > n else g
        return householder_vjp(a, tau, g_full)


def householder_vjp(a: torch.Tensor, tau: torch.Tensor, g_full: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dA, dtau) of the full m x m product H_1..H_k of the reflectors stored in A's columns and tau, given its
    gradient G: dH_i = (H_1..H_{i-1})^T G (H_{i+1}..H_k)^T; v_i is column i of A below the diagonal, 1 on it."""
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    identity = eye(m, None, a)
    vs = tril(a[..., :, :k], -1) + eye(m, k, a)
    v = [vs[..., :, i:i + 1] for i in range(k)]
    reflectors = [identity - tau[..., i, None, None] * (v[i] @ v[i].mT) for i in range(k)]
    prefixes = [identity]
    for h in reflectors[:-1]:
        prefixes.append(prefixes[-1] @ h)
    grad_v, grad_tau = [None] * k, [None] * k
    suffix = identity
    for i in range(k - 1, -1, -1):
        grad_h = prefixes[i].mT @ g_full @ suffix.mT
        grad_tau[i] = -(v[i].mT @ grad_h @ v[i])[..., 0, 0]
        grad_v[i] = -tau[..., i, None, None] * ((grad_h + grad_h.mT) @ v[i])
        suffix = reflectors[i] @ suffix
    grad_a = tril(torch.cat(grad_v, -1), -1)
    if k < n:
        grad_a = torch.cat([grad_a, grad_a.new_zeros(grad_a.shape[:-1] + (n - k,))], -1)
    return grad_a, torch.stack(grad_tau, -1)


@register(torch.ormqr, T.ormqr)
class Ormqr(Function):
    """R = op(Q) C (left) or C op(Q), op = transpose or not, Q = H_1..H_k  ->  dC = op(Q)^T G (or G op(Q)^T),
    dQ = G C^T (left; transposed: C G^T; right: C^T G, transposed: G^T C), then dA and dtau as householder_product's,
    Q = householder_product(A, tau)"""

    @staticmethod
    def forward(ctx, input, tau, other, left=True, transpose=False):
        real_only("torch.ormqr", input, tau, other)
        ctx.left, ctx.transpose = left, transpose
        ctx.save_for_backward(input, tau, other)
        return torch.ormqr(input, tau, other, left, transpose)

    @staticmethod
    def backward(ctx, g):
        a, tau, c = ctx.saved_tensors
        need_a, need_tau, need_c = ctx.needs_input_grad[:3]
        left, transpose = ctx.left, ctx.transpose
        grad_c = torch.ormqr(a, tau, g, left, not transpose) if need_c else None  # op(Q)^T applied to G
        grad_a = grad_tau = None
        if (need_a or need_tau) and tau.shape[-1] > 0:
            if left:
                grad_q = c @ g.mT if transpose else g @ c.mT
            else:
                grad_q = g.mT @ c if transpose else c.mT @ g
            grad_a, grad_tau = householder_vjp(a, tau, grad_q)
        elif need_a or need_tau:
            grad_a, grad_tau = torch.zeros_like(a), torch.zeros_like(tau)
        return grad_a, grad_tau, grad_c, None, None


# ----------------------------------------------------------------------------------------------------------------
# tensor versions of inv and solve: reshape to a matrix, then as inv / solve

@register(linalg.tensorinv)
class Tensorinv(Function):
    """Y = tensorinv(A, ind) = inv(A as a p x q matrix), reshaped  ->  dA = -Y^T G Y^T (as matrices), reshaped"""

    @staticmethod
    def forward(ctx, A, ind=2):
        real_only("torch.linalg.tensorinv", A)
        y = linalg.tensorinv(A, ind)
        ctx.shape, ctx.ind = A.shape, ind
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        rows = math.prod(ctx.shape[:ctx.ind])
        y, g = y.reshape(-1, rows), g.reshape(-1, rows)
        return -(y.mT @ g @ y.mT).reshape(ctx.shape)


@register(linalg.tensorsolve)
class Tensorsolve(Function):
    """X = A^-1 B with A, B, X flattened to a matrix and vectors  ->  dB = A^-T G, dA = -dB X^T (reshaped back)"""

    @staticmethod
    def forward(ctx, A, B, dims=None):
        real_only("torch.linalg.tensorsolve", A, B)
        x = linalg.tensorsolve(A, B, dims)
        ctx.moved = tuple(d % A.dim() for d in dims) if dims is not None else ()
        ctx.b_shape = B.shape
        ctx.save_for_backward(A, x)
        return x

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        ends = tuple(range(a.dim() - len(ctx.moved), a.dim()))
        a = a.movedim(ctx.moved, ends)
        matrix = a.reshape(math.prod(ctx.b_shape), -1)
        grad_b = linalg.solve(matrix.mT, g.reshape(-1))
        grad_a = None
        if ctx.needs_input_grad[0]:
            grad_a = -(grad_b.unsqueeze(-1) * x.reshape(1, -1))
            grad_a = grad_a.reshape(a.shape).movedim(ends, ctx.moved)
        return grad_a, grad_b.reshape(ctx.b_shape) if ctx.needs_input_grad[1] else None


unary("LinalgDiagonal", [linalg.diagonal],
      "y = diagonal of A (dims -2, -1 by default)  ->  dA = g written on that diagonal of zeros",
      lambda g, x, y, offset, dim1, dim2: torch.diagonal_scatter(g.new_zeros(x.shape), g, offset, dim1, dim2),
      uses=("x.meta",), options={"offset": 0, "dim1": -2, "dim2": -1}, inputs=("A",))



# ----------------------------------------------------------------------------------------------------------------
# conjugate transposes: for the real matrices these rules support, the transpose of the last two dims

unary("Adjoint", [T.mH.__get__, T.adjoint, torch.adjoint, T.H.__get__], "Y = A^H = A^T (real)  ->  dA = G^T",
      lambda g, x, y: g.mT, uses=(), op=lambda A: A.mT, check=lambda A: real_only("torch.Tensor.mH", A),
      inputs=("A",))
