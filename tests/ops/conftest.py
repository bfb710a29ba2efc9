import pytest
import torch


@pytest.fixture(autouse=True)
def seed():
    """Every op test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture
def dispatched(monkeypatch):
    """The torch callables whose rule the dispatcher runs during the test (for 'every rule is exercised' tests)."""
    from helpers import callables_dispatched

    return callables_dispatched(monkeypatch)
