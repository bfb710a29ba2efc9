"""The differential fuzzer in CI: a fixed set of random programs must match torch autograd (or be refused clearly).

pytest tests/fuzz --long [--minutes N] runs fresh seeds for minutes; python -m tests.fuzz --help for more.
"""
import time

import pytest
import torch

from .generator import CI_FEATURES, KNOWN_CORE_BUGS, generate
from .program import Program, tensor_literal
from .runner import CI_PROGRAMS, CI_SEED, FAIL, OK, REFUSED, assert_same, compare, fuzz, report, run_program, shrink


def test_ci_budget_matches_torch(request: pytest.FixtureRequest) -> None:
    long = request.config.getoption("--long")
    seed = int(time.time()) % 1_000_000 * 1000 if long else CI_SEED
    minutes = request.config.getoption("--minutes") if long else None
    tally = fuzz(seed, None if long else CI_PROGRAMS, minutes, known_bugs=False, quiet=True)
    print(tally.summary())
    assert not tally.failures, "\n".join(report(*failure) for failure in tally.failures)
    assert tally.counts[OK] > tally.counts[REFUSED]  # the programs mostly run, so the budget tests something


def test_known_core_bugs_name_generator_features() -> None:
    assert set(KNOWN_CORE_BUGS).isdisjoint(CI_FEATURES)
    assert all(len(reason) > 40 for reason in KNOWN_CORE_BUGS.values())  # each says what still breaks


def test_programs_are_deterministic_and_valid_python() -> None:
    a, b = generate(7), generate(7)
    assert a.source() == b.source()
    compile(a.source(), "<fuzz>", "exec")


def test_a_disagreement_is_found_shrunk_and_printed() -> None:
    def scale(x):  # a wrong "program": the tracer side sees a different function
        return [x * 3 if type(x) is not torch.Tensor else x * 2], []

    assert compare(scale, [torch.ones(2, dtype=torch.float64)]).status == FAIL
    with pytest.raises(AssertionError, match="output 0 differs"):
        assert_same(scale, [torch.ones(2, dtype=torch.float64)])


def test_shrinking_keeps_only_the_failing_statement() -> None:
    odd = "t1 = x0 * (2.0 if type(x0) is torch.Tensor else 3.0)"  # differs on tracers by construction
    program = Program(inputs=[("x0", torch.tensor([1.0, -2.0], dtype=torch.float64)),
                              ("x1", torch.tensor([0.5], dtype=torch.float64))],
                      lines=["t0 = x0.sin() + x1", odd, "t2 = t0.cos()"], outputs=["t2", "t1"])
    outcome = run_program(program)
    assert outcome.status == FAIL
    small, again = shrink(program, outcome)
    assert small.lines == [odd] and small.outputs == ["t1"] and [n for n, _ in small.inputs] == ["x0"]
    assert again.status == FAIL and "def program(x0):" in small.source()


def test_literals_spell_nan_and_inf() -> None:
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5], dtype=torch.float64)
    text = tensor_literal(t)
    assert text == "torch.tensor([float('nan'), float('inf'), -float('inf'), 0.5], dtype=torch.float64)"
    assert torch.equal(eval(text).isnan(), t.isnan())
