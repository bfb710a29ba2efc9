"""mkdocs hook: a notebook page's table of contents is read from its rendered headings.

mkdocs-jupyter builds the table of contents from a markdown copy of the notebook with every inline code span
removed, so "1. A `Value` with `_backward` closures" became "1. A with closures", and its anchors then missed
the headings' ids. Here the entries are the headings of the page itself: their ids, their text (code included).
"""
import html
import re
from typing import Any, Dict, List

from mkdocs.structure.toc import get_toc

HEADING = re.compile(r'<h([1-6]) id="([^"]+)">(.*?)</h\1>', re.S)
ANCHOR = re.compile(r'<a class="anchor-link"[^>]*>.*?</a>', re.S)
TAG = re.compile(r"<[^>]+>")


def headings(content: str) -> List[Dict[str, Any]]:
    """The page's headings as nested toc tokens (level, id, name, html, children), in page order."""
    roots: List[Dict[str, Any]] = []
    open_tokens: List[Dict[str, Any]] = []
    for level, anchor, inner in HEADING.findall(content):
        inner = ANCHOR.sub("", inner).strip()
        token = {"level": int(level), "id": anchor, "name": html.unescape(TAG.sub("", inner)).strip(),
                 "html": inner, "data-toc-label": "", "children": []}
        while open_tokens and open_tokens[-1]["level"] >= token["level"]:
            open_tokens.pop()
        (open_tokens[-1]["children"] if open_tokens else roots).append(token)
        open_tokens.append(token)
    return roots


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri.startswith("notebooks/") and page.file.src_uri.endswith(".ipynb"):
        page.toc = get_toc(headings(content))
    return content
