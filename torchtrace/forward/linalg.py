"""Tangents of products and of linear algebra: products are multilinear, factorizations have their own rules."""
from typing import Any, List

import torch

from torchtrace.forward.call import Call, NoTangent
from torchtrace.forward.kinds import decomposed, product
from torchtrace.forward.table import declare, tangent

declare("Matmul Mm Bmm Mv Dot Inner Outer Tensordot Rmatmul Vecdot Cross LinalgCross",
        "ż = ȧ ⋆ b + a ⋆ ḃ (⋆: the product)", product((0, 1)))
declare("Addmm Addmv Addr Baddbmm Addbmm", "y = β i + α a ⋆ b  ->  ẏ = β i̇ + α (ȧ ⋆ b + a ⋆ ḃ)",
        product((1, 2), offset=0))


def _products(operands: List[Any], dots: List[Any], run: Any) -> Any:
    """Σ_i op(x_1, .., ẋ_i, .., x_n) for a list of factors."""
    total = None
    for i, dot in enumerate(dots):
        if dot is not None:
            term = run([dot if j == i else x for j, x in enumerate(operands)])
            total = term if total is None else total + term
    return total


@tangent("Einsum", "y = einsum(eq, x_1, .., x_n)  ->  ẏ = Σ_i einsum(eq, x_1, .., ẋ_i, .., x_n)")
def _einsum(call: Call) -> torch.Tensor:
    equation, rest = call.args[0], list(call.args[1:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        return _products(list(rest[0]), list(call.dot(1)), lambda ops: call.run(equation, ops))
    return _products(rest, call.dots[1:], lambda ops: call.run(equation, *ops))


@tangent("MultiDot ChainMatmul", "y = x_1 x_2 .. x_n  ->  ẏ = Σ_i x_1 .. ẋ_i .. x_n")
def _chain(call: Call) -> torch.Tensor:
    if len(call.args) == 1 and isinstance(call.args[0], (list, tuple)):
        return _products(list(call.args[0]), list(call.dot(0)), lambda ops: call.run(ops))
    return _products(list(call.args), call.dots, lambda ops: call.run(*ops))


@tangent("Inv", "Y = A^-1  ->  Ẏ = -Y Ȧ Y")
def _inv(call: Call) -> torch.Tensor:
    call.only(0)
    y = call.out
    return -y @ call.dot(0) @ y


@tangent("InvEx", "Y = A^-1  ->  Ẏ = -Y Ȧ Y (info: no tangent)")
def _inv_ex(call: Call) -> tuple:
    call.only(0)
    y = call.out[0]
    return -y @ call.dot(0) @ y, None


def _solved(call: Call, x: torch.Tensor) -> torch.Tensor:
    """Ẋ = A^-1 (Ḃ - Ȧ X) for X = solve(A, B) (B a matrix, or a vector / batch of vectors as torch reads it)."""
    call.only(0, 1)
    if not call.arg(2, "left", True):
        raise NoTangent
    a, b = call.args[0], call.args[1]
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    rhs = call.dot(1) if call.dot(1) is not None else torch.zeros_like(x)
    if call.dot(0) is not None:
        rhs = rhs - ((call.dot(0) @ x.unsqueeze(-1)).squeeze(-1) if vector else call.dot(0) @ x)
    return torch.linalg.solve(a, rhs)


@tangent("Solve", "X = A^-1 B  ->  Ẋ = A^-1 (Ḃ - Ȧ X)")
def _solve(call: Call) -> torch.Tensor:
    return _solved(call, call.out)


@tangent("SolveEx", "X = A^-1 B  ->  Ẋ = A^-1 (Ḃ - Ȧ X) (info: no tangent)")
def _solve_ex(call: Call) -> tuple:
    return _solved(call, call.out[0]), None


@tangent("SolveTriangular", "X = T^-1 B (T the triangle of A)  ->  Ẋ = T^-1 (Ḃ - Ṫ X), or (Ḃ - X Ṫ) T^-1 on the right")
def _solve_triangular(call: Call) -> torch.Tensor:
    call.only(0, 1)
    a, x = call.args[0], call.out
    upper = call.arg(2, "upper")
    left, unit = call.arg(3, "left", True), call.arg(4, "unitriangular", False)
    rhs = call.dot(1) if call.dot(1) is not None else torch.zeros_like(x)
    if call.dot(0) is not None:
        da = call.dot(0).triu(1 if unit else 0) if upper else call.dot(0).tril(-1 if unit else 0)
        rhs = rhs - (da @ x if left else x @ da)
    return torch.linalg.solve_triangular(a, rhs, upper=upper, left=left, unitriangular=unit)


def _factor(factor: torch.Tensor, upper: bool) -> torch.Tensor:
    """A = L L^T from the triangle cholesky_solve / cholesky_inverse read."""
    triangle = factor.triu() if upper else factor.tril()
    return triangle.mT @ triangle if upper else triangle @ triangle.mT


def _cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    return torch.linalg.solve(_factor(factor, upper), b)


def _cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    return torch.linalg.inv(_factor(factor, upper))


def _matrix_power(a: torch.Tensor, n: int) -> torch.Tensor:
    base = torch.linalg.inv(a) if n < 0 else a
    result = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape) * 1
    for _ in range(abs(n)):
        result = result @ base
    return result


declare("CholeskySolve", "X = (L L^T)^-1 B  ->  the tangent of solve(L L^T, B)", decomposed(_cholesky_solve))
declare("CholeskyInverse", "Y = (L L^T)^-1  ->  the tangent of inv(L L^T)", decomposed(_cholesky_inverse))
declare("MatrixPower", "Y = A^n  ->  the tangent of n products (of A^-1 for n < 0)", decomposed(_matrix_power))


def _phi(x: torch.Tensor) -> torch.Tensor:
    """The lower triangle with the diagonal halved."""
    return x.tril() - 0.5 * torch.diag_embed(x.diagonal(dim1=-2, dim2=-1))


def _cholesky_tangent(factor: torch.Tensor, da: torch.Tensor, upper: bool) -> torch.Tensor:
    lower = factor.mH if upper else factor
    inner = torch.linalg.solve_triangular(lower, da, upper=False)
    inner = torch.linalg.solve_triangular(lower, inner.mH, upper=False).mH  # L^-1 Ȧ L^-H
    dl = lower @ _phi(inner)
    return dl.mH if upper else dl


@tangent("Cholesky", "A = L L^T  ->  L̇ = L Φ(L^-1 Ȧ L^-T), Φ = lower triangle with half the diagonal")
def _cholesky(call: Call) -> torch.Tensor:
    call.only(0)
    return _cholesky_tangent(call.out, call.dot(0), bool(call.arg(1, "upper", False)))


@tangent("CholeskyEx", "A = L L^T  ->  L̇ = L Φ(L^-1 Ȧ L^-T) (info: no tangent)")
def _cholesky_ex(call: Call) -> tuple:
    call.only(0)
    return _cholesky_tangent(call.out[0], call.dot(0), bool(call.arg(1, "upper", False))), None


def _eigh_tangents(values: torch.Tensor, vectors: torch.Tensor, da: torch.Tensor) -> tuple:
    """λ̇ = diag(V^T Ȧ V), V̇ = V (F ∘ V^T Ȧ V) with F_ij = 1 / (λ_j - λ_i) off the diagonal, 0 on it."""
    inner = vectors.mH @ da @ vectors
    dvalues = inner.diagonal(dim1=-2, dim2=-1)
    gaps = values.unsqueeze(-2) - values.unsqueeze(-1)
    off = ~torch.eye(values.shape[-1], dtype=torch.bool, device=values.device)
    scale = torch.where(off, 1 / torch.where(off, gaps, torch.ones_like(gaps)), torch.zeros_like(gaps))
    return dvalues, vectors @ (inner * scale)


@tangent("Eigh", "A = V diag(λ) V^T  ->  λ̇ = diag(V^T Ȧ V), V̇ = V (F ∘ V^T Ȧ V), F_ij = 1/(λ_j - λ_i), F_ii = 0")
def _eigh(call: Call) -> tuple:
    call.only(0)
    return _eigh_tangents(call.out[0], call.out[1], call.dot(0))


@tangent("Eigvalsh", "λ = eigenvalues of A  ->  λ̇ = diag(V^T Ȧ V)")
def _eigvalsh(call: Call) -> torch.Tensor:
    call.only(0)
    values, vectors = torch.linalg.eigh(call.args[0], UPLO=call.arg(1, "UPLO", "L"))
    return _eigh_tangents(values, vectors, call.dot(0))[0]


def _least_squares(a: torch.Tensor, b: torch.Tensor, rcond: Any = None, *, driver: Any = None) -> tuple:
    """lstsq of a full-rank A: X = (A^T A)^-1 A^T B (tall) or A^T (A A^T)^-1 B (wide), and the residuals
    Σ (A X - B)^2 (returned by torch when A is tall), written with ops that have tangent rules."""
    m, n = a.shape[-2], a.shape[-1]
    vector = b.dim() == a.dim() - 1
    rhs = b.unsqueeze(-1) if vector else b
    if m >= n:
        x = torch.linalg.solve(a.mT @ a, a.mT @ rhs)
    else:
        x = a.mT @ torch.linalg.solve(a @ a.mT, rhs)
    residuals = (a @ x - rhs).pow(2).sum(-2)
    return (x.squeeze(-1) if vector else x), residuals


def _lstsq(call: Call) -> tuple:
    call.only(0, 1)
    solution, residuals = decomposed(_least_squares)(call)
    out = call.out
    return (solution, residuals if out[1].numel() else torch.zeros_like(out[1]).expand(out[1].shape), None,
            torch.zeros_like(out[3]) if out[3].is_floating_point() else None)


_lstsq.recorded = True
declare("Lstsq", "X = A^+ B (full rank)  ->  the tangent of (A^T A)^-1 A^T B (tall A) or A^T (A A^T)^-1 B, and of the "
        "residuals Σ (A X - B)^2", _lstsq)
