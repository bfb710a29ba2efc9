"""torchtrace installs as a package, not only from the source tree: `pip wheel` builds a wheel holding every file of
the package, and both the wheel and `pip install .` (non-editable) give a fresh virtual environment a torchtrace
that imports and back-propagates. The environments reuse this Python's torch (--system-site-packages)."""
import os
import pathlib
import shutil
import site
import subprocess
import sys
import venv
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOKE = """
import pathlib, sys, torch, torchtrace as tt
assert pathlib.Path(tt.__file__).resolve().is_relative_to(pathlib.Path(sys.prefix).resolve()), tt.__file__
x = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
(x * x).sum().backward()
assert torch.equal(x.grad, torch.tensor([2.0, 4.0, 6.0]))
assert tt.nn.parallel.DistributedDataParallel and tt.optim.StepLR is torch.optim.lr_scheduler.StepLR
print("ok", tt.__file__)
"""


def run(*command: str, cwd: pathlib.Path) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> pathlib.Path:
    """A copy of the source tree without build outputs (building writes into the tree it builds)."""
    copy = tmp_path_factory.mktemp("src") / "torchtrace-src"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "site", "build", "dist", "*.egg-info",
                                                               "__pycache__", ".venv", ".pytest_cache", ".ruff_cache",
                                                               ".hypothesis"))
    return copy


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source),
        cwd=out)
    (built,) = out.glob("torchtrace-*.whl")
    return built


def fresh_python(where: pathlib.Path) -> str:
    """A new environment that sees this Python's packages (torch) after its own, also when this Python runs in a
    virtual environment itself (whose packages --system-site-packages alone would not reach)."""
    venv.create(where, system_site_packages=True, with_pip=False)
    python = str(where / "bin" / "python")
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (pathlib.Path(own) / "outer-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_the_wheel_holds_every_file_of_the_package(source, wheel):
    package = source / "torchtrace"
    files = {path.relative_to(source).as_posix() for path in package.rglob("*")
             if path.is_file() and "__pycache__" not in path.parts}
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.startswith("torchtrace/")}
        metadata = next(archive.read(name).decode() for name in archive.namelist() if name.endswith("/METADATA"))
    assert files - packed == set()
    assert "Requires-Python: >=3.10" in metadata and "Provides-Extra: docs" in metadata
    core = {line.split(":", 1)[1].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert core == {"torch", "numpy", "graphviz"}  # tt.draw's package is core; its `dot` program stays optional


@pytest.mark.parametrize("how", ["wheel", "source directory"])
def test_installs_into_a_fresh_environment_and_back_propagates(how, source, wheel, tmp_path):
    python = fresh_python(tmp_path / "env")
    target = str(wheel) if how == "wheel" else str(source)
    run(python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", target, cwd=tmp_path)
    assert run(python, "-c", SMOKE, cwd=tmp_path).startswith("ok")


def test_imports_and_back_propagates_on_a_torch_without_a_newer_function():
    """A torch release older than the pin lacks some callables torchtrace has rules for (F.linear_cross_entropy):
    torchtrace still imports, registers no rule for what is missing, and differentiates the rest."""
    program = ("import torch.nn.functional as F; del F.linear_cross_entropy\n"
               "import torch, torchtrace as tt\n"
               "x = tt.as_tracer(torch.tensor([1.0, 2.0]), requires_grad=True)\n"
               "F.cross_entropy(x[None], torch.tensor([1])).backward()\n"
               "expected = torch.softmax(torch.tensor([1.0, 2.0]), 0) - torch.tensor([0.0, 1.0])\n"
               "assert torch.allclose(x.grad, expected), x.grad\n"
               "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
