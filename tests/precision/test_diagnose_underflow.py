"""tt.diagnose names an underflow where it is the cause: the rule whose float16 gradient is 0 where float32's is
not, with the share, and nothing where the low dtype is not to blame (bfloat16, float32, a scaled loss)."""
import torch
from precision_models import TinyHead

import torchtrace as tt


def _setup():
    torch.manual_seed(0)
    return tt.port(TinyHead()), torch.randn(16, 8)


def _under(model, dtype, scale=1.0):
    def fn(x):
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x)
        return loss * scale
    return fn


def test_the_underflowing_layer_is_named_with_its_share():
    model, x = _setup()
    d = tt.diagnose(_under(model, torch.float16), x)
    found = d.of_kind("underflow")
    assert len(found) == 1
    finding = found[0]
    assert (finding.rule, finding.module, finding.phase) == ("LinearFunction", "head", "backward")
    assert finding.line.startswith("precision_models.py:")
    assert "underflowed float16" in finding.message and "below 6e-08 in float32" in finding.message
    assert "GradScaler" in finding.advice
    # the same share tt.precision counts on its own float32 run: 128 input-gradient elements of 128 + 8 + 1
    report = tt.precision(model, x, dtype=torch.float16)
    assert finding.share == report.first_underflow.underflow == 128 / 137
    # like loss.backward(), diagnose filled .grad: the body's gradients are all zero in float16
    assert float(model.body[0].weight.grad.abs().max()) == 0.0


def test_nothing_is_named_where_the_dtype_is_not_to_blame():
    model, x = _setup()
    assert tt.diagnose(_under(model, torch.bfloat16), x).of_kind("underflow") == []
    assert tt.diagnose(model, x).of_kind("underflow") == []
    assert tt.diagnose(_under(model, torch.float16, scale=2.0 ** 16), x).of_kind("underflow") == []
