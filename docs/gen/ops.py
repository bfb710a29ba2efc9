"""Docs site: every torch callable torchtrace differentiates, with its rule and the rule's math line, read from the
registry at build time (torchtrace/ops/listing.py: the same list and count as `python -m torchtrace ops`)."""
import html

import mkdocs_gen_files

import torchtrace  # noqa: F401  (registers every rule)
from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name
from torchtrace.ops.listing import families, math_line, supported_ops

by_name = {callable_name(func): func for func in supported_ops()}
grouped = families()

with mkdocs_gen_files.open("ops.md", "w") as page:
    page.write("# Supported torch callables\n\n")
    page.write(f"{len(supported_ops())} torch callables have a hand-written gradient rule "
               f"({len({RULES[func] for func in supported_ops()})} rules; one rule serves every spelling of an op). "
               "Each row gives the rule and its math line: the op, then its derivative (`g` is the gradient that "
               "arrives from the output). `python -m torchtrace ops` prints the same list.\n\n")
    for family, names in grouped.items():
        page.write(f"## {family} ({len(names)})\n\n<table>\n<tr><th>torch callable</th><th>rule</th>"
                   "<th>math</th></tr>\n")
        for name in names:
            rule = RULES[by_name[name]]
            page.write(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(rule.__name__)}</td>"
                       f"<td><code>{html.escape(math_line(rule))}</code></td></tr>\n")
        page.write("</table>\n\n")
