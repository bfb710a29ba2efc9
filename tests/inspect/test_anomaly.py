"""tt.detect_anomaly: NaN/Inf in forward or backward raises, naming op, module path and source line."""
import pytest
import torch

import torchtrace as tt
from torchtrace.inspect.anomaly import AnomalyError, detect_anomaly


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.0, -1.0]))

    def forward(self, x):
        return torch.log(x * self.scale)  # negative entries give NaN


def test_forward_nan_names_op_module_and_line():
    model = Net()
    model.scale = tt.nn.Parameter(torch.tensor([1.0, -1.0]))
    x = tt.tracer([2.0, 3.0])
    with pytest.raises(AnomalyError) as info, detect_anomaly(model):
        model(x)
    what, where = str(info.value).splitlines()  # two lines: what happened, where the op was created
    assert what == "forward of LogBackward (torch.log) produced NaN or Inf"
    assert where.startswith("  where: in model, created at ") and "test_anomaly.py:" in where
    assert where.endswith("torch.log(x * self.scale)  # negative entries give NaN")


def test_backward_nan_names_the_node():
    x = tt.tracer([0.0, 4.0], requires_grad=True)
    with detect_anomaly():
        y = torch.sqrt(x).sum()  # d sqrt / dx = inf at 0
        with pytest.raises(AnomalyError) as info:
            y.backward()
    what, where = str(info.value).splitlines()
    assert what == "backward of SqrtBackward (torch.sqrt) produced a NaN or Inf gradient (its incoming gradient " \
        "was finite)"
    assert where.startswith("  where: in no module, created at ")
    assert where.endswith("y = torch.sqrt(x).sum()  # d sqrt / dx = inf at 0")


def test_outside_the_mode_nothing_is_captured():
    x = tt.tracer([0.0], requires_grad=True)
    y = torch.sqrt(x).sum()
    assert not hasattr(y.grad_fn, "created_at")
    y.backward()
    assert torch.isinf(x.grad).all()


@pytest.mark.parametrize("readable", [False, True])
def test_torchs_anomaly_mode_raises_on_a_nan_gradient_as_torchs_engine(readable):
    """torch.autograd.set_detect_anomaly(True) on a tracer's backward: torch's engine raises at the first rule that
    returns NaN, naming it; torchtrace's walk did not look and filled x.grad with NaN. Both messages name the function
    and the output; without anomaly mode both give the NaN silently, as torch."""
    import contextlib
    import warnings

    messages = []
    for x in (tt.tracer([0.0, 1.0], requires_grad=True), torch.tensor([0.0, 1.0], requires_grad=True)):
        with tt.readable() if readable else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that anomaly mode slows it down
            with torch.autograd.set_detect_anomaly(True):
                with pytest.raises(RuntimeError) as error:
                    torch.sqrt(x * -1.0).sum().backward()
            messages.append(str(error.value))
            torch.sqrt(x * -1.0).sum().backward()
            assert torch.isnan(x.grad).any()  # sqrt'(-0) = inf, sqrt'(-1) = NaN
    assert messages[0].startswith("Function 'SqrtBackward' returned nan values in its 0th output.")
    assert messages[1].startswith("Function 'SqrtBackward0' returned nan values in its 0th output.")


@pytest.mark.parametrize("compiled", [False, True])
def test_torchs_anomaly_mode_checks_a_gradient_summed_back_over_broadcast_dims(compiled):
    """y = a + b with b broadcast over rows: b's gradient is g summed over the rows, where inf and -inf make NaN
    (finite differences have no say here: the gradient is a sum of infinities). torch's engine checks each gradient
    after that sum and raises naming AddBackward0's output 1; so does torchtrace, eagerly and in a compiled call
    (whose node sums inside), and without anomaly mode both give b.grad NaN silently."""
    import warnings

    g = torch.tensor([[float("inf")], [-float("inf")]], dtype=torch.float64)

    def loss(a, b):
        return ((a + b) * g).sum()

    messages = []
    for make in (tt.tracer, torch.tensor):
        a, b = make(torch.ones(2, 3).double(), requires_grad=True), make(torch.zeros(3).double(), requires_grad=True)
        run = tt.compile(loss, (a, b)) if compiled and make is tt.tracer else loss
        run(a, b)  # (a compiled function's first call records its path; the calls below replay it)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that anomaly mode slows it down
            with torch.autograd.set_detect_anomaly(True):
                with pytest.raises(RuntimeError, match="returned nan values") as error:
                    run(a, b).backward()
        messages.append(str(error.value))
        run(a, b).backward()
        assert torch.isnan(b.grad).all() and torch.isinf(a.grad).all()
    assert messages[1].startswith("Function 'AddBackward0' returned nan values in its 1th output.")
    assert messages[0].startswith("Function 'CompiledCallBackward'" if compiled else
                                  "Function 'AddBackward' returned nan values in its 1th output.")
