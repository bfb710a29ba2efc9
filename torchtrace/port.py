"""tt.port(torch_module): make an ordinary torch.nn.Module train on torchtrace's gradients, in place."""
from typing import Callable, Dict, TypeVar

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.factories import as_tracer
from torchtrace.nn.attention import MultiheadAttention
from torchtrace.nn.local_response_norm import CrossMapLRN2d
from torchtrace.nn.module import ForwardInModule, Module, Parameter
from torchtrace.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from torchtrace.tracer import tracer

M = TypeVar("M", bound=torch.nn.Module)

# torch layers whose forward calls a kernel torchtrace cannot see into -> the tt.nn class that replaces it.
SWAPS: Dict[type, type] = {
    torch.nn.RNN: RNN,  # torch._VF.rnn_tanh / rnn_relu on a flat weight list
    torch.nn.LSTM: LSTM,  # torch._VF.lstm
    torch.nn.GRU: GRU,  # torch._VF.gru
    torch.nn.RNNCell: RNNCell,  # torch._VF.rnn_tanh_cell / rnn_relu_cell
    torch.nn.LSTMCell: LSTMCell,  # torch._VF.lstm_cell
    torch.nn.GRUCell: GRUCell,  # torch._VF.gru_cell
    torch.nn.MultiheadAttention: MultiheadAttention,  # F.multi_head_attention_forward, fused fast paths
    torch.nn.CrossMapLRN2d: CrossMapLRN2d,  # a legacy autograd.Function: refused with gradients
}
_MIXED: Dict[type, type] = {}  # user subclass of a swapped torch class -> (that subclass, tt.nn class)


def port(module: M) -> M:
    """Turn every parameter and buffer of `module` (and of all its sub-modules) into a tracer, in place.

    Returns the same module object, which then trains with torchtrace's gradients under unmodified torch code:
    `loss.backward()`, `tt.optim` or `torch.optim` optimizers, `optimizer.zero_grad()`, and
    `with torch.no_grad(): p -= lr * p.grad`.

    - Each `torch.nn.Parameter` becomes a `tt.nn.Parameter` in place: the same object, so an optimizer created
      before porting keeps updating the model (requires_grad kept; torch's own requires_grad is False
      underneath). A parameter object used by several modules (weight tying) is converted once and stays shared.
      Buffers (BatchNorm's running_mean / running_var / num_batches_tracked) become tracers without gradient
      sharing their storage, so in-place running-stat updates keep working.
    - `module.state_dict()` holds plain tensors (it loads into an un-ported twin); `load_state_dict` copies
      into the tracers. Porting twice changes nothing.
    - Swaps: a layer whose torch forward calls a kernel that torchtrace cannot intercept gets the tt.nn class
      of the same name, which subclasses torch's and keeps its parameter names, state_dict and attributes; only
      forward is replaced by tracer ops that have rules. The instance's `__class__` is changed in place:
        torch.nn.RNN / LSTM / GRU           -> tt.nn.RNN / LSTM / GRU           (torch calls torch._VF.rnn_* /
                                                                                 lstm / gru on a flat weight list)
        torch.nn.RNNCell / LSTMCell / GRUCell -> tt.nn.RNNCell / LSTMCell / GRUCell   (torch._VF.*_cell)
        torch.nn.MultiheadAttention         -> tt.nn.MultiheadAttention        (F.multi_head_attention_forward
                                                                                 and its fused fast paths)
      (so nn.TransformerEncoderLayer / DecoderLayer / Transformer work through their swapped self_attn). A user
      subclass of one of these keeps its own methods: its class becomes a subclass of both, and its
      `super().forward(...)` reaches the tt.nn forward (it pickles as the user's class and is swapped again on
      loading). The recurrent swaps take PackedSequence input (torchtrace/nn/packed.py).
    - Every other common layer (Linear, Conv1d/2d/3d, ConvTranspose*, BatchNorm*, LayerNorm, GroupNorm,
      InstanceNorm*, Embedding, Dropout, pooling, activations, losses) calls a torch.nn.functional callable
      that has a rule, and is left as it is. A layer whose functional has no rule (at the time of writing
      nn.PReLU, SELU, Hardswish, Hardsigmoid, AlphaDropout, Upsample, PixelShuffle, Unfold) raises
      tt.UnsupportedOperationError naming that callable at its first forward that needs a gradient.
    - Lazy modules (nn.LazyLinear, ...) must run one forward before they are ported.
    - Every sub-module's forward runs with the module on torchtrace's module stack (`nn.module.ForwardInModule`,
      set on the instance: no forward hooks, which would slow every call), so each graph node knows its module,
      as with tt.nn modules, and `backward(show=True)`, `tt.draw` and `tt.trace` name the layers of a ported
      model.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"tt.port expects a torch.nn.Module, got {type(module).__name__}")
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        if torch.nn.parameter.is_lazy(t):
            raise RuntimeError(f"tt.port: {name} of this lazy module has no shape yet. Run one forward pass on a plain "
                               "tensor first (it infers the shapes), then port the module.")
    converted: Dict[int, tuple] = {}  # id(original) -> (original, its tracer): tied weights stay one object
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                sub._parameters[name] = _converted(param, converted, as_parameter)
        for name, buffer in sub._buffers.items():
            if buffer is not None:
                sub._buffers[name] = _converted(buffer, converted, as_buffer)
        _swap(sub)
        if _plain_state_dict not in sub._state_dict_hooks.values():
            sub.register_state_dict_post_hook(_plain_state_dict)
        if _ported_after_loading not in sub._load_state_dict_post_hooks.values():
            sub.register_load_state_dict_post_hook(_ported_after_loading)
        if not isinstance(sub, Module):
            _join_module_stack(sub)
    return module


def _ported_after_loading(sub: torch.nn.Module, incompatible_keys: object) -> None:
    """load_state_dict(..., assign=True) puts the loaded tensors themselves in place (torch.nn.Parameters, plain
    buffers): they are turned into tracers again, or the module would train on torch's autograd. New objects
    sharing their memory: a Parameter loaded from another model's state_dict(keep_vars=True) stays that model's."""
    for name, param in sub._parameters.items():
        if param is not None and not isinstance(param, Parameter):
            with plain_torch():
                requires_grad = param.requires_grad
            sub._parameters[name] = Parameter(param.detach(), requires_grad)
    for name, buffer in sub._buffers.items():
        if buffer is not None and not isinstance(buffer, tracer):
            sub._buffers[name] = as_buffer(buffer)


def _join_module_stack(sub: torch.nn.Module) -> None:
    """sub's forward runs with sub on the module stack, so traces and drawings know each op's module (a copy made by
    copy.copy shares its original's forward object: porting the copy gives it its own)."""
    own = sub.__dict__.get("forward")  # a forward set on the instance itself runs inside, in the class's stead
    if isinstance(own, ForwardInModule):
        if own.module is sub:
            return
        own = own.own
    sub.__dict__["forward"] = ForwardInModule(sub, own)


def as_parameter(param: torch.Tensor) -> Parameter:
    """`param` itself turned into a tt.nn.Parameter (so an optimizer created before porting, which holds this
    object, updates the model), with its requires_grad and any gradient torch already accumulated. A tensor of
    another class becomes a tt.nn.Parameter sharing its storage; a tt Parameter is kept as it is."""
    if isinstance(param, Parameter):
        return param
    with plain_torch():
        requires_grad, grad = param.requires_grad, param.grad
        if type(param) is not torch.nn.Parameter:
            ported = Parameter(param, requires_grad)
        else:  # the same object: torch's autograd switched off, then the class changed in place
            param.grad = None
            param.requires_grad_(False)
            param.__class__ = Parameter
            ported = param.requires_grad_(requires_grad)
    ported.grad = grad
    return ported


def as_buffer(buffer: torch.Tensor) -> tracer:
    """A tracer without gradient sharing `buffer`'s storage (a tracer is kept as it is)."""
    return buffer if isinstance(buffer, tracer) else as_tracer(buffer)


def _converted(t: torch.Tensor, converted: Dict[int, tuple], convert: Callable[[torch.Tensor], torch.Tensor]
               ) -> torch.Tensor:
    """convert(t), once per tensor object (the original is kept alive with it, so its id is not reused)."""
    if id(t) not in converted:
        converted[id(t)] = t, convert(t)
    return converted[id(t)][1]


def _swap(sub: torch.nn.Module) -> None:
    """Give a layer that torchtrace cannot see into the tt.nn class that replaces its forward."""
    cls = type(sub)
    for torch_cls, tt_cls in SWAPS.items():
        if isinstance(sub, torch_cls) and not isinstance(sub, tt_cls):
            if cls is not torch_cls and cls not in _MIXED:
                body = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__reduce_ex__": _reduce_mixed}
                _MIXED[cls] = type(cls.__name__, (cls, tt_cls), body)
            sub.__class__ = tt_cls if cls is torch_cls else _MIXED[cls]
            if hasattr(sub, "_init_flat_weights"):
                sub._init_flat_weights()  # RNNBase keeps a list of its weights: point it at the tracers
            return


def _reduce_mixed(module: torch.nn.Module, protocol: int) -> tuple:
    """Pickle a swapped user subclass as the user's class (pickle finds that one by name); loading swaps it again."""
    return _unpickle_mixed, (type(module).__bases__[0], module.__getstate__())


def _unpickle_mixed(cls: type, state: dict) -> torch.nn.Module:
    module = cls.__new__(cls)
    module.__setstate__(state)
    _swap(module)
    return module


def _plain_state_dict(module: torch.nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict() holds plain tensors; keep_vars=True (the values are the tracers themselves) keeps them."""
    own = {id(t) for t in (*module._parameters.values(), *module._buffers.values())}
    for name in (*module._parameters, *module._buffers):
        value = state.get(prefix + name)
        if isinstance(value, tracer) and id(value) not in own:
            with plain_torch():
                state[prefix + name] = value.as_subclass(torch.Tensor)
