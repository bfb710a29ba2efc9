"""torchtrace: an educational autograd engine built on a torch.Tensor subclass."""
from setuptools import find_packages, setup

VIZ = ["graphviz", "matplotlib"]
EXAMPLES = VIZ + ["tqdm", "scikit-learn", "gymnasium"]
NOTEBOOKS = EXAMPLES + ["jupyterlab", "ipykernel"]  # pip install -e ".[notebooks]" && jupyter lab examples/notebooks
NOTEBOOKS += ["anywidget"]  # tt.explore's player in Jupyter
BENCH = ["micrograd"]  # bench/vs_micrograd.py
TEST = EXAMPLES + ["pytest", "hypothesis", "ruff", "nbclient", "nbformat", "ipykernel", "expecttest"]
TEST += ["anywidget", "selenium"]  # tt.explore's widget; its page in headless Chromium

setup(
    name="torchtrace",
    version="0.1.0",
    description="An educational autograd engine: hand-written gradient rules recorded on a torch.Tensor subclass",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torchtrace", "torchtrace.*"]),
    package_data={"torchtrace.inspect.explore": ["player.js", "player.css"]},
    python_requires=">=3.9",
    install_requires=["torch", "numpy"],  # torch's version is pinned in constraints.txt (pip install -c ...)
    extras_require={"viz": VIZ, "examples": EXAMPLES, "notebooks": NOTEBOOKS, "bench": BENCH, "test": TEST},
    entry_points={"console_scripts": ["torchtrace=torchtrace.__main__:main"]},
)
