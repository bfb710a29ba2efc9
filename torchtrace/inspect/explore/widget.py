"""The Jupyter widget: an anywidget running the same player.js as the saved page, its data as one JSON string."""
import json
from typing import Any, Dict

import anywidget
import traitlets

from torchtrace.inspect.explore.page import asset, widget_module


class ExploreWidget(anywidget.AnyWidget):
    """Displays a tt.explore record; `ExploreWidget(data)` with the dict `Exploration.data()` returns."""

    _esm = widget_module()
    _css = asset("player.css")
    data = traitlets.Unicode("{}").tag(sync=True)

    def __init__(self, data: Dict[str, Any], summary: str) -> None:
        super().__init__(data=json.dumps(data))
        self._summary = summary

    def __repr__(self) -> str:
        return self._summary
