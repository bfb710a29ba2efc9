"""A plain torch tensor handed to a graph tool: the error names tt.tracer and tt.port (the two ways to get tracers)
and explains `.backward(show=True)` on plain tensors, instead of failing inside the walk."""
import pytest
import torch

import torchtrace as tt

TOOLS = {"tt.show": lambda y: tt.show(y), "tt.show norms": lambda y: tt.show(y, norms=True),
         "tt.draw": lambda y: tt.draw(y), "tt.explore": lambda y: tt.explore(y)}


def plain_outputs():
    x = torch.randn(3, requires_grad=True)
    model = torch.nn.Linear(3, 1)  # a torch model someone forgot to port
    return {"torch autograd's graph": (x * 2).sum(), "an unported model": model(torch.randn(2, 3)).sum(),
            "a plain leaf": x, "no graph at all": torch.randn(3).sum()}


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("case", list(plain_outputs()))
def test_a_plain_tensor_gets_an_error_that_names_the_fix(tool, case):
    y = plain_outputs()[case]
    with pytest.raises(TypeError) as raised:
        TOOLS[tool](y)
    message = str(raised.value)
    assert message.startswith(f"{tool.split()[0]} got a plain torch.Tensor")
    assert "tt.tracer(data, requires_grad=True)" in message and "tt.port(model)" in message
    assert "unexpected keyword argument 'show'" in message
    if y.grad_fn is not None:
        assert type(y.grad_fn).__name__ in message  # torch's own node, e.g. SumBackward0


def test_the_same_computation_on_tracers_is_accepted(capsys):
    model = tt.port(torch.nn.Linear(3, 1))
    y = model(torch.randn(2, 3)).sum()
    tt.show(y)
    assert "Linear(in_features=3, out_features=1, bias=True)" in capsys.readouterr().out
    assert tt.draw(y).source
