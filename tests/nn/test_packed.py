"""Packed sequences: pack_padded_sequence -> RNN / LSTM / GRU (ported, and tt.nn) -> pad_packed_sequence, against
torch autograd (outputs, final states, gradients of the input, h_0 and every parameter) and finite differences."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

import torchtrace as tt

CASES = {
    "lstm_2_layers_bidirectional": (nn.LSTM, dict(num_layers=2, bidirectional=True)),
    "gru_bidirectional": (nn.GRU, dict(bidirectional=True)),
    "rnn_2_layers_relu": (nn.RNN, dict(num_layers=2, nonlinearity="relu")),
    "lstm_proj_batch_first": (nn.LSTM, dict(proj_size=2, batch_first=True)),
}


def _run(model, x, h0, lengths, batch_first, enforce_sorted):
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    out, state = model(packed, h0)
    padded, out_lengths = pad_packed_sequence(out, batch_first=batch_first, total_length=6)
    h = state[0] if isinstance(state, tuple) else state
    weights = torch.arange(h.numel(), dtype=h.dtype).reshape(h.shape) / 10
    return (padded.pow(2).sum() + (h * weights).sum()), padded, out_lengths


def _plain(t):
    return t.detach().as_subclass(torch.Tensor)


@pytest.mark.parametrize("enforce_sorted", [True, False], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_packed_sequences_through_a_ported_recurrent_layer_as_torch(name, enforce_sorted):
    cls, options = CASES[name]
    torch.manual_seed(0)
    model = cls(3, 4, **options).double()
    twin = copy.deepcopy(model)
    tt.port(model)
    batch_first = options.get("batch_first", False)
    x = torch.randn(*((3, 5, 3) if batch_first else (5, 3, 3)), dtype=torch.float64)
    lengths = torch.tensor([5, 3, 2] if enforce_sorted else [2, 5, 3])
    directions = 2 if options.get("bidirectional") else 1
    h0 = torch.randn(options.get("num_layers", 1) * directions, 3, options.get("proj_size") or 4,
                     dtype=torch.float64)
    c0 = torch.randn(options.get("num_layers", 1) * directions, 3, 4, dtype=torch.float64)
    start = (lambda h, c: (h, c)) if cls is nn.LSTM else (lambda h, c: h)

    ours_x, ours_h = tt.tracer(x, requires_grad=True), tt.tracer(h0, requires_grad=True)
    theirs_x, theirs_h = x.clone().requires_grad_(), h0.clone().requires_grad_()
    ours = _run(model, ours_x, start(ours_h, tt.tracer(c0)), lengths, batch_first, enforce_sorted)
    theirs = _run(twin, theirs_x, start(theirs_h, c0), lengths, batch_first, enforce_sorted)
    torch.testing.assert_close(_plain(ours[1]), theirs[1].detach())
    assert torch.equal(ours[2], theirs[2])
    ours[0].backward()
    theirs[0].backward()
    torch.testing.assert_close(ours_x.grad, theirs_x.grad)
    torch.testing.assert_close(ours_h.grad, theirs_h.grad)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert tt.gradcheck(lambda x, h: _run(model, x, start(h, tt.tracer(c0)), lengths, batch_first, enforce_sorted)[0],
                        x, h0)


def test_pack_sequence_into_a_tt_nn_lstm_as_torch():
    torch.manual_seed(0)
    model = tt.nn.LSTM(3, 4, bidirectional=True)
    twin = nn.LSTM(3, 4, bidirectional=True)
    twin.load_state_dict(model.state_dict())
    sequences = [torch.randn(n, 3) for n in (2, 4, 3)]
    ours_in = [tt.tracer(s, requires_grad=True) for s in sequences]
    theirs_in = [s.clone().requires_grad_() for s in sequences]
    ours, (h, c) = model(pack_sequence(ours_in, enforce_sorted=False))
    theirs, (h_t, c_t) = twin(pack_sequence(theirs_in, enforce_sorted=False))
    torch.testing.assert_close(_plain(ours.data), theirs.data.detach())
    (ours.data.sum() + c.pow(2).sum()).backward()
    (theirs.data.sum() + c_t.pow(2).sum()).backward()
    for a, b in zip(ours_in, theirs_in):
        torch.testing.assert_close(a.grad, b.grad)


def test_packing_and_padding_alone_as_torch():
    x = torch.randn(4, 3, 2, dtype=torch.float64)

    def there_and_back(t):
        packed = pack_padded_sequence(t * 2, torch.tensor([3, 4, 1]), enforce_sorted=False)
        return pad_packed_sequence(packed, padding_value=-1.0)[0], packed.data

    tt.check(there_and_back, x)
    assert tt.gradcheck(there_and_back, x)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_as_torch(batch_first, padding_side):
    a, b, c = (torch.randn(n, 2, dtype=torch.float64) for n in (3, 1, 4))

    def pad(a, b, c):
        return nn.utils.rnn.pad_sequence([a * 2, b, c], batch_first=batch_first, padding_value=0.5,
                                         padding_side=padding_side)

    tt.check(pad, a, b, c)
    assert tt.gradcheck(pad, a, b, c)
