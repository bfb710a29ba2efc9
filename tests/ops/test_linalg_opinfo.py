"""PyTorch's own OpInfo samples for the linalg rules, run through each OpInfo's gradcheck_wrapper (which makes
symmetric / triangular inputs out of raw ones) and output_process_fn_grad (which makes losses of singular and
eigen vectors sign-invariant), against torch autograd in float64. A few samples per OpInfo keep this fast."""
import itertools
import warnings
from typing import Any, List, Tuple

import pytest
import torch
from helpers import opinfos, sample_as_function

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

OPS = """cholesky cholesky_inverse cholesky_solve linalg.cholesky linalg.cholesky_ex linalg.cond linalg.det
linalg.diagonal linalg.eigh linalg.eigvalsh linalg.householder_product linalg.inv linalg.inv_ex linalg.lstsq
linalg.lu linalg.lu_factor linalg.lu_factor_ex linalg.lu_solve linalg.matrix_norm linalg.matrix_power
linalg.multi_dot linalg.norm linalg.pinv linalg.qr linalg.slogdet linalg.solve linalg.solve_ex
linalg.solve_triangular linalg.svd linalg.svdvals linalg.tensorinv linalg.tensorsolve linalg.vander linalg.vecdot
logdet lu lu_solve lu_unpack matrix_exp norm pinverse qr svd triangular_solve""".split()
SAMPLES_PER_OP = 5
OTHER_FAMILIES = ("torch.tril", "torch.triu", "torch.Tensor.tril", "torch.Tensor.triu", "torch.diag_embed")


def _as_function(op: Any, sample: Any) -> tuple:
    """(fn of the differentiable tensors, those tensors), through the OpInfo's gradcheck_wrapper and
    output_process_fn_grad."""

    def call(*args: Any, **kwargs: Any) -> Any:
        out = sample.output_process_fn_grad(op.gradcheck_wrapper(op.get_op(), *args, **kwargs))
        return out[0] if op.name == "linalg.lstsq" else out  # only the solution is differentiable (as torch)

    return sample_as_function(sample, call)


def _names(error: Exception, callable_name: str) -> bool:
    """Is the error about this callable having no rule? (either wording of the core's message)"""
    message = str(error)
    return message.startswith(f"{callable_name}:") or f"rule for {callable_name}," in message


def _samples(name: str) -> List[Tuple[Any, Any]]:
    return [s for op in opinfos(OPS)[name] for s in itertools.islice(
        ((op, s) for s in op.sample_inputs("cpu", torch.float64, requires_grad=True)), SAMPLES_PER_OP)]


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_match_torch(name: str) -> None:
    assert opinfos(OPS).get(name), f"no OpInfo named {name}"
    checked, deferred = 0, []
    for op, sample in _samples(name):
        fn, tensors = _as_function(op, sample)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                tt.check(fn, *tensors)
            except UnsupportedOperationError as error:  # the input wrapper needs a rule of another family
                if not any(_names(error, other) for other in OTHER_FAMILIES):
                    raise
                deferred.append(str(error))
                continue
        checked += 1
    if not checked:
        pytest.skip(f"every sample's gradcheck_wrapper needs a rule outside linalg: {deferred[0][:120]}")
