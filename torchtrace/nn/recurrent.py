"""Recurrent layers (RNN, LSTM, GRU) and their cells, built from tracer ops whose rules already exist.

A step is a few lines of F.linear, sigmoid, tanh/relu, chunk, mul and add; the time loop runs in Python, and
every gradient comes from those ops' rules (backpropagation through time is just the engine's reverse walk).
Gate order as in torch, s = sigmoid:
    RNN:   h' = tanh (or relu)(W_ih x + b_ih + W_hh h + b_hh)
    LSTM:  i, f, g, o = chunks of W_ih x + b_ih + W_hh h + b_hh;  c' = s(f) c + s(i) tanh(g);  h' = s(o) tanh(c')
           (with proj_size: h' = W_hr (s(o) tanh(c')))
    GRU:   r, z, n chunks;  r = s(x_r + h_r),  z = s(x_z + h_z),  n = tanh(x_n + r h_n),  h' = (1 - z) n + z h
           where x_* = W_i* x + b_i*, h_* = W_h* h + b_h*
A PackedSequence input runs the same steps on the sequences still running at each time step (nn/packed.py).
The modules subclass torch's, so parameter names, shapes and initialisation (the same seed gives the same
weights) are torch's; only forward is replaced. Between layers, train-mode dropout draws its mask as torch's
CPU kernel does, so a seeded run equals torch's.
"""
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from torchtrace.nn.module import Module
from torchtrace.nn.packed import run_packed

Tensor = torch.Tensor
State = Union[Tensor, Tuple[Tensor, Tensor]]  # h, or (h, c) for an LSTM


def rnn_tanh_step(x_proj: Tensor, h: Tensor, w_hh: Tensor, b_hh: Optional[Tensor]) -> Tensor:
    """h' = tanh(x_proj + W_hh h + b_hh), x_proj = W_ih x + b_ih."""
    return torch.tanh(x_proj + F.linear(h, w_hh, b_hh))


def rnn_relu_step(x_proj: Tensor, h: Tensor, w_hh: Tensor, b_hh: Optional[Tensor]) -> Tensor:
    """h' = relu(x_proj + W_hh h + b_hh)."""
    return torch.relu(x_proj + F.linear(h, w_hh, b_hh))


def lstm_step(x_proj: Tensor, state: Tuple[Tensor, Tensor], w_hh: Tensor, b_hh: Optional[Tensor],
              w_hr: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(h', c') from the input, forget, cell and output gates (torch's order i, f, g, o)."""
    h, c = state
    i, f, g, o = (x_proj + F.linear(h, w_hh, b_hh)).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


def gru_step(x_proj: Tensor, h: Tensor, w_hh: Tensor, b_hh: Optional[Tensor]) -> Tensor:
    """h' = (1 - z) n + z h = n + z (h - n), with the reset gate applied to W_hn h + b_hn (torch's GRU)."""
    x_r, x_z, x_n = x_proj.chunk(3, -1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return n + z * (h - n)


STEPS = {"RNN_TANH": rnn_tanh_step, "RNN_RELU": rnn_relu_step, "LSTM": lstm_step, "GRU": gru_step}


def hidden_of(state: State) -> Tensor:
    """The step's output h (an LSTM's state is (h, c))."""
    return state[0] if isinstance(state, tuple) else state


def run_direction(step: Callable, x_proj: Tensor, state: State, hidden_weights: tuple,
                  reverse: bool) -> Tuple[Tensor, State]:
    """One layer, one direction: x_proj (T, N, gates) -> outputs (T, N, H) and the final state."""
    inputs = x_proj.unbind(0)
    outputs: List[Any] = [None] * len(inputs)
    for t in (reversed(range(len(inputs))) if reverse else range(len(inputs))):
        state = step(inputs[t], state, *hidden_weights)
        outputs[t] = hidden_of(state)
    return torch.stack(outputs), state


class RecurrentLayer(Module):
    """forward() of RNN, LSTM and GRU (mixed in before torch's class, which builds the parameters)."""

    def forward(self, input: Tensor, hx: Optional[State] = None) -> Tuple[Tensor, State]:
        packed = isinstance(input, torch.nn.utils.rnn.PackedSequence)
        dtype, weight_dtype = (input.data if packed else input).dtype, self.weight_ih_l0.dtype
        if dtype != weight_dtype and not torch._C._is_any_autocast_enabled():  # (torch's check, in its words)
            raise ValueError(f"RNN input dtype ({dtype}) does not match weight dtype ({weight_dtype}). Convert input: "
                             f"input.to({weight_dtype}), or convert model: model.to({dtype})")
        if packed:
            return run_packed(self, input, hx, STEPS[self.mode], hidden_of)
        name, lstm = type(self).__name__, self.mode == "LSTM"
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D instead")
        batched = input.dim() == 3
        if input.size(1 if batched and self.batch_first else 0) == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")  # (torch's words)
        states = None if hx is None else (hx if lstm else (hx,))
        if states is not None and any(s.dim() != input.dim() for s in states):
            dims = ", ".join(f"{s.dim()}-D" for s in states)
            raise RuntimeError(f"For {'batched 3-D' if batched else 'unbatched 2-D'} input, hx should also be "
                               f"{input.dim()}-D but got ({dims}) tensors")
        if not batched:
            input = input.unsqueeze(0 if self.batch_first else 1)
            states = None if states is None else tuple(s.unsqueeze(1) for s in states)
        states = self._initial_states(states, input.size(0 if self.batch_first else 1), input)
        self._check_sizes(input, states, self._state_sizes(input.size(0 if self.batch_first else 1)))
        output, states = self._layers(input.transpose(0, 1) if self.batch_first else input, states)
        output = output.transpose(0, 1) if self.batch_first else output
        if not batched:
            output, states = output.squeeze(0 if self.batch_first else 1), tuple(s.squeeze(1) for s in states)
        return output, (states if lstm else states[0])

    def _initial_states(self, states: Optional[Any], batch: int, like: Tensor) -> Tuple[Tensor, ...]:
        """(h_0,) or (h_0, c_0): the given ones (an LSTM's hx is a pair), or zeros."""
        if states is None:
            return tuple(torch.zeros(size, dtype=like.dtype, device=like.device) for size in self._state_sizes(batch))
        return tuple(states) if isinstance(states, (tuple, list)) else (states,)

    def _state_sizes(self, batch: int) -> list:
        """Shapes of h_0 (and c_0): (layers * directions, N, H_out (and H))."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        sizes = [(count, batch, self.proj_size or self.hidden_size), (count, batch, self.hidden_size)]
        return sizes[:2 if self.mode == "LSTM" else 1]

    def _check_sizes(self, input: Tensor, states: Tuple[Tensor, ...], sizes: list) -> None:
        if input.size(-1) != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.size(-1)}")
        for i, (state, size) in enumerate(zip(states, sizes)):
            if tuple(state.shape) != size:  # (torch's words: LSTM's h_0 and c_0 are hidden[0] and hidden[1])
                name = f"hidden[{i}]" if len(sizes) == 2 else "hidden"
                raise RuntimeError(f"Expected {name} size {size}, got {list(state.shape)}")

    def _weights(self, layer: int, reverse: bool) -> Tuple[Tensor, Optional[Tensor], tuple]:
        """(W_ih, b_ih, hidden weights (W_hh, b_hh[, W_hr])) of one layer and direction, by torch's names."""
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        w_ih, b_ih = getattr(self, "weight_ih" + suffix), getattr(self, "bias_ih" + suffix, None)
        hidden = getattr(self, "weight_hh" + suffix), getattr(self, "bias_hh" + suffix, None)
        if self.mode == "LSTM" and self.proj_size > 0:
            hidden += (getattr(self, "weight_hr" + suffix),)
        return w_ih, b_ih, hidden

    def _layers(self, x: Tensor, states: Tuple[Tensor, ...]) -> Tuple[Tensor, Tuple[Tensor, ...]]:
        """Sequence-first x (T, N, F) through every layer and direction -> output and stacked final states."""
        step, directions, lstm = STEPS[self.mode], 2 if self.bidirectional else 1, self.mode == "LSTM"
        initial = list(zip(*(s.unbind(0) for s in states)))  # per layer and direction: (h,) or (h, c)
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                w_ih, b_ih, hidden_weights = self._weights(layer, direction == 1)
                start = initial[layer * directions + direction]
                out, final = run_direction(step, F.linear(x, w_ih, b_ih), start if lstm else start[0], hidden_weights,
                                           direction == 1)
                outputs.append(out)
                finals.append(final if isinstance(final, tuple) else (final,))
            x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout)
        return x, tuple(torch.stack(parts) for parts in zip(*finals))


class RNN(RecurrentLayer, torch.nn.RNN):
    """Elman RNN, h' = tanh or relu (nonlinearity=) of W_ih x + b_ih + W_hh h + b_hh; returns (output, h_n)."""


class LSTM(RecurrentLayer, torch.nn.LSTM):
    """Long short-term memory (with optional proj_size); returns (output, (h_n, c_n))."""


class GRU(RecurrentLayer, torch.nn.GRU):
    """Gated recurrent unit; returns (output, h_n)."""


class RecurrentCell(Module):
    """forward() of the cells: one step on (N, F) or unbatched (F,) input; hx defaults to zeros."""

    has_cell_state = False  # an LSTM cell's state is (h, c)

    def forward(self, input: Tensor, hx: Optional[State] = None) -> State:
        name = type(self).__name__
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        states = None if hx is None else (hx if self.has_cell_state else (hx,))
        if states is not None and any(s.dim() not in (1, 2) for s in states):
            dims = ", ".join(f"{s.dim()}D" for s in states)
            raise ValueError(f"{name}: Expected hidden to be 1D or 2D, got {dims} instead")
        batched = input.dim() == 2
        if not batched:
            input = input.unsqueeze(0)
            states = None if states is None else tuple(s.unsqueeze(0) for s in states)
        if states is None:
            zeros = torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype, device=input.device)
            states = (zeros, zeros) if self.has_cell_state else (zeros,)
        self._check_step_sizes(input, states)
        state = self.step(F.linear(input, self.weight_ih, self.bias_ih), states if self.has_cell_state else states[0],
                          self.weight_hh, self.bias_hh)
        if not batched:
            state = tuple(s.squeeze(0) for s in state) if isinstance(state, tuple) else state.squeeze(0)
        return state

    def _check_step_sizes(self, input: Tensor, states: Tuple[Tensor, ...]) -> None:
        """torch's checks of a cell's sizes, in its words (the matmuls would raise less clearly)."""
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected {self.input_size}")
        for k, state in enumerate(states):
            if state.size(0) != input.size(0):
                raise RuntimeError(f"Input batch size {input.size(0)} doesn't match hidden{k} batch size "
                                   f"{state.size(0)}")
            if state.size(1) != self.hidden_size:
                raise RuntimeError(f"hidden{k} has inconsistent hidden_size: got {state.size(1)}, expected "
                                   f"{self.hidden_size}")

    def step(self, x_proj: Tensor, state: State, w_hh: Tensor, b_hh: Optional[Tensor]) -> State:
        raise NotImplementedError


class RNNCell(RecurrentCell, torch.nn.RNNCell):
    """h' = tanh or relu (nonlinearity=) of W_ih x + b_ih + W_hh h + b_hh."""

    def step(self, x_proj: Tensor, state: State, w_hh: Tensor, b_hh: Optional[Tensor]) -> State:
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        return STEPS["RNN_" + self.nonlinearity.upper()](x_proj, state, w_hh, b_hh)


class LSTMCell(RecurrentCell, torch.nn.LSTMCell):
    """One LSTM step: returns (h', c')."""

    has_cell_state, step = True, staticmethod(lstm_step)


class GRUCell(RecurrentCell, torch.nn.GRUCell):
    """One GRU step: returns h'."""

    step = staticmethod(gru_step)
