"""Writes the version counter does not see (.data, numpy's memory): named by the op whose value changed, at its line,
with the line of the write; a healthy forward, a .data read that writes nothing and a write torch counts are not
findings."""
import inspect

import torch

import torchtrace as tt


def _line(fn, marker):
    source, start = inspect.getsourcelines(fn)
    return f"test_unversioned_writes.py:{start + next(i for i, text in enumerate(source) if marker in text)}"


def _model():
    torch.manual_seed(0)
    return tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))


def test_a_result_zeroed_through_data_before_the_next_op_reads_it():
    m, x = _model(), tt.randn(5, 4)

    def step():
        h = torch.relu(m[0](x))  # relu made it
        h.data = torch.zeros_like(h.data)  # the write
        return m[1](h).sum()

    (finding,) = [f for f in tt.diagnose(step).findings if f.kind == "unversioned_write"]
    assert (finding.rule, finding.line) == ("Relu", _line(step, "relu made it"))
    assert f"its result was changed through .data at {_line(step, 'the write')}" in finding.message
    assert "the ops after it compute with values no recorded op produced" in finding.message


def test_a_saved_weight_scaled_through_data_after_its_op_ran():
    m, x = _model(), tt.randn(5, 4, requires_grad=True)

    def step():
        y = m[0](x)  # the op that saved the weight
        m[0].weight.data.mul_(0)  # the write
        return m[1](y).sum()

    (finding,) = [f for f in tt.diagnose(step).findings if f.kind == "unversioned_write"]
    assert (finding.rule, finding.line) == ("LinearFunction", _line(step, "saved the weight"))
    assert f"a tensor it saved for its backward was changed through .data at {_line(step, 'the write')}" in \
        finding.message and "nothing raises" in finding.message
    assert float(x.grad.abs().max()) == 0.0  # the gradient the zeroed weight gives, as torch's (nothing raised)


def test_healthy_forwards_and_counted_writes_are_not_findings():
    m, x = _model(), tt.randn(5, 4, requires_grad=True)

    def step():
        h = torch.relu(m[0](x))
        with torch.no_grad():
            m[1].bias.add_(1.0)  # counted by the version counter (and not saved by any op yet)
        g = h * 2
        g.add_(1.0)  # a recorded in-place op
        assert float(g.data.sum()) > 0  # read, not written
        return m[1](g).pow(2).mean()

    assert not [f for f in tt.diagnose(step).findings if f.kind == "unversioned_write"]
