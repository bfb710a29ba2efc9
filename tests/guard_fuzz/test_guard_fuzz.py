"""The guard fuzzer in CI: random programs, random changes between calls, compiled always equal to eager.

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
    assert tally.replays > tally.calls // 5  # generated code ran often, so the budget tests the guards


def test_a_stale_replay_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchtrace.compiler import compiled

    monkeypatch.setattr(compiled.Specialisation, "valid", lambda self: True)  # guards switched off
    tally = Tally()
    for seed in range(CI_SEED, CI_SEED + 6):
        run_program(seed, 12, tally)
    assert tally.failures and "compiled differs from eager" in tally.failures[0]
