"""Zero by construction in every call form: tt.flow(model) after an ordinary backward (the graph freed) tells a bias
before a batch norm and an attention's key bias from vanishing gradients, by the model's structure; tt.diagnose
names the key bias too; and the key bias's gradient really is rounding next to torch autograd's own."""
import torch
from doctor_models import batch, build, loss_fn

import torchtrace as tt
from torchtrace.inspect.flow import BY_CONSTRUCTION


def _flow_after_backward(kind):
    model = build(kind)
    inputs, target = batch(kind)
    loss_fn(model, kind, inputs, target).backward()  # an ordinary backward: the graph is freed
    return model, tt.flow(model)


def test_a_conv_bias_before_batch_norm_is_zero_by_construction_after_an_ordinary_backward():
    model, report = _flow_after_backward("cnn")
    assert report["conv1.bias"].flag == BY_CONSTRUCTION and "vanishing" not in {r.flag for r in report}
    assert report["conv2.bias"].flag == ""  # conv2 feeds a ReLU, not a normalisation: a real gradient
    assert report.with_flag(BY_CONSTRUCTION) == ["conv1.bias"]


def test_the_key_bias_of_attention_is_zero_by_construction_in_flow_and_in_the_doctor():
    model, report = _flow_after_backward("bert")
    assert report.with_flag(BY_CONSTRUCTION) == ["layers.0.attention.key.bias", "layers.1.attention.key.bias"]
    assert report["layers.0.attention.query.bias"].flag == ""  # the query bias changes the scores: not zero
    inputs, target = batch("bert")
    found = tt.diagnose(lambda: loss_fn(model, "bert", inputs, target)).of_kind("zero_by_construction")
    assert [f.module for f in found] == ["layers.0.attention.key", "layers.1.attention.key"]
    assert "softmax is unchanged by a constant per row" in found[0].message and "Adam" in found[0].message


def test_torch_autograd_gives_the_key_bias_a_rounding_sized_gradient_too():
    """The flag is about the math, not about torchtrace's rounding: torch's own gradient is as small, and finite
    differences in float64 give 0 within their error."""
    torch.manual_seed(0)
    model = build("bert", port=False).double()
    inputs, target = batch("bert")
    loss_fn(model, "bert", inputs, target).backward()
    key = model.layers[0].attention.key
    assert float(key.bias.grad.abs().max()) < 1e-10 * float(key.weight.grad.abs().max())  # float64 rounding
    with torch.no_grad():
        step = torch.randn_like(key.bias) * 1e-3
        key.bias += step
        up = loss_fn(model, "bert", inputs, target)
        key.bias -= 2 * step
        down = loss_fn(model, "bert", inputs, target)
    assert abs(float(up - down)) < 1e-12
