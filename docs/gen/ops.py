"""Docs site: every torch callable torchtrace differentiates, with its rule and the rule's math line (the first
line of the rule's docstring), read from the registry at build time."""
import html
from collections import defaultdict

import mkdocs_gen_files

import torchtrace  # noqa: F401  (registers every rule)
from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name

families = defaultdict(list)
for func, rule in RULES.items():
    math = (rule.__doc__ or "").strip().splitlines()[0] if (rule.__doc__ or "").strip() else ""
    families[rule.__module__].append((callable_name(func), rule.__name__, math))

with mkdocs_gen_files.open("ops.md", "w") as page:
    page.write("# Supported torch callables\n\n")
    page.write(f"{len(RULES)} torch callables have a hand-written gradient rule ({len(set(RULES.values()))} rules; "
               "one rule serves every spelling of an op). Each row gives the rule and the first line of its "
               "docstring, its math. `python -m torchtrace ops` prints the same list.\n\n")
    for module in sorted(families):
        rows = sorted(families[module])
        page.write(f"## `{module}` ({len(rows)})\n\n<table>\n<tr><th>torch callable</th><th>rule</th>"
                   "<th>math</th></tr>\n")
        for name, rule, math in rows:
            page.write(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(rule)}</td>"
                       f"<td><code>{html.escape(math)}</code></td></tr>\n")
        page.write("</table>\n\n")
