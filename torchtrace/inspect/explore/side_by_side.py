"""Two players in one page, stepping in lockstep: step pairs[i][0] of the first backward beside pairs[i][1] of the
second (the gradient diff aligns two backward passes rule by rule and shows them this way).

    side_by_side(ex_a, ex_b, [(0, 0), (1, 2), ...], first=1, titles=("float32", "float16")).save("both.html")
"""
import html
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from torchtrace.inspect.explore.page import page as page_of

if TYPE_CHECKING:
    from torchtrace.inspect.explore import Explorer


class SideBySide:
    """Two tt.explore records shown together; `.save(path)` writes the page, Jupyter shows it inline."""

    def __init__(self, a: "Explorer", b: "Explorer", pairs: List[Tuple[int, int]], first: Optional[int],
                 titles: Tuple[str, str]) -> None:
        self.a, self.b, self.pairs, self.first, self.titles = a, b, pairs, first, titles

    def data(self) -> Dict[str, Any]:
        return {"players": [self.a.data(), self.b.data()], "titles": list(self.titles),
                "pairs": [list(p) for p in self.pairs], "first": self.first}

    def page(self) -> str:
        """The page's HTML."""
        return page_of(self.data(), f"{self.titles[0]} | {self.titles[1]}")

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Write both players as one self-contained HTML file."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.page())
        return os.fspath(path)

    def _repr_html_(self) -> str:
        """The page in an iframe (its script runs apart from the notebook's)."""
        return (f'<iframe srcdoc="{html.escape(self.page(), quote=True)}" style="width: 100%; height: 820px; '
                'border: 0" title="two backward passes side by side"></iframe>')

    def __repr__(self) -> str:
        return f"<side by side: {self.titles[0]} ({len(self.a.steps)} steps) | {self.titles[1]} " \
               f"({len(self.b.steps)} steps), {len(self.pairs)} pairs>"


def side_by_side(ex_a: "Explorer", ex_b: "Explorer", pairs: Sequence[Tuple[int, int]], first: Optional[int] = None,
                 titles: Tuple[str, str] = ("a", "b")) -> SideBySide:
    """Both players in one page. `pairs` lists (step index in ex_a, step index in ex_b); the arrow keys move along
    it and both players show their step of the pair. `first`: the index in `pairs` of the pair shown first (and
    highlighted: where the two passes part, say)."""
    checked = []
    for i, j in pairs:
        if not (0 <= i < len(ex_a.steps) and 0 <= j < len(ex_b.steps)):
            raise IndexError(f"pair ({i}, {j}) is outside the steps: {len(ex_a.steps)} in a, {len(ex_b.steps)} in b")
        checked.append((int(i), int(j)))
    if not checked:
        raise ValueError("side_by_side needs at least one (step in a, step in b) pair")
    if first is not None and not 0 <= first < len(checked):
        raise IndexError(f"first={first} is not an index into the {len(checked)} pairs")
    return SideBySide(ex_a, ex_b, checked, first, (str(titles[0]), str(titles[1])))
