"""torchtrace: an educational autograd engine built on a torch.Tensor subclass."""
from setuptools import find_packages, setup

VIZ = ["matplotlib"]  # tt.flow's plot; tt.draw's graphviz package is a core dependency (its `dot` program is optional)
EXAMPLES = VIZ + ["tqdm", "scikit-learn", "gymnasium"]
# pip install -e ".[notebooks]" && jupyter lab examples/notebooks (anywidget: tt.explore's player in Jupyter)
NOTEBOOKS = EXAMPLES + ["jupyterlab", "ipykernel", "anywidget"]
BENCH = ["micrograd"]  # bench/vs_micrograd.py
# mkdocs-jupyter below 0.27: 0.27 adds a MathJax loader fetched from a CDN to every page (the site renders its math
# with the vendored KaTeX and loads nothing from the network). mkdocs-material below 9.7.2, mkdocs-gen-files below
# 0.6.1 and mkdocs-literate-nav below 0.6.3: from those versions on, each prints a banner about MkDocs 2.0 (and what
# to switch to) on every build, so `mkdocs build --strict` would not be clean. On Python 3.10 the newest mkdocstrings
# is 1.0.6, which builds pymdown-extensions' highlighter without the `md` argument 12.2 made required (the build fails)
DOCS = ["mkdocs<2", "mkdocs-material<9.7.2", "pymdown-extensions<12.2; python_version < '3.11'",
        "pymdown-extensions; python_version >= '3.11'", "mkdocstrings[python]", "mkdocs-jupyter<0.27",
        "mkdocs-gen-files<0.6.1",
        "mkdocs-literate-nav<0.6.3"]  # pip install -e ".[docs]" && mkdocs serve
# the tests also build the docs site strictly, run tt.explore's widget and drive its page in headless Chromium
TEST = EXAMPLES + DOCS + ["pytest", "hypothesis", "ruff", "nbclient", "nbformat", "ipykernel", "expecttest",
                          "anywidget", "selenium"]

setup(
    name="torchtrace",
    version="0.1.0",
    description="An educational autograd engine: hand-written gradient rules recorded on a torch.Tensor subclass",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torchtrace", "torchtrace.*"]),
    package_data={"": ["*.js", "*.css", "*.html"]},  # assets that ship inside the package
    python_requires=">=3.10",  # torch 2.13 needs 3.10
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Education",
        "Intended Audience :: Science/Research",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Programming Language :: Python :: 3.14",
        "Topic :: Education",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # torch's version is pinned in constraints.txt (pip install -c ...)
    install_requires=["torch", "numpy", "graphviz"],
    extras_require={"viz": VIZ, "examples": EXAMPLES, "notebooks": NOTEBOOKS, "bench": BENCH, "test": TEST,
                    "docs": DOCS},
    entry_points={"console_scripts": ["torchtrace=torchtrace.__main__:main"]},
)
