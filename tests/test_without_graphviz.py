"""`tt.recording()`, the trace and the step-through player need neither the graphviz Python package nor Graphviz's
`dot` program (only tt.draw's pictures do): run here with the package made unimportable and no `dot` on PATH."""
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import sys

class NoGraphviz:  # as on a machine where the graphviz package is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "graphviz":
            raise ModuleNotFoundError("No module named 'graphviz'", name="graphviz")

sys.meta_path.insert(0, NoGraphviz())
import torchtrace as tt

a, b = tt.tracer(2.0, requires_grad=True), tt.tracer(-3.0, requires_grad=True)
with tt.recording():
    L = (a * b + a) * b
tt.show(L, norms=True)
L.backward(show=True)
print("grads", a.grad.item(), b.grad.item())
with tt.recording():
    M = a * b
print("steps", len(tt.explore(M).steps))
try:
    import graphviz
except ModuleNotFoundError:
    print("graphviz: not importable")
"""


def test_recording_trace_and_player_without_the_graphviz_package_or_dot(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(tmp_path)}  # an empty PATH: no `dot`
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graphviz: not importable" in done.stdout
    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(-3.0, requires_grad=True)
    ((a * b + a) * b).backward()  # torch autograd: dL/da = (b + 1) b, dL/db = 2ab + a
    assert f"grads {a.grad.item()} {b.grad.item()}" in done.stdout
    assert "BackProp:" in done.stdout and "steps 3" in done.stdout
