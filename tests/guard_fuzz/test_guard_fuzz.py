"""The replay fuzzer in CI: random programs, random changes between calls, compiled always equal to eager.

pytest tests/guard_fuzz --long [--minutes N] runs fresh seeds for minutes; python -m tests.guard_fuzz as well.
"""
import time

import pytest

from .runner import CI_PROGRAMS, CI_SEED, Tally, fuzz, run_program


def test_ci_budget_compiled_equals_eager(request: pytest.FixtureRequest) -> None:
    long = request.config.getoption("--long")
    seed = int(time.time()) % 1_000_000 * 100 if long else CI_SEED
    tally = fuzz(seed, None if long else CI_PROGRAMS, request.config.getoption("--minutes") * 60 if long else None)
    print(tally.summary())
    assert not tally.failures, "\n\n".join(tally.failures)
    assert tally.replays > tally.calls // 5  # calls matched the program often, so the budget tests replay


def test_a_wrong_replay_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchtrace.compiler import segment

    monkeypatch.setattr(segment.Segment, "backward", lambda self, grads: tuple(None for _ in self.node.edges))
    tally = Tally()
    for seed in range(CI_SEED, CI_SEED + 6):
        run_program(seed, 12, tally)
    assert tally.failures and "compiled differs from eager" in tally.failures[0]
