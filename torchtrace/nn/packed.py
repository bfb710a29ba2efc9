"""Packed sequences: pad_sequence / pack_padded_sequence / pad_packed_sequence rules, and a recurrent layer run on
packed data.

A PackedSequence holds the steps of B sequences sorted by decreasing length, time-major: its data is
x[0, :b_0], x[1, :b_1], ..., b_t = batch_sizes[t] = how many sequences are longer than t. So packing is picking
the rows (t, n) with n < b_t of the time-major padded batch, and padding puts them back (zeros elsewhere):
    pack:  data = x[mask], mask[t, n] = n < b_t   ->  dx = g scattered back to the rows of the mask, 0 elsewhere
    pad:   y[mask] = data, padding elsewhere      ->  d data = g[mask]
A recurrent layer steps through time with the first b_t rows of its state (the sequences still running): the
other rows keep their state, so each sequence's final state is the one after its last step, in both directions.
"""
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence

from torchtrace.autograd.function import Function, register

Tensor = torch.Tensor


def packed_rows(batch_sizes: Tensor, batch: int) -> Tensor:
    """Positions t * B + n of the rows (t, n) a packed sequence holds, in its data's order."""
    mask = torch.arange(batch).reshape(1, -1) < batch_sizes.reshape(-1, 1)
    return mask.reshape(-1).nonzero().squeeze(1)


@register(torch._pack_padded_sequence)
class PackPaddedSequence(Function):
    """data = x[t, n] for n < b_t, t-major (x time-major)  ->  dx = d data put back at those rows, 0 elsewhere"""

    @staticmethod
    def forward(ctx: Any, input: Tensor, lengths: Tensor, batch_first: bool) -> Tuple[Tensor, Tensor]:
        data, batch_sizes = torch._pack_padded_sequence(input, lengths, batch_first)
        ctx.shape, ctx.batch_first, ctx.batch_sizes = input.shape, batch_first, batch_sizes
        return data, batch_sizes

    @staticmethod
    def backward(ctx: Any, g: Tensor, g_batch_sizes: Any) -> Tuple[Optional[Tensor], None, None]:
        shape = list(ctx.shape)
        if ctx.batch_first:
            shape[0], shape[1] = shape[1], shape[0]
        steps, batch = shape[0], shape[1]
        rows = packed_rows(ctx.batch_sizes, batch)
        full = g.new_zeros([steps * batch, *shape[2:]]).index_copy(0, rows, g).reshape(shape)
        return (full.transpose(0, 1) if ctx.batch_first else full), None, None


@register(torch._pad_packed_sequence)
class PadPackedSequence(Function):
    """y[t, n] = data row of (t, n) for n < b_t, padding_value elsewhere  ->  d data = g at those rows"""

    @staticmethod
    def forward(ctx: Any, data: Tensor, batch_sizes: Tensor, batch_first: bool, padding_value: float,
                total_length: int) -> Tuple[Tensor, Tensor]:
        ctx.batch_sizes, ctx.batch_first = batch_sizes, batch_first
        return torch._pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)

    @staticmethod
    def backward(ctx: Any, g: Tensor, g_lengths: Any) -> Tuple[Tensor, None, None, None, None]:
        g = g.transpose(0, 1) if ctx.batch_first else g
        steps, batch = len(ctx.batch_sizes), g.shape[1]
        rows = packed_rows(ctx.batch_sizes, batch)
        return g[:steps].reshape(steps * batch, *g.shape[2:]).index_select(0, rows), None, None, None, None


@register(torch._C._nn.pad_sequence)
class PadSequence(Function):
    """y[:, n] = sequence n, padded to the longest  ->  dsequence_n = g[the steps it filled, n]  (padding at its end,
    or at its start with padding_side='left')"""

    @staticmethod
    def forward(ctx: Any, sequences: List[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                padding_side: str = "right") -> Tensor:
        ctx.lengths, ctx.batch_first, ctx.left = [len(s) for s in sequences], batch_first, padding_side == "left"
        return torch._C._nn.pad_sequence(sequences, batch_first, padding_value, padding_side)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[List[Tensor], None, None, None]:
        g = g.transpose(0, 1) if ctx.batch_first else g
        steps = g.shape[0]
        grads = [g[steps - n:, i] if ctx.left else g[:n, i] for i, n in enumerate(ctx.lengths)]
        return grads, None, None, None


def _rows(state: Any, count: int) -> Any:
    return tuple(s[:count] for s in state) if isinstance(state, tuple) else state[:count]


def _joined(new: Any, old: Any, count: int) -> Any:
    """The state with its first `count` rows replaced by the step's new state."""
    if isinstance(new, tuple):
        return tuple(_joined(n, o, count) for n, o in zip(new, old))
    return new if count == old.shape[0] else torch.cat([new, old[count:]])


def run_packed_direction(step: Callable, x_proj: Tensor, sizes: List[int], state: Any, hidden_weights: tuple,
                         reverse: bool, hidden_of: Callable) -> Tuple[Tensor, Any]:
    """One layer, one direction over packed x_proj (rows of step t: the first sizes[t] sequences)."""
    steps = x_proj.split(sizes)
    outputs: List[Any] = [None] * len(steps)
    for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
        new = step(steps[t], _rows(state, sizes[t]), *hidden_weights)
        state = _joined(new, state, sizes[t])
        outputs[t] = hidden_of(new)
    return torch.cat(outputs), state


def run_packed(layer: Any, packed: PackedSequence, hx: Any, step: Callable, hidden_of: Callable) -> Tuple[Any, Any]:
    """A recurrent layer (RNN, LSTM, GRU) on a PackedSequence, as torch's: the output is packed like the input, and
    hx / the final states are in the caller's batch order (sorted_indices / unsorted_indices)."""
    data, batch_sizes, sorted_indices, unsorted_indices = packed
    lstm, directions = layer.mode == "LSTM", 2 if layer.bidirectional else 1
    sizes = [int(b) for b in batch_sizes]
    states = layer._initial_states(hx, sizes[0], data)
    if sorted_indices is not None:
        states = tuple(s.index_select(1, sorted_indices) for s in states)
    initial = list(zip(*(s.unbind(0) for s in states)))
    finals, x = [], data
    for index in range(layer.num_layers):
        outputs = []
        for direction in range(directions):
            w_ih, b_ih, hidden_weights = layer._weights(index, direction == 1)
            start = initial[index * directions + direction]
            out, final = run_packed_direction(step, F.linear(x, w_ih, b_ih), sizes, start if lstm else start[0],
                                              hidden_weights, direction == 1, hidden_of)
            outputs.append(out)
            finals.append(final if isinstance(final, tuple) else (final,))
        x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
        if layer.dropout > 0 and layer.training and index < layer.num_layers - 1:
            x = F.dropout(x, layer.dropout)
    states = tuple(torch.stack(parts) for parts in zip(*finals))
    if unsorted_indices is not None:
        states = tuple(s.index_select(1, unsorted_indices) for s in states)
    output = PackedSequence(x, batch_sizes, sorted_indices, unsorted_indices)
    return output, (states if lstm else states[0])
