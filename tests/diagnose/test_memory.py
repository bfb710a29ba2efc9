"""tt.diagnose.memory: the tensors each rule saves, checked against torch's own saved_tensors_hooks accounting of
the same models (torch autograd as the reference), and how torch.utils.checkpoint changes them."""
import pytest
import torch
from doctor_models import batch, build, loss_fn

import torchtrace as tt


def torch_saved_bytes(fn) -> int:
    """Bytes of every tensor torch autograd packs for backward while fn runs (its own accounting hook)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return total[0]


def both(kind, checkpoint=False):
    inputs, target = batch(kind)
    ours, theirs = build(kind), build(kind, port=False)
    if checkpoint:
        ours.checkpoint = theirs.checkpoint = True
    report = tt.diagnose.memory(lambda: loss_fn(ours, kind, inputs, target))
    return report, torch_saved_bytes(lambda: loss_fn(theirs, kind, inputs, target))


@pytest.mark.parametrize("kind", ["gpt", "bert", "gpt2"])
def test_saved_bytes_agree_with_torchs_saved_tensors_hooks_within_5_percent(kind):
    report, reference = both(kind)
    assert abs(report.saved_bytes - reference) <= 0.05 * reference, str(report)
    assert report.unique_bytes <= report.saved_bytes <= report.peak_bytes


def test_checkpointing_saves_what_torch_says_it_saves():
    plain, plain_reference = both("gpt2")
    checkpointed, checkpointed_reference = both("gpt2", checkpoint=True)
    ours, theirs = plain.saved_bytes - checkpointed.saved_bytes, plain_reference - checkpointed_reference
    assert theirs > 0 and abs(ours - theirs) <= 0.05 * theirs
    assert [r.rule for r in checkpointed.rows].count("Checkpoint") == 2
    assert checkpointed.peak_bytes < plain.peak_bytes  # the recomputed block is held one at a time


def test_a_rule_row_names_its_module_line_shapes_and_bytes():
    inputs, target = batch("mlp")
    model = build("mlp")
    report = tt.diagnose.memory(lambda: loss_fn(model, "mlp", inputs, target))
    fc2 = next(r for r in report.rows if r.module == "fc2")
    assert fc2.rule == "LinearFunction" and fc2.shapes == [(16, 32), (32, 32)] and fc2.bytes == (16 * 32 + 32 * 32) * 4
    assert fc2.line.startswith("doctor_models.py:")
    assert "peak during backward" in str(report)
