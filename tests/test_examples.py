"""Every example script runs in its smoke mode (few steps, small data), with assertions on its results."""
import math
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
from helpers import EXAMPLES, ORIGINAL_SNIPPET_C_MODEL, ORIGINAL_SNIPPET_C_TRACE, load_example

from torchtrace.autograd.function import RULES

load = load_example


@pytest.fixture(autouse=True)
def isolated():
    """Examples set the thread count and register rules: give both back to the rest of the test session."""
    threads, rules = torch.get_num_threads(), dict(RULES)
    yield
    torch.set_num_threads(threads)
    RULES.clear()
    RULES.update(rules)


def test_snippet_a_prints_a_gradient_of_ones(capsys):
    grad = load("snippet_a_tracer_sum").main([])
    assert torch.equal(grad, torch.ones(4))
    assert capsys.readouterr().out.strip() == "tensor([1., 1., 1., 1.])"


def test_snippet_a_runs_as_a_script():
    done = subprocess.run([sys.executable, str(EXAMPLES / "snippet_a_tracer_sum.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tensor([1., 1., 1., 1.])"


def test_snippet_b_prints_the_model_and_trains(capsys):
    losses = load("snippet_b_mlp_rmsprop").main([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:9] == [
        "Sequence(",
        "    (0):Linear layer (8 X 256)",
        "    (1):ReLU()",
        "    (2):Linear layer (256 X 128)",
        "    (3):ReLU()",
        "    (4):Linear layer (128 X 64)",
        "    (5):ReLU()",
        "    (6):Linear layer (64 X 4)",
        ")",
    ]
    assert len(lines) == 19 and all(re.fullmatch(r"tracer\(\d+\.\d{4}, grad_fn=<\w+>\)", line) for line in lines[9:])
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]


def test_snippet_c_prints_the_original_model_and_backprop_trace(capsys):
    model, out = load("snippet_c_conv_trace").main([])
    expected = f"{ORIGINAL_SNIPPET_C_MODEL}\n{ORIGINAL_SNIPPET_C_TRACE}\n"
    assert capsys.readouterr().out == expected
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    assert out.grad_fn is not None and out.shape == ()


def test_digits_cnn_learns_and_matches_torch_autograd(capsys):
    result = load("digits_cnn").main(["--smoke"])
    out = capsys.readouterr().out
    assert len(result["losses"]) == 3 and result["losses"][-1] < result["losses"][0]
    assert result["max_loss_difference"] < 1e-5
    assert all(abs(a - b) < 1e-5 for a, b in zip(result["losses"], result["torch_losses"]))
    assert result["test_accuracy"] > 0.8  # chance is 0.1; the full run reaches ~0.98
    assert abs(result["test_accuracy"] - result["torch_test_accuracy"]) < 0.01
    assert result["time_ratio"] > 0 and "ratio" in out and "Conv2d 1 -> 16" in out


def test_char_gpt_loss_falls_and_samples_use_the_vocabulary(capsys):
    result = load("char_gpt").main(["--smoke"])
    out = capsys.readouterr().out
    assert result["text"].startswith("The Zen of Python")
    assert all(math.isfinite(v) for v in result["losses"])
    assert result["losses"][-1] < 0.75 * result["losses"][0]
    for sample in (result["sample_before"], result["sample_after"]):
        assert len(sample) == 61 and set(sample) <= set(result["text"])
    assert "--- sample before training ---" in out and "--- sample after training ---" in out


def test_char_gpt_trains_on_a_given_text(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("abcd efgh " * 20, encoding="utf-8")
    result = load("char_gpt").main(["--smoke", "--text", str(text), "--steps", "5"])
    assert result["vocab_size"] == 9 and len(result["losses"]) == 5


def test_dqn_cartpole_smoke_updates_through_gather(capsys):
    result = load("dqn_cartpole").main(["--smoke"])
    out = capsys.readouterr().out
    assert "↘︎ Gather()" in out and "↘︎ SmoothL1Loss()" in out  # the first update's backprop trace
    assert result["steps"] == 400 and len(result["losses"]) == 301
    assert all(math.isfinite(v) for v in result["losses"])
    assert len(result["eval_returns"]) == 5 and all(r >= 8 for r in result["eval_returns"])
    assert result["average_return"] == sum(result["eval_returns"]) / 5


def test_custom_function_rule_is_checked(capsys):
    result = load("custom_function").main([])
    assert result["refusal"].startswith("torch.special.bessel_j0: torchtrace has no gradient rule")  # a real refusal
    assert "First diverging node: BuggyLogAddExpBackward" in result["bug_report"]
    assert result["check"].ok and result["check"].n_gradients == 2
    assert result["gradcheck"] is True
    assert result["second_derivative_error"] < 1e-5
    assert "LogAddExp()" in capsys.readouterr().out


def test_dqn_cartpole_is_repeatable_and_summarises_seeds(capsys):
    first = load("dqn_cartpole").main(["--smoke", "--max-steps", "250"])
    result = load("dqn_cartpole").main(["--smoke", "--max-steps", "250", "--seeds", "0", "1"])
    out = capsys.readouterr().out
    assert "gymnasium" in out and "thread(s), seed 1" in out  # what a result depends on is printed
    assert result["runs"][0]["losses"] == first["losses"]  # the same seed gives the same run, bit for bit
    assert result["runs"][1]["losses"] != first["losses"]
    assert result["average_returns"] == [run["average_return"] for run in result["runs"]]
    assert f"mean {sum(result['average_returns']) / 2:.1f}" in out


def test_ddp_digits_runs_on_two_processes_with_torchrun():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = str(port.getsockname()[1])
    port.close()
    root = str(EXAMPLES.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free}", str(EXAMPLES / "ddp_digits.py"), "--smoke"]  # what torchrun runs
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.count("all-reduce bucket") == 5 and "↘︎ Conv2d 1 -> 16" in out  # the first step's trace, rank 0 only
    difference = float(re.search(r"torch autograd full-batch gradient\| = (\S+)", out).group(1))
    assert difference < 1e-6
    losses = [float(v) for v in re.findall(r"mean training loss (\S+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert "replicas identical after training: True" in out
    assert float(re.search(r"test accuracy: (\S+)%", out).group(1)) > 20  # chance is 10%
