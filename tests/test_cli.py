"""python -m torchtrace: subcommands with their own --help, public names only, quiet when the reader leaves."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchtrace as tt
from torchtrace.__main__ import main
from torchtrace.ops.listing import families, is_public

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "torchtrace", *args], capture_output=True, text=True, env=env,
                          timeout=120, **kwargs)


def test_each_subcommand_has_its_own_help_with_only_its_options():
    top = run_cli("--help").stdout
    assert "demo" in top and "ops" in top and "--epochs" not in top and "--coverage" not in top
    demo = run_cli("demo", "--help").stdout
    assert "--epochs" in demo and "--out-dir" in demo and "--coverage" not in demo
    ops = run_cli("ops", "--help").stdout
    assert "--coverage" in ops and "--only" in ops and "--epochs" not in ops


def test_an_option_of_the_other_subcommand_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["ops", "--epochs", "3"])
    assert "unrecognized arguments: --epochs 3" in capsys.readouterr().err


def test_ops_lists_public_names_only():
    assert is_public("torch.exp") and is_public("torch.Tensor.__add__") and is_public("torch.nn.functional.glu")
    assert not is_public("torch._C._nn.glu") and not is_public("torch._ops.aten.slice.Tensor")
    printed = run_cli("ops").stdout.splitlines()
    names = [line.strip() for line in printed if line.startswith("    ")]
    assert names and all(is_public(name) for name in names)
    assert "torch.exp" in names and "torch.nn.functional.linear" in names
    assert printed[-1] == f"total: {len(names)}" == f"total: {len(tt.supported_ops())}"
    assert names == [name for family in families().values() for name in family]


def test_ops_piped_into_a_reader_that_left_ends_without_a_traceback():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head`) is gone before the listing is written: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "torchtrace", "ops"], stdout=write_end, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    finally:
        os.close(write_end)
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr
    assert done.returncode == 0


@pytest.mark.parametrize("argv, message", [
    (["demo", "--epochs", "0"], "--epochs: must be at least 1"),
    (["diagnose", "--steps", "-1", "script.py"], "--steps: must be at least 1"),
    (["ops", "--coverage", "--samples", "0"], "--samples: must be at least 1"),
])
def test_a_count_below_one_is_refused(argv, message, capsys):
    """Each ran nothing and exited 0 ("Training -1 epochs", "0 backward passes diagnosed")."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_coverage_names_an_op_it_does_not_know():
    """`--only cov dropout` judged cov alone and said nothing of dropout (OpInfo names it nn.functional.dropout)."""
    with pytest.raises(SystemExit, match="no judged OpInfo entry is named dropout"):
        main(["ops", "--coverage", "--only", "cov", "dropout"])


def test_diagnose_names_a_missing_script():
    """It printed runpy's FileNotFoundError traceback."""
    with pytest.raises(SystemExit, match="no such script: /nonexistent/train.py"):
        main(["diagnose", "/nonexistent/train.py"])
