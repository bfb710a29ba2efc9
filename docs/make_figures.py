"""Regenerate the figures under docs/: python docs/make_figures.py (needs Graphviz's dot)."""
import os

import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.demo import load_digits, small_cnn
from torchtrace.inspect.dot import Drawing

HERE = os.path.dirname(os.path.abspath(__file__))


def render(graph: Drawing, name: str, *formats: str) -> None:
    for kind in formats:
        graph.render(os.path.join(HERE, name), format=kind, cleanup=True)


def micrograd_figures() -> None:
    """micrograd's L = (a*b + c) * f with every value and gradient, and x used three times in (x*x + x).sum()."""
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    with tt.recording():
        e = a * b
        d = e + c
        L = d * f
    L.backward()
    render(tt.draw(L, dict(a=a, b=b, c=c, f=f, e=e, d=d, L=L)), "micrograd_values", "svg", "png")
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with tt.recording():
        y = (x * x + x).sum()
        y.backward()
    render(tt.draw(y, {"x": x}), "gradient_sum", "svg", "png")


def main() -> None:
    micrograd_figures()
    torch.manual_seed(0)
    images, labels, _, _ = load_digits()
    model = small_cnn()
    with tt.recording():
        loss = F.cross_entropy(model(images[:8]), labels[:8])
        render(tt.draw(loss, params=model), "small_cnn_forward", "svg")
        loss.backward()
    render(tt.draw(loss, params=model), "small_cnn_gradient_flow", "svg", "png")


if __name__ == "__main__":
    main()
