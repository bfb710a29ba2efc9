"""The seeded-fault table on the docs page is what the code says today (tt.diagnose and torch's anomaly mode)."""
from pathlib import Path

from fault_table import markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "diagnose.md"


def test_the_docs_table_is_regenerated_output():
    assert markdown() in PAGE.read_text(encoding="utf-8"), "run python tests/diagnose/fault_table.py and paste it"
