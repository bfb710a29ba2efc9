import pytest
import torch


@pytest.fixture(autouse=True)
def seed():
    """Every op test starts from the same random state."""
    torch.manual_seed(0)
