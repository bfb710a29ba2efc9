import os
import sys

import pytest
import torch
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# The tests run thousands of tiny ops: one torch thread is faster and steadier than two fighting over 2 cores.
torch.set_num_threads(1)

# Property tests draw the same examples on every run, so CI is reproducible (set HYPOTHESIS_PROFILE=explore
# to search new examples locally).
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="test_opinfo: run every OpInfo sample, not the first two")
    parser.addoption("--long", action="store_true", help="fuzz: run for --minutes")
    parser.addoption("--minutes", type=float, default=5.0, help="fuzz --long: how long")


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory):
    """The documentation site, built once for every test that reads it (tests/docs_site.py)."""
    from docs_site import build

    return build(tmp_path_factory.mktemp("site"))


@pytest.fixture(autouse=True)
def default_dtype_left_as_found(request):
    """A test that changes torch's default dtype and does not put it back fails (every later test would run in it)."""
    dtype = torch.get_default_dtype()
    yield
    if torch.get_default_dtype() != dtype:
        torch.set_default_dtype(dtype)
        pytest.fail(f"{request.node.nodeid} left torch's default dtype changed: put it back when done")
