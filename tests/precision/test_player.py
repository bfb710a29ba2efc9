"""report.explore(): the player of the low-precision backward, each node marked with its dtype (the mark's kind),
coloured by what the low dtype did there (the mark's severity), the float32 value beside the low-precision one."""
import json

import torch
from precision_models import TinyHead

import torchtrace as tt


def test_the_player_marks_every_node_with_its_dtype_and_its_underflow():
    torch.manual_seed(0)
    model = tt.port(TinyHead())
    report = tt.precision(model, torch.randn(16, 8), dtype=torch.float16)
    player = report.explore()
    marks = {f.node: f for f in player.findings}
    assert len(marks) == len(player.findings) == sum(r.phase == "forward" for r in report.rows)
    kinds = {f.kind for f in marks.values()}
    assert kinds == {"float16", "float32"}  # the linear layers and tanh in float16, the loss's cast and sum in float32
    head_mark = next(f for f in player.findings if "underflow 93.4%" in f.message)
    assert head_mark.severity == "error" and head_mark.kind == "float16"
    assert "lower-precision list" in head_mark.message
    # the float32 value beside the float16 one: the head's output, as both runs computed it
    forward_head = next(r for r in report.rows if r.phase == "forward" and r.module == "head")
    first_value = f"{float(forward_head.reference.flatten()[0]):.4g}"
    assert f"float32 [{first_value}" in head_mark.message and "vs float16 [" in head_mark.message
    assert {f.severity for f in player.findings if f.kind == "float32"} <= {"info", "error"}
    json.dumps(player.data())  # the page can be written
