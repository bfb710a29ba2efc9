"""torch.utils.checkpoint inside a compiled function: the calls before the block replay, the rest of the call runs
eagerly (the checkpoint learns its parameters by watching the ops it records), with a warning naming the line."""
import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint
from references import finite_differences, plain, torch_grads

import torchtrace as tt
from torchtrace.port import port

WHERE = {"start": 0, "middle": 1, "end": 2}


def _layers() -> torch.nn.ModuleList:
    torch.manual_seed(1)
    return torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]).double()


def _loss(layers: torch.nn.ModuleList, x: torch.Tensor, at: int, reentrant: bool) -> torch.Tensor:
    h = x
    for i, layer in enumerate(layers):
        if i == at:
            block = lambda z, layer=layer: torch.tanh(layer(z))  # noqa: E731
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=reentrant)
        else:
            h = torch.tanh(layer(h))
    return (h * h).sum()


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("where", list(WHERE))
def test_a_checkpointed_block_gives_every_weight_its_gradient_on_every_call(where, reentrant):
    reference = _layers()
    ported = port(copy.deepcopy(reference))
    at = WHERE[where]
    compiled = tt.compile(lambda x: _loss(ported, x, at, reentrant), ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(4):
            x = torch.randn(2, 4, dtype=torch.float64, requires_grad=where == "start")
            x_ = tt.tracer(x.detach(), requires_grad=where == "start")
            ported.zero_grad(set_to_none=True)
            compiled(x_).backward()
            ours = [plain(p.grad) for p in ported.parameters()]
            ours_x, x_.grad = x_.grad, None
            ported.zero_grad(set_to_none=True)
            _loss(ported, x_, at, reentrant).backward()
            eager = [plain(p.grad) for p in ported.parameters()]
            params = list(reference.parameters())
            expected = torch_grads(lambda: _loss(reference, x, at, reentrant), params)
            numeric = finite_differences(lambda: _loss(reference, x, at, reentrant), [p.data for p in params])
            for a, b, c, d in zip(ours, eager, expected, numeric):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
                torch.testing.assert_close(a, c)
                torch.testing.assert_close(a, d, rtol=1e-5, atol=1e-6)
            if where == "start":
                torch.testing.assert_close(plain(ours_x), plain(x_.grad), rtol=0, atol=0)
                torch.testing.assert_close(plain(ours_x), torch_grads(lambda: _loss(reference, x, at, reentrant),
                                                                      [x])[0])
    said = [str(w.message) for w in caught if "runs eagerly from" in str(w.message)]
    assert len(said) == 1 and "checkpoint" in said[0] and "test_compile_checkpoint.py" in said[0]
    assert compiled.replayed == 0  # no call replays to its end: each runs eagerly from the checkpoint
    assert len(compiled.program.paths()) == 1  # one path, the statements before the checkpoint


@pytest.mark.filterwarnings("ignore")  # the warning that the checkpoint runs eagerly
def test_a_second_backward_with_retain_graph_doubles_the_gradient_as_eager():
    ported = port(_layers())
    compiled = tt.compile(lambda x: _loss(ported, x, 1, False), ())
    for _ in range(3):
        x = tt.tracer(torch.randn(2, 4, dtype=torch.float64))
        ported.zero_grad(set_to_none=True)
        loss = compiled(x)
        loss.backward(retain_graph=True)
        loss.backward()
        ours = [plain(p.grad) for p in ported.parameters()]
        ported.zero_grad(set_to_none=True)
        loss = _loss(ported, x, 1, False)
        loss.backward(retain_graph=True)
        loss.backward()
        for a, p in zip(ours, ported.parameters()):
            torch.testing.assert_close(a, plain(p.grad), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore")  # the warning that the checkpoint runs eagerly
def test_calls_before_the_checkpoint_replay():
    ported = port(_layers())
    compiled = tt.compile(lambda x: _loss(ported, x, 2, False), ())
    for _ in range(3):
        compiled(tt.tracer(torch.randn(2, 4, dtype=torch.float64))).backward()
    (path,) = compiled.program.paths()
    assert len(path) == 4  # linear, tanh, linear, tanh before the checkpoint
    assert [st.kind for st in compiled.last_path] == ["replay"] * 4
