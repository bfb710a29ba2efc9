"""python -m torchtrace demo / ops: the tour runs, learns, and its numbers agree with torch autograd."""
import os
import re
import shutil
import subprocess
import sys

from torchtrace.demo import run


def test_demo_tour(tmp_path, capsys):
    result = run(epochs=6, out_dir=str(tmp_path))
    printed = capsys.readouterr().out
    assert result["accuracy"] >= 0.95
    assert result["max_abs_diff"] < 1e-4
    assert "Sequence(\n    (0):Conv2d 1 -> 8" in printed
    assert "↘︎ Conv2d 1 -> 8   GRAD:torch.Size([32, 8, 8, 8]) -> torch.Size([32, 1, 8, 8])" in printed
    assert "match torch autograd" in printed
    svg = (tmp_path / "torchtrace-demo-graph.svg").read_text()
    assert svg.count('class="node"') >= 10
    assert printed.index("BackProp:") < printed.index("graph drawn to")  # drawn after the backward...
    assert svg.count(">|grad| ") >= 8  # ...so the arrows carry the gradients that flowed
    width = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
    assert width < 800, f"{width} pt: a graph drawn before backward is a wide staircase"


def test_without_dot_the_demo_says_what_to_install_and_leaves_nothing_where_it_runs(tmp_path, monkeypatch, capsys):
    here = tmp_path / "clone"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # Graphviz's `dot` is not on PATH
    run(epochs=1)
    printed = capsys.readouterr().out
    assert "Graphviz's `dot` program was not found" in printed and "apt-get install graphviz" in printed
    source = re.search(r"The DOT source was written to (\S+)\.\n", printed).group(1)
    assert os.path.isfile(source) and not source.startswith(str(here)), source  # a temporary folder, named
    shutil.rmtree(os.path.dirname(source))
    assert list(here.iterdir()) == []


def test_ops_listing_groups_rules_by_family():
    listing = subprocess.run([sys.executable, "-m", "torchtrace", "ops"], capture_output=True, text=True, check=True)
    assert "pointwise (" in listing.stdout and "    torch.exp" in listing.stdout
    assert int(listing.stdout.strip().splitlines()[-1].split()[-1]) >= 150


def test_training_leaves_one_progress_line_per_epoch_with_its_loss():
    import functools
    import io

    import torch
    from tqdm import tqdm

    from torchtrace.demo import load_digits, small_cnn, train

    torch.manual_seed(0)
    images, labels, _, _ = load_digits()
    stream = io.StringIO()
    means = train(small_cnn(), images[:128], labels[:128], epochs=2, progress=functools.partial(tqdm, file=stream))
    finished = [line.split("\r")[-1] for line in stream.getvalue().split("\n")[:-1]]  # what stays on screen
    assert [line.split(":")[0] for line in finished] == ["epoch 1/2", "epoch 2/2"]  # one line kept per epoch
    assert [line.rsplit("loss ", 1)[1].rstrip("]") for line in finished] == [f"{m:.4f}" for m in means]
