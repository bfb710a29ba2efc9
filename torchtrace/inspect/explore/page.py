"""The player's front end, from its two asset files: a standalone HTML page, or the module a widget loads.

Both run the same player.js; the page inlines it with player.css and the data, so the file needs
nothing from the network. One page may hold one player or two stepping together (side_by_side).
"""
import html
import json
from importlib import resources
from typing import Any, Dict

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ margin: 12px; }}
{css}
</style>
</head>
<body>
<div id="torchtrace-player"></div>
<script>
{js}
const TORCHTRACE_DATA = {data};
torchtracePage(document.getElementById("torchtrace-player"), TORCHTRACE_DATA);
</script>
</body>
</html>
"""

WIDGET_ENTRY = """
export default {
  render({ model, el }) {
    const draw = () => torchtracePlayer(el, JSON.parse(model.get("data")));
    draw();
    model.on("change:data", draw);
  },
};
"""


def asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _script_json(data: Dict[str, Any]) -> str:
    """JSON that is safe inside <script>: every `<` (which only a string can hold) written as the escape \\u003c, so no
    text of a name or a note can end the element (`</script>`) or put the parser in a comment state (`<!--`)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def page(data: Dict[str, Any], title: str) -> str:
    """The page: one player for Explorer.data(), or two stepping together for SideBySide.data() (which has
    "players", "titles", "pairs" and "first")."""
    escaped = title.replace("&", "&amp;").replace("<", "&lt;")
    return PAGE.format(title=escaped, css=asset("player.css"), js=asset("player.js"), data=_script_json(data))


def iframe(page_html: str, title: str, height: int) -> str:
    """A page shown inside a notebook's output: an iframe whose script runs apart from the notebook's."""
    return (f'<iframe srcdoc="{html.escape(page_html, quote=True)}" style="width: 100%; height: {height}px; border: 0" '
            f'title="{html.escape(title, quote=True)}"></iframe>')


def widget_module() -> str:
    """player.js as an ES module whose default export anywidget renders."""
    return asset("player.js") + WIDGET_ENTRY
