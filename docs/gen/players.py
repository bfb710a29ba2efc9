"""Docs site: tt.explore player pages, saved at build time from two small examples (docs/player.md links them)."""
import pathlib
import tempfile

import mkdocs_gen_files
import torch

import torchtrace as tt
from torchtrace.inspect.explore import Explorer


def micrograd_expression() -> Explorer:
    """micrograd's first example: L = (a*b + c) * f, every value shown and every step checked by finite differences
    (the function form runs the forward itself, holding every value and each op's inputs)."""
    def expression(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        e = a * b
        d = e + c
        return d * f
    return tt.explore(expression, *(torch.tensor(v) for v in (2.0, -3.0, 10.0, -2.0)))


class Block(torch.nn.Module):
    """x + fc2(relu(fc1(norm(x))))"""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = torch.nn.LayerNorm(n), torch.nn.Linear(n, 2 * n), torch.nn.Linear(2 * n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def residual_mlp() -> Explorer:
    """25 residual blocks, ported from torch: a graph large enough to start collapsed by module."""
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), *[Block(8) for _ in range(25)], torch.nn.Linear(8, 1)))
    return tt.explore(model(torch.randn(5, 4)).pow(2).mean())


def ported_mlp() -> Explorer:
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


for name, make in {"micrograd": micrograd_expression, "mlp": ported_mlp, "residual": residual_mlp}.items():
    with tempfile.TemporaryDirectory() as folder:
        saved = make().save(pathlib.Path(folder) / f"{name}.html")
        with mkdocs_gen_files.open(f"player/{name}.html", "w") as out:
            out.write(with_link_back(pathlib.Path(saved).read_text(encoding="utf-8")))
