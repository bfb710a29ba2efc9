"""python -m torchtrace diagnose script.py: a training script run as python runs it, its backward passes diagnosed."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import torch
import torchtrace as tt

torch.manual_seed(0)
model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))
optimizer = tt.optim.SGD(model.parameters(), lr={lr})
x, y = tt.randn(32, 4), torch.randint(0, 3, (32,))
for step in range(int(sys.argv[1])):
    optimizer.zero_grad()
    logits = model(x)
    {loss}
    loss.backward()
    optimizer.step()
print("trained", step + 1)
"""


def run(tmp_path, loss, *args, lr=0.1):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(loss=loss, lr=lr)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "torchtrace", "diagnose", *args, str(path), "5"], capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_healthy_script_runs_to_the_end_with_no_finding(tmp_path):
    result = run(tmp_path, "loss = torch.nn.functional.cross_entropy(logits, y)")
    assert result.returncode == 0, result.stderr
    assert "trained 5" in result.stdout
    assert "5 backward passes diagnosed, 0 distinct findings" in result.stdout


def test_a_log_of_zero_in_the_script_is_named_at_its_line_once(tmp_path):
    loss = "loss = -(logits * 1000).softmax(-1).gather(1, y[:, None]).log().mean()"
    result = run(tmp_path, loss, "--steps", "3")
    assert result.returncode == 1, result.stderr
    line = textwrap.dedent(SCRIPT.format(loss=loss, lr=0.1)).splitlines().index(f"    {loss}") + 1
    assert f"tt.diagnose, backward 1: [nonfinite, forward] Log at train.py:{line}" in result.stdout
    assert result.stdout.count("[nonfinite, forward] Log") == 1
    assert "3 backward passes diagnosed" in result.stdout and "trained 5" in result.stdout


def test_the_subcommand_has_its_own_help():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    text = subprocess.run([sys.executable, "-m", "torchtrace", "diagnose", "--help"], capture_output=True, text=True,
                          env=env, timeout=120).stdout
    assert "--steps" in text and "script" in text


def test_a_learning_rate_that_blows_up_is_named_with_the_first_step(tmp_path):
    result = run(tmp_path, "loss = torch.nn.functional.cross_entropy(logits, y)", lr=20)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "[exploding, training]" in out and "the learning rate lr=20 of SGD is too large: at optimizer step 1 " in out
    ratio = float(out.split("the update was ")[1].split(" ")[0])
    assert ratio > 0.1  # a healthy step changes the weights by about 1e-3 of their size
    assert "lower the learning rate" in out and out.count("[exploding, training]") == 1


def test_a_plain_torch_script_is_told_why_no_backward_was_diagnosed(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=20)
        x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
        for _ in range(5):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "torchtrace", "diagnose", str(path)], capture_output=True, text=True,
                         env=env, timeout=300).stdout
    assert "the learning rate lr=20 of SGD is too large" in out and "the loss went" not in out  # (no loss was seen)
    assert "0 backward passes diagnosed (no backward ran on tracers" in out and "tt.port(model)" in out
