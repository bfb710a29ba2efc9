"""torch.autocast inside a compiled function: its calls replay (run by the eager engine, whose nodes cast in
backward as forward did), on one path, with eager's values bit for bit and torch autograd's under the same autocast.
(Finite differences say nothing about bfloat16 rounding: torch autograd under autocast is the reference.)"""
import torch
from references import plain

import torchtrace as tt


def _loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = (x @ w).relu()
        out = (h @ w.t()).float()
    return (out * out).mean() + (x @ w).tanh().sum()


def test_calls_under_autocast_replay_with_eagers_and_torchs_values():
    torch.manual_seed(0)
    w0 = torch.randn(8, 8)
    w = tt.tracer(w0, requires_grad=True)
    compiled = tt.compile(_loss, ())
    for _ in range(4):
        x0 = torch.randn(4, 8)
        x = tt.tracer(x0)
        w.grad = None
        ours = compiled(x, w)
        ours.backward()
        ours_grad, w.grad = plain(w.grad), None
        eager = _loss(x, w)
        eager.backward()
        assert ours.dtype == torch.float32 and ours_grad.dtype == torch.float32
        assert torch.equal(plain(ours), plain(eager)) and torch.equal(ours_grad, plain(w.grad))
        w_ = w0.clone().requires_grad_()
        expected = _loss(x0, w_)
        expected.backward()
        torch.testing.assert_close(plain(ours), expected.detach(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(ours_grad, w_.grad, rtol=2e-2, atol=2e-2)
    assert len(compiled.program.paths()) == 1
    assert compiled.replayed == 3
    assert [st.kind for st in compiled.last_path][-2:] == ["replay", "replay"]  # after the region: rules' forwards
