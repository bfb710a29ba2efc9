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


@pytest.mark.parametrize("output", [None, 5, [], "loss"], ids=["None", "number", "empty list", "string"])
def test_draw_names_what_it_takes_instead_of_an_internal_error(output):
    """tt.draw(None) failed with "'NoneType' object is not iterable"."""
    with pytest.raises(TypeError, match="^tt.draw takes the output tracer whose graph to show"):
        tt.draw(output)


PARAM_TOOLS = {"tt.draw": lambda y, p: tt.draw(y, params=p), "tt.show": lambda y, p: tt.show(y, params=p),
               "tt.explore": lambda y, p: tt.explore(y, params=p), "tt.flow": lambda y, p: tt.flow(p)}


@pytest.mark.parametrize("tool", list(PARAM_TOOLS))
@pytest.mark.parametrize("params", [5, "w", [("w", 3)], "one tensor"])
def test_params_of_the_wrong_kind_are_named_by_each_tool(tool, params):
    """params=5 failed with "'int' object is not iterable" (a string or one tensor was iterated: tt.flow tabulated a
    weight's rows, as tensors without gradients)."""
    w = tt.tracer(torch.randn(3, 2), requires_grad=True)
    y = (w * 2).sum()
    y.backward(retain_graph=True)
    with pytest.raises(TypeError, match=f"^{tool}: params names the tensors: a torch.nn.Module"):
        PARAM_TOOLS[tool](y, w if params == "one tensor" else params)


def test_params_as_a_dict_pairs_or_a_list_name_the_same_tensors():
    w = tt.tracer(torch.randn(3, 2), requires_grad=True)
    (w * 2).sum().backward()
    for params, name in (({"w": w}, "w"), ([("w", w)], "w"), ([w], "param0")):
        assert [row.name for row in tt.flow(params).rows] == [name]
