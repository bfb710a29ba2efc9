"""tt.flow: after a backward, how much gradient reached each parameter — a table and the classic bar plot.

    report = tt.flow(model)          # rows: name, shape, |grad|, mean |g|, max |g|, |grad| / |weight|, flag
    print(report)                    # a fixed-width table (Jupyter shows an HTML table)
    report.plot("grad_flow.png")     # max and mean |grad| per layer, log scale

Flags: "no grad" (no backward reached it), "non-finite" (nan or inf), "zero", "vanishing" (gradient
norm below `vanishing`), "exploding" (gradient norm above `exploding`). A gradient that is zero or tiny *by
construction* — a bias right before a batch norm, which subtracts the per-channel mean and so removes it, or the
bias of an attention's key projection, which adds a constant to each row of scores that softmax ignores — is
flagged "zero by construction" instead: nothing to fix in training, the bias is useless (bias=False). Given a
module, this is decided from its structure (the graph may be freed); given the loss too (`tt.flow(model, loss)`),
also from the recorded graph.
"""
import functools
import html
import io
import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.plain import plain_torch
from torchtrace.inspect.construction import zero_leaves
from torchtrace.inspect.names import PARAMS_KINDS, named_pairs
from torchtrace.inspect.zeros_by_structure import zero_by_structure

Named = Union[torch.nn.Module, Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]], Iterable[torch.Tensor]]
FLAG_COLOURS = {"vanishing": "#fde2e2", "zero": "#fde2e2", "exploding": "#ffe8c2", "non-finite": "#ffd0d0",
                "no grad": "#eeeeee", "zero by construction": "#e8eef8"}
BY_CONSTRUCTION = "zero by construction"


@dataclass
class FlowRow:
    """The gradient statistics of one parameter (None where it has no gradient)."""

    name: str
    shape: Tuple[int, ...]
    grad_norm: Optional[float]
    mean_abs: Optional[float]
    max_abs: Optional[float]
    ratio: Optional[float]  # |grad| / |weight|: the relative size of an SGD step at lr=1
    flag: str  # "" when nothing is wrong


def _named(params: Named) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters())
    if params is None:
        raise TypeError(f"tt.flow takes the parameters whose gradients to tabulate: {PARAMS_KINDS}, not None")
    return named_pairs("tt.flow", params)


def _row(name: str, param: torch.Tensor, vanishing: float, exploding: float) -> FlowRow:
    grad = param.grad
    shape = tuple(param.shape)
    if grad is None:
        return FlowRow(name, shape, None, None, None, None, "no grad")
    with plain_torch():  # plain tensor arithmetic: nothing is recorded, even on tracers
        g = grad.detach().double()
        size = g.abs()
        norm = g.norm().item()
        mean_abs = size.mean().item() if g.numel() else 0.0
        max_abs = size.max().item() if g.numel() else 0.0
        weight_norm = param.detach().double().norm().item()
    ratio = norm / weight_norm if weight_norm > 0 else None
    if not math.isfinite(norm):
        flag = "non-finite"
    elif norm == 0:
        flag = "zero"
    elif norm < vanishing:
        flag = "vanishing"
    elif norm > exploding:
        flag = "exploding"
    else:
        flag = ""
    return FlowRow(name, shape, norm, mean_abs, max_abs, ratio, flag)


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2e}"


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


@functools.lru_cache(maxsize=None)
def _figure_class() -> type:
    """matplotlib loads on first use only."""
    from matplotlib.figure import Figure

    class FlowFigure(Figure):
        """A pyplot figure that Jupyter shows once, whether it is the cell's result or just left open."""

        def _ipython_display_(self) -> None:
            import matplotlib.pyplot as plt
            from IPython.display import Image, display

            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            display(Image(buffer.getvalue()))
            plt.close(self)  # shown: the notebook backend must not show it again at the end of the cell

    return FlowFigure


class Flow:
    """The per-parameter gradient table that tt.flow returns; iterate it for FlowRows."""

    columns = ("parameter", "shape", "|grad|", "mean |g|", "max |g|", "|g|/|w|", "flag")

    def __init__(self, rows: List[FlowRow], vanishing: float, exploding: float) -> None:
        self.rows, self.vanishing, self.exploding = rows, vanishing, exploding

    def __iter__(self) -> Iterator[FlowRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: Union[int, str]) -> FlowRow:
        if isinstance(key, str):
            for row in self.rows:
                if row.name == key:
                    return row
            raise KeyError(f"no parameter named {key!r}")
        return self.rows[key]

    @property
    def flagged(self) -> List[str]:
        """Names of the parameters with any flag."""
        return [row.name for row in self.rows if row.flag]

    def with_flag(self, flag: str) -> List[str]:
        """Names of the parameters flagged `flag` ("vanishing", "exploding", "zero", "non-finite", "no grad")."""
        return [row.name for row in self.rows if row.flag == flag]

    def _cells(self, row: FlowRow) -> List[str]:
        return [row.name, _shape(row.shape), _fmt(row.grad_norm), _fmt(row.mean_abs), _fmt(row.max_abs),
                _fmt(row.ratio), row.flag]

    def summary(self) -> str:
        """One line: how many parameters carry each flag, and the thresholds."""
        counts = {}
        for row in self.rows:
            if row.flag:
                counts[row.flag] = counts.get(row.flag, 0) + 1
        found = ", ".join(f"{n} {flag}" for flag, n in counts.items()) or "no flags"
        return (f"{len(self.rows)} parameters: {found} "
                f"(vanishing: |grad| < {self.vanishing:g}, exploding: |grad| > {self.exploding:g})")

    def __str__(self) -> str:
        table = [list(self.columns)] + [self._cells(row) for row in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(self.columns))]
        lines = []
        for n, line in enumerate(table):
            text = "  ".join(cell.ljust(w) if i in (0, 1, 6) else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(line, widths)))
            lines.append(text.rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append(self.summary())
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for row in self.rows:
            style = f' style="background-color:{FLAG_COLOURS[row.flag]}"' if row.flag in FLAG_COLOURS else ""
            cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in self._cells(row))
            body.append(f"<tr{style}>{cells}</tr>")
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
                f"<p>{html.escape(self.summary())}</p>")

    def plot(self, path: Optional[str] = None, include_bias: bool = False) -> Any:
        """The classic gradient-flow picture: max and mean |grad| per layer (log scale), as a Figure.

        Biases are left out unless include_bias; parameters without a gradient are not drawn, and
        flagged ones get red tick labels. Saves a PNG (or any format matplotlib knows from the
        suffix) when `path` is given. The figure is pyplot's current figure, so `plt.savefig(...)`,
        `plt.show()` and `fig.savefig(...)` all work, and Jupyter shows it once.
        """
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r.grad_norm is not None and (include_bias or not r.name.endswith("bias"))]
        positive = [v for r in rows for v in (r.mean_abs, r.max_abs) if v and math.isfinite(v)]
        floor = min(positive) / 10 if positive else 1e-12
        figure = plt.figure(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.5), FigureClass=_figure_class())
        ax = figure.add_subplot()
        xs = range(len(rows))

        def heights(values: List[Optional[float]]) -> List[float]:
            return [v if v and math.isfinite(v) else floor for v in values]

        ax.bar(xs, heights([r.max_abs for r in rows]), width=0.8, alpha=0.35, color="c", label="max |grad|")
        ax.bar(xs, heights([r.mean_abs for r in rows]), width=0.8, alpha=0.8, color="b", label="mean |grad|")
        ax.set_yscale("log")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r.name for r in rows], rotation=90, fontsize=8)
        for tick, row in zip(ax.get_xticklabels(), rows):
            if row.flag:
                tick.set_color("red")
        ax.set_xlim(-1, len(rows))
        ax.set_ylim(bottom=floor)
        ax.set_ylabel("|grad| (log scale)")
        biases = 0 if include_bias else sum(r.name.endswith("bias") for r in self.rows)
        no_grad = sum(r.grad_norm is None for r in self.rows)
        left_out = [note for note, n in (("biases", biases), ("without grad", no_grad)) if n]
        ax.set_title("Gradient flow" + (f" ({', '.join(left_out)} not shown)" if left_out else ""))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="best")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path, dpi=100)
        return figure


def flow(params: Named, output: Optional[torch.Tensor] = None, vanishing: float = 1e-7,
         exploding: float = 1e3) -> Flow:
    """Per-parameter gradient statistics after a backward: |grad| (2-norm), mean |grad|, max |grad|,
    |grad| / |weight|, and a flag ("no grad", "non-finite", "zero", "vanishing", "exploding").

    `params`: a torch.nn.Module (its named_parameters), a dict name -> tensor, (name, tensor) pairs,
    or plain tensors (named param0, param1, ...). The flags compare the gradient norm with
    `vanishing` and `exploding`. `output` (the loss the backward ran from) lets the table tell a gradient
    that is zero by construction (a bias before a batch norm) from a vanishing one.
    """
    if output is not None and getattr(output, "_tt_node", None) is None:
        raise ValueError("tt.flow: output must be the loss tracer the backward ran from (one with a grad_fn), not "
                         f"{type(output).__name__}{' without one' if isinstance(output, torch.Tensor) else ''}")
    if not 0 <= vanishing < exploding:
        raise ValueError(f"tt.flow: needs 0 <= vanishing < exploding, not vanishing={vanishing}, exploding={exploding}")
    rows = [_row(name, p, vanishing, exploding) for name, p in _named(params)]
    structural = set(zero_by_structure(params)) if isinstance(params, torch.nn.Module) else set()
    if output is not None and getattr(output, "_tt_node", None) is not None:
        structural |= set(zero_leaves(topological_order([output._tt_node])))
    ids = {name: id(p) for name, p in _named(params)}
    for row in rows:
        if row.flag in ("zero", "vanishing", "") and ids[row.name] in structural:
            row.flag = BY_CONSTRUCTION
    return Flow(rows, vanishing, exploding)
