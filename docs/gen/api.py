"""Docs site: the API reference, one page per public namespace, one entry per public name (read from the
namespaces' `__all__` at build time, so names added later appear). torchtrace's own objects are rendered from
their docstrings by mkdocstrings; names re-exported from torch link to torch's documentation instead."""
import importlib
import inspect
import types

import mkdocs_gen_files

NAMESPACES = ["torchtrace", "torchtrace.nn", "torchtrace.nn.parallel", "torchtrace.optim",
              "torchtrace.optim.lr_scheduler"]


def entry(namespace: str, name: str, obj: object) -> str:
    """The markdown for one public name."""
    if isinstance(obj, types.ModuleType):
        if obj.__name__ in NAMESPACES:
            return f"## `{name}`\n\nSee [{obj.__name__}]({obj.__name__}.md).\n"
        if not obj.__name__.startswith("torchtrace"):
            return f"## `{name}`\n\ntorch's `{obj.__name__}`, re-exported unchanged.\n"
        return f"## `{name}`\n\n::: {obj.__name__}\n    options:\n      members: false\n"
    module = getattr(obj, "__module__", "") or ""
    if not module.startswith("torchtrace"):
        return f"## `{name}`\n\ntorch's `{module}.{obj.__qualname__}`, re-exported unchanged.\n"
    if "<locals>" in obj.__qualname__:  # made by a function at import time (tt.zeros, ...): what it is at run time
        return f"## `{name}`\n\n```python\n{name}{inspect.signature(obj)}\n```\n\n{inspect.getdoc(obj) or ''}\n"
    path = f"{module}.{obj.__qualname__}"
    members = "" if inspect.isclass(obj) else "\n    options:\n      show_root_heading: false"
    return f"## `{name}`\n\n::: {path}{members}\n"


for namespace in NAMESPACES:
    module = importlib.import_module(namespace)
    with mkdocs_gen_files.open(f"api/{namespace}.md", "w") as page:
        page.write(f"# `{namespace}`\n\n{(module.__doc__ or '').strip()}\n\n")
        for name in module.__all__:
            page.write(entry(namespace, name, getattr(module, name)) + "\n")
