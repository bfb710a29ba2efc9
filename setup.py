"""torchtrace: an educational autograd engine built on a torch.Tensor subclass."""
from setuptools import find_packages, setup

VIZ = ["graphviz", "matplotlib"]
EXAMPLES = VIZ + ["tqdm", "scikit-learn", "gymnasium"]
NOTEBOOKS = EXAMPLES + ["jupyterlab", "ipykernel"]  # pip install -e ".[notebooks]" && jupyter lab examples/notebooks
BENCH = ["micrograd"]  # bench/vs_micrograd.py
TEST = EXAMPLES + ["pytest", "hypothesis", "ruff", "nbclient", "nbformat", "ipykernel", "expecttest"]

setup(
    name="torchtrace",
    version="0.1.0",
    description="An educational autograd engine: hand-written gradient rules recorded on a torch.Tensor subclass",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torchtrace", "torchtrace.*"]),
    python_requires=">=3.10",  # torch 2.13 supports CPython 3.10-3.14
    classifiers=["Programming Language :: Python :: 3", *(f"Programming Language :: Python :: 3.{minor}"
                                                          for minor in range(10, 15))],
    install_requires=["torch", "numpy"],  # torch's version is pinned in constraints.txt (pip install -c ...)
    extras_require={"viz": VIZ, "examples": EXAMPLES, "notebooks": NOTEBOOKS, "bench": BENCH, "test": TEST},
    entry_points={"console_scripts": ["torchtrace=torchtrace.__main__:main"]},
)
