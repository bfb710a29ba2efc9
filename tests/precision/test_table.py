"""python -m torchtrace.precision prints, for bfloat16 and float16, the five rules of a small GPT with the largest
relative error, the underflow shares with and without scaling, and GradScaler's skipped steps."""
import re

from torchtrace.precision.__main__ import table


def test_the_table_has_both_dtypes_five_rules_each_and_the_loop():
    text = table(steps=3)
    sections = text.split("## ")[1:]
    assert [s.split(" ", 1)[0] for s in sections] == ["bfloat16", "float16"]
    for section in sections:
        rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| rule")]
        assert len(rows) == 5
        errors = [float(row.split("|")[5]) for row in rows]
        assert errors == sorted(errors, reverse=True) and 0 < errors[-1] < 0.1
        assert re.search(r"underflowed: [\d.]+% at scale 1, [\d.]+% at scale 2\*\*16", section)
        assert "GradScaler over 3 AdamW steps" in section
    # bfloat16 has float32's range: nothing of this GPT underflows; float16 loses a little without a scale, nothing
    # with one
    assert "underflowed: 0.000% at scale 1, 0.000% at scale 2**16" in sections[0]
    assert re.search(r"underflowed: 0\.0*[1-9][\d]*% at scale 1, 0.000% at scale 2\*\*16", sections[1])
