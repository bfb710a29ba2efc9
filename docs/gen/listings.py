"""Code listings of torchtrace's output shown in README.md, made by running torchtrace (never typed by hand).

In the README a generated listing is the fenced block right after a `<!-- listing: NAME -->` line; NAME is a function
of this module, which returns the block's text. `python examples/notebooks/refresh.py` rewrites them (with the
notebooks); tests/test_readme.py fails while one differs from what its function returns now.
"""
import importlib.util
import io
import re
from collections import OrderedDict
from contextlib import redirect_stdout
from pathlib import Path
from typing import Callable, Dict, List

import torch

import torchtrace as tt

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_MARKED = re.compile(r"(<!-- listing: (\w+) -->\n```\w*\n)(.*?)(```)", re.S)


def mlp_backward_code() -> str:
    """The backward function `to_code` writes for a 2-3-1 tanh MLP (fc1, act, fc2) with an MSE loss."""
    torch.manual_seed(0)
    model = tt.nn.Sequential(OrderedDict(fc1=tt.nn.Linear(2, 3), act=tt.nn.Tanh(), fc2=tt.nn.Linear(3, 1)))
    x, target = torch.randn(4, 2), torch.randn(4, 1)

    def step(x, target):
        return torch.nn.functional.mse_loss(model(x), target)

    code = tt.trace(step, x, target).to_code()
    return "def backward" + code.split("def backward", 1)[1].rstrip() + "\n"


def original_snippet_output() -> str:
    """What examples/snippet_c_conv_trace.py (the original torchtrace's third README snippet) prints."""
    spec = importlib.util.spec_from_file_location("snippet_c", ROOT / "examples" / "snippet_c_conv_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with redirect_stdout(printed):
        module.main([])
    return printed.getvalue()


LISTINGS: Dict[str, Callable[[], str]] = {"mlp_backward_code": mlp_backward_code,
                                          "original_snippet_output": original_snippet_output}


def marked(text: str) -> List[str]:
    """The names of the generated listings in `text`, in order."""
    return [m.group(2) for m in _MARKED.finditer(text)]


def shown(text: str, name: str) -> str:
    """The text of listing `name` as `text` shows it."""
    return next(m.group(3) for m in _MARKED.finditer(text) if m.group(2) == name)


def regenerated(text: str) -> str:
    """`text` with every marked listing replaced by what its function returns now."""
    return _MARKED.sub(lambda m: m.group(1) + LISTINGS[m.group(2)]() + m.group(4), text)


def refresh_readme() -> bool:
    """Rewrite README.md's generated listings; True when one changed."""
    text = README.read_text(encoding="utf-8")
    new = regenerated(text)
    if new != text:
        README.write_text(new, encoding="utf-8")
    return new != text
