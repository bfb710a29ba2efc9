"""Every OpInfo op that passes in reverse mode, through tt.jvp: equal to torch.func.jvp and to finite differences.

An op listed in dual_ops.txt must get its tangents from tangent rules alone (no transposed backward); the others
may transpose an op's backward, but never give a different tangent. Regenerate the list after adding tangent
rules: python -m tests.forward.test_tangent_opinfo --write
"""
import pathlib
import sys

import pytest

from tests.forward import opinfo_jvp
from torchtrace import coverage

DUAL_FILE = pathlib.Path(__file__).with_name("dual_ops.txt")
OPS = {coverage.op_key(op): op for op in coverage.judged_ops() if coverage.op_key(op) in opinfo_jvp.coverage_passing()}


def dual_ops() -> set:
    return {line.strip() for line in DUAL_FILE.read_text().splitlines() if line.strip()}


@pytest.mark.parametrize("name", sorted(OPS))
def test_tangent_equals_torch_func_jvp_and_finite_differences(name: str) -> None:
    verdict = opinfo_jvp.judge(OPS[name])
    assert verdict.status != opinfo_jvp.WRONG, f"{name}: {verdict.detail}"
    if name in dual_ops():
        assert verdict.status == opinfo_jvp.DUAL, f"{name} had tangent rules for every op, now {verdict.status}"


def test_the_dual_list_names_swept_ops():
    assert dual_ops() <= set(OPS)


if __name__ == "__main__" and "--write" in sys.argv:
    dual = sorted(name for name, op in OPS.items() if opinfo_jvp.judge(op).status == opinfo_jvp.DUAL)
    DUAL_FILE.write_text("\n".join(dual) + "\n")
    print(f"{len(dual)} ops get every tangent from tangent rules")
