"""Docs site: tt.explore player pages, saved at build time from two small examples (docs/player.md links them)."""
import pathlib
import tempfile

import mkdocs_gen_files
import torch

import torchtrace as tt
from torchtrace.inspect.explore import Exploration


def micrograd_expression() -> Exploration:
    """micrograd's first example: L = (a*b + c) * f, every step checked by finite differences."""
    with tt.recording():  # keeps each op's inputs, so each step can be checked numerically
        a, b = tt.tracer(2.0, requires_grad=True), tt.tracer(-3.0, requires_grad=True)
        c, f = tt.tracer(10.0, requires_grad=True), tt.tracer(-2.0, requires_grad=True)
        e = a * b
        d = e + c
        L = d * f
    return tt.explore(L, params={"a": a, "b": b, "c": c, "f": f})


def ported_mlp() -> Exploration:
    """A torch MLP, ported unchanged, and its cross-entropy loss on a small batch: parameters by their names."""
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)))
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 0, 1])
    return tt.explore(torch.nn.functional.cross_entropy(model(x), y))


# Each page opens with a way back to the site (relative links: they work from a server and from the files alike).
BACK = ('<nav class="torchtrace-docs-link" style="font: 14px sans-serif; margin: 8px 12px">'
        '<a href="index.html">&larr; Step through a backward</a> &middot; <a href="../index.html">torchtrace docs</a>'
        '</nav>')


def with_link_back(page: str) -> str:
    """The saved player page with the site's links right after <body>."""
    head, body, rest = page.partition("<body>")
    assert body, "a saved player page has a <body>"
    return f"{head}{body}\n{BACK}{rest}"


for name, make in {"micrograd": micrograd_expression, "mlp": ported_mlp}.items():
    with tempfile.TemporaryDirectory() as folder:
        saved = make().save(pathlib.Path(folder) / f"{name}.html")
        with mkdocs_gen_files.open(f"player/{name}.html", "w") as out:
            out.write(with_link_back(pathlib.Path(saved).read_text(encoding="utf-8")))
