"""Regenerate the figures under docs/: python docs/make_figures.py (needs Graphviz's dot)."""
import os

import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.demo import load_digits, small_cnn

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    torch.manual_seed(0)
    images, labels, _, _ = load_digits()
    model = small_cnn()
    with tt.recording():
        loss = F.cross_entropy(model(images[:8]), labels[:8])
        tt.draw(loss, params=model).render(os.path.join(HERE, "small_cnn_forward"), format="svg", cleanup=True)
        loss.backward()
    tt.draw(loss, params=model).render(os.path.join(HERE, "small_cnn_gradient_flow"), format="svg", cleanup=True)
    tt.draw(loss, params=model).render(os.path.join(HERE, "small_cnn_gradient_flow"), format="png", cleanup=True)


if __name__ == "__main__":
    main()
