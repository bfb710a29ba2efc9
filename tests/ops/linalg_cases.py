"""Inputs shared by the linalg rule tests (test_linalg, test_linalg_inverse, test_linalg_functions,
test_linalg_decompositions)."""
import torch

DTYPES = [torch.float64, torch.float32]


def rand(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype)


def well_conditioned(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A random square matrix (batch) shifted away from singularity."""
    n = shape[-1]
    return torch.randn(shape, dtype=dtype) + n * torch.eye(n, dtype=dtype)


def spd(x: torch.Tensor) -> torch.Tensor:
    """A symmetric positive-definite matrix made from x inside the checked function (so gradcheck stays valid)."""
    n = x.shape[-1]
    return x @ x.mT + n * torch.eye(n, dtype=x.dtype)


def loose_tolerances(dtype: torch.dtype) -> dict:
    """check_op tolerances for SVD, pinv and cond, whose float32 results drift further than float_tolerances allows."""
    return {"rtol": 1e-3, "atol": 1e-4} if dtype == torch.float32 else {}
