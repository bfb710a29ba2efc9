"""RNN, LSTM, GRU and their cells: against torch.nn's twins with identical weights (forward, every parameter and
input gradient), finite differences in float64, and create_graph through a step."""
import pytest
import torch
from helpers import check_op, double_backward_matches
from torch.func import functional_call

import torchtrace as tt
from torchtrace.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell, gru_step, lstm_step

torch.manual_seed(0)
X = torch.randn(4, 3, 5)  # (T, N, F): 4 steps, batch 3, 5 features
H3 = torch.randn(4, 3, 2)  # initial states of 2 layers x 2 directions, hidden size 2
LAYERS = {RNN: torch.nn.RNN, LSTM: torch.nn.LSTM, GRU: torch.nn.GRU,
          RNNCell: torch.nn.RNNCell, LSTMCell: torch.nn.LSTMCell, GRUCell: torch.nn.GRUCell}


def twins(cls: type, *args, **options):
    """Our layer and torch's, built after the same seed (so with equal weights)."""
    torch.manual_seed(3)
    ours = cls(*args, **options)
    torch.manual_seed(3)
    return ours, LAYERS[cls](*args, **options)


def check_against_torch(ours, theirs, call, *inputs, train: bool = False) -> tt.check:
    """tt.check of call(layer, *inputs): ours on tracers, torch's twin on tensors, with the same parameters."""
    ours.train(train), theirs.train(train)

    def fn(params, *xs):
        layer = ours if isinstance(xs[0], tt.tracer) else theirs
        torch.manual_seed(5)  # the same dropout draws for both
        return call(lambda *args: functional_call(layer, params, args), *xs)

    return tt.check(fn, dict(ours.named_parameters()), *inputs, atol=1e-5)


def run(layer, *xs):
    return layer(*xs)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")  # torch's twin, with proj_size
@pytest.mark.parametrize("cls, options, call, inputs", [
    (RNN, {}, run, (X,)),
    (RNN, {"nonlinearity": "relu"}, run, (X,)),
    (RNN, {"num_layers": 2, "bidirectional": True}, run, (X, H3)),
    (RNN, {"nonlinearity": "relu", "batch_first": True, "bias": False}, run, (X,)),
    (LSTM, {}, run, (X,)),
    (LSTM, {}, lambda m, x, h, c: m(x, (h, c)), (X, H3[:1], H3[1:2])),
    (LSTM, {"num_layers": 2, "bidirectional": True}, lambda m, x, h, c: m(x, (h, c)), (X, H3, H3.flip(0))),
    (LSTM, {"num_layers": 3, "batch_first": True}, run, (X,)),
    (LSTM, {"bidirectional": True, "bias": False}, run, (X,)),
    (LSTM, {"num_layers": 2, "bidirectional": True, "proj_size": 1}, lambda m, x, h, c: m(x, (h, c)),
     (X, torch.randn(4, 3, 1), H3)),
    (LSTM, {"num_layers": 2}, lambda m, x, h, c: m(x, (h, c)), (X[:, 0], H3[:2, 0], H3[2:, 0])),  # unbatched
    (LSTM, {"batch_first": True, "bidirectional": True}, run, (X[:, 0],)),  # unbatched, batch_first
    (GRU, {}, run, (X,)),
    (GRU, {}, run, (X, H3[:1])),
    (GRU, {"num_layers": 2, "bidirectional": True, "batch_first": True}, run, (X.transpose(0, 1), H3)),
    (GRU, {"num_layers": 2, "bias": False}, run, (X[:, 0], H3[:2, 0])),
    (GRU, {"dtype": torch.float64}, run, (X.double(), H3[:1].double())),
    (LSTM, {}, lambda m, x: m(x.flip(0))[0].sum(0) + m(x)[0].sum(0), (X[:, :2],)),  # layer used twice
])
def test_recurrent_layers_equal_torch(cls, options, call, inputs):
    ours, theirs = twins(cls, 5, 2, **options)
    assert check_against_torch(ours, theirs, call, *inputs).ok


@pytest.mark.parametrize("cls, options, call, inputs", [
    (RNNCell, {}, run, (X[0],)),
    (RNNCell, {"nonlinearity": "relu"}, run, (X[0], H3[0])),
    (RNNCell, {"bias": False}, run, (X[0, 0], H3[0, 0])),  # unbatched
    (LSTMCell, {}, run, (X[0],)),
    (LSTMCell, {}, lambda m, x, h, c: m(x, (h, c)), (X[0], H3[0], H3[1])),
    (LSTMCell, {"bias": False}, lambda m, x, h, c: m(x, (h, c)), (X[0, 0], H3[0, 0], H3[1, 0])),
    (GRUCell, {}, run, (X[0],)),
    (GRUCell, {}, run, (X[0, 0], H3[0, 0])),
    (GRUCell, {"dtype": torch.float64}, run, (X[0].double(), H3[0].double())),
    (GRUCell, {}, lambda m, x: m(x[1], m(x[0])), (X,)),  # two steps by hand
    (LSTMCell, {}, lambda m, x: m(x[1], m(x[0])), (X,)),
])
def test_cells_equal_torch(cls, options, call, inputs):
    ours, theirs = twins(cls, 5, 2, **options)
    assert check_against_torch(ours, theirs, call, *inputs).ok


@pytest.mark.parametrize("cls, options", [
    (LSTM, {"num_layers": 3, "dropout": 0.5, "bidirectional": True}),
    (GRU, {"num_layers": 2, "dropout": 0.3, "batch_first": True}),
    (RNN, {"num_layers": 2, "dropout": 0.7}),
])
def test_dropout_between_layers(cls, options):
    ours, theirs = twins(cls, 5, 2, **options)
    assert check_against_torch(ours, theirs, run, X, train=True).ok  # train: torch's dropout draws
    assert check_against_torch(ours, theirs, run, X, train=False).ok  # eval: no dropout
    ours.train()
    torch.manual_seed(0)
    first = ours(tt.tracer(X))[0]
    assert not torch.equal(first.as_subclass(torch.Tensor), ours(tt.tracer(X))[0].as_subclass(torch.Tensor))


@pytest.mark.parametrize("make, inputs", [
    (lambda: LSTM(2, 2, num_layers=2, bidirectional=True), (torch.randn(3, 2, 2),)),
    (lambda: GRU(2, 2, batch_first=True), (torch.randn(2, 3, 2), torch.randn(1, 2, 2))),
    (lambda: RNN(2, 3, nonlinearity="relu"), (torch.rand(3, 2, 2),)),
    (lambda: LSTMCell(2, 3), (torch.randn(2, 2),)),
    (lambda: GRUCell(2, 2), (torch.randn(2, 2), torch.randn(2, 2))),
])
def test_gradcheck_float64(make, inputs):
    """Parameter and input gradients through the module (float32 vs torch autograd, then finite differences)."""
    layer = make()
    check_op(lambda params, *xs: functional_call(layer, params, xs), dict(layer.named_parameters()), *inputs)


def test_double_backward_through_steps():
    w_ih, w_hh, b = torch.randn(8, 3), torch.randn(8, 2), torch.randn(8)
    double_backward_matches(lambda x, h, c, w_ih, w_hh, b: sum(lstm_step(x @ w_ih.t(), (h, c), w_hh, b)),
                            torch.randn(2, 3), torch.randn(2, 2), torch.randn(2, 2), w_ih, w_hh, b)
    double_backward_matches(lambda x, h, w, b: gru_step(x, h, w, b), torch.randn(2, 6), torch.randn(2, 2),
                            torch.randn(6, 2), torch.randn(6))


@pytest.mark.parametrize("cls, options", [
    (RNN, {"num_layers": 2, "nonlinearity": "relu"}),
    (LSTM, {"num_layers": 2, "bidirectional": True, "proj_size": 1}),
    (GRU, {"bias": False, "bidirectional": True}),
    (RNNCell, {"nonlinearity": "relu"}),
    (LSTMCell, {}),
    (GRUCell, {"bias": False}),
])
def test_same_seed_same_parameters_and_state_dict_both_ways(cls, options):
    ours, theirs = twins(cls, 5, 2, **options)
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    assert all(isinstance(p, tt.nn.Parameter) and p.requires_grad for p in ours.parameters())
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(p.as_subclass(torch.Tensor), q.detach()), name
    assert repr(ours) == repr(theirs).replace(type(theirs).__name__, cls.__name__, 1)
    state = ours.state_dict()
    assert all(type(value) is torch.Tensor for value in state.values())
    fresh = LAYERS[cls](5, 2, **options)
    fresh.load_state_dict(state)
    mine = cls(5, 2, **options)
    mine.load_state_dict(theirs.state_dict())
    for p, q in zip(mine.parameters(), fresh.parameters()):
        assert torch.equal(p.as_subclass(torch.Tensor), q.detach())


def test_module_backward_gives_torch_parameter_gradients():
    ours, theirs = twins(LSTM, 5, 2, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 5)
    out, (h, c) = ours(tt.tracer(x))
    twin_out, (twin_h, twin_c) = theirs(x)
    assert out.shape == (3, 4, 4) and h.shape == c.shape == (4, 3, 2)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), twin_out.detach())
    (out.sum() + (h * c).sum()).backward()
    (twin_out.sum() + (twin_h * twin_c).sum()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert isinstance(p.grad, torch.Tensor) and not isinstance(p.grad, tt.tracer)
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_double_converts_parameters():
    layer = GRU(3, 2).double()
    assert all(p.dtype == torch.float64 and isinstance(p, tt.nn.Parameter) for p in layer.parameters())
    out, h = layer(tt.randn(4, 2, 3, dtype=torch.float64))
    assert out.dtype == torch.float64 and h.shape == (1, 2, 2)


def test_errors():
    x = tt.tracer(X, requires_grad=True)
    with pytest.raises(ValueError, match="LSTM: Expected input to be 2D or 3D, got 4D instead"):
        LSTM(5, 2)(x[None])
    with pytest.raises(RuntimeError, match="For batched 3-D input, hx should also be 3-D"):
        GRU(5, 2)(x, H3[0])
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size. Expected 4, got 5"):
        RNN(4, 2)(x)
    with pytest.raises(RuntimeError, match="Expected hidden.*size"):
        GRU(5, 2)(x, H3)
    with pytest.raises(ValueError, match="GRUCell: Expected input to be 1D or 2D, got 3D instead"):
        GRUCell(5, 2)(x)
    for layer, empty in ((LSTM(5, 2), torch.zeros(0, 2, 5)), (GRU(5, 2, batch_first=True), torch.zeros(2, 0, 5)),
                         (RNN(5, 2), torch.zeros(0, 5))):  # torch's words (torch.stack's 'non-empty TensorList' before)
        with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0 in RNN"):
            layer(empty)
    with pytest.raises(ValueError, match="LSTMCell: Expected hidden to be 1D or 2D"):
        LSTMCell(5, 2)(x[0], (H3, H3))
    cell = RNNCell(5, 2)
    cell.nonlinearity = "gelu"
    with pytest.raises(RuntimeError, match="Unknown nonlinearity: gelu"):
        cell(x[0])




@pytest.mark.parametrize("layer", [torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM])
def test_an_input_of_another_dtype_than_the_weights_is_refused_in_torchs_words(layer):
    """A float64 input to a float32 layer raised matmul's dtype error from inside the cell."""
    torch.manual_seed(0)
    theirs, ours = layer(3, 5), tt.port(layer(3, 5))
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError) as expected:
        theirs(x)
    with pytest.raises(ValueError) as got:
        ours(x)
    assert str(got.value) == str(expected.value)
    with pytest.raises(ValueError, match="does not match weight dtype"):  # (torch: matmul's error, for an LSTM)
        ours(torch.nn.utils.rnn.pack_padded_sequence(x, [2, 1], batch_first=True))


@pytest.mark.parametrize("cell", [torch.nn.RNNCell, torch.nn.GRUCell, torch.nn.LSTMCell])
@pytest.mark.parametrize("x_shape, h_shape", [((3, 11), None), ((3, 10), (2, 20)), ((3, 10), (3, 21)), ((11,), None),
                                              ((10,), (21,))])
def test_a_cell_refuses_inconsistent_sizes_in_torchs_words(cell, x_shape, h_shape):
    """The sizes went unchecked: a matmul's or a broadcast's error came from inside the step."""
    theirs, ours = cell(10, 20), tt.port(cell(10, 20))
    x = torch.randn(x_shape)
    hx = None if h_shape is None else torch.randn(h_shape)
    if hx is not None and cell is torch.nn.LSTMCell:
        hx = (hx, torch.randn(h_shape))
    with pytest.raises(RuntimeError) as expected:
        theirs(x, hx)
    with pytest.raises(RuntimeError) as got:
        ours(tt.tracer(x, requires_grad=True), hx)
    assert str(got.value) == str(expected.value)
