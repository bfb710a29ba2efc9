"""tt.nn.Module: a torch.nn.Module whose parameters are tracers; tt.nn.Model, the original torchtrace's name for it.

A parameter is a `Parameter`: a tracer that torch's Module machinery accepts as a `torch.nn.Parameter`
(torch's Parameter metaclass answers `isinstance(p, torch.nn.Parameter)` with the `_is_param` flag), so
named_parameters, state_dict, load_state_dict, to(), double(), deepcopy and the optimizers all work,
while torch's own requires_grad stays False underneath and gradients come from torchtrace's engine.
"""
from typing import Any, Callable, Iterable, List, Optional

import torch

from torchtrace.autograd.dispatch import NON_DIFFERENTIABLE, run_rule
from torchtrace.autograd.function import Function
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.tensor_protocols import own_attributes
from torchtrace.tracer import tracer

# torch.nn.init's initialisers fill a tensor in place under torch.no_grad(): on tracers they record nothing.
# So torch's layers, built with tracer parameters, draw exactly torch's initial values for a given seed.
NON_DIFFERENTIABLE.update(
    getattr(torch.nn.init, name) for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")
)


class Parameter(tracer):
    """A leaf tracer that torch.nn.Module registers as a parameter (requires_grad=True by default).

    `Parameter(tensor)` shares the tensor's storage, as `torch.nn.Parameter` does.
    """

    _is_param = True  # torch.nn.Parameter's metaclass: isinstance(p, torch.nn.Parameter) is True

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> "Parameter":
        if data is None:
            data = torch.empty(0)
        elif not isinstance(data, torch.Tensor):
            data = tracer(data)
        with plain_torch():
            param = torch.Tensor.detach(data).as_subclass(cls)
        return param.requires_grad_(requires_grad)

    def detach(self) -> "Parameter":
        """A tracer sharing the data that is not a parameter (as torch's Parameter.detach() is a plain tensor), of
        this class only so that `torch.nn.Parameter(p)` accepts it (torch requires detach() to keep the class of a
        tensor subclass: parametrizations such as weight_norm re-wrap a parameter that way)."""
        with plain_torch():
            detached = torch.Tensor.detach(self).as_subclass(type(self))
        detached._is_param = False
        return detached

    def __repr__(self, **kwargs: Any) -> str:
        with plain_torch():
            data = torch.Tensor.detach(self).as_subclass(tracer)
        data._tt_requires_grad = self._tt_requires_grad
        return ("Parameter containing:\n" if self._is_param else "") + data.__repr__(**kwargs)

    def __reduce_ex__(self, protocol: int) -> Any:
        if not self._is_param:
            return tracer.__reduce_ex__(self, protocol)
        with plain_torch():
            plain = torch.Tensor.detach(self).as_subclass(torch.Tensor)
        return _rebuild_parameter, (plain, self._tt_requires_grad, own_attributes(self))


def _rebuild_parameter(data: torch.Tensor, requires_grad: bool, attributes: Optional[dict] = None) -> Parameter:
    """Unpickle a parameter with the attributes a user set on it (torch keeps them: `p.no_decay = True`)."""
    p = Parameter(data, requires_grad)
    p.__dict__.update(attributes or {})
    return p


def original_form(layer: Any) -> Optional[str]:
    """The original torchtrace's one-line description of a layer, or None when it has none."""
    describe = getattr(layer, "original_repr", None)
    return describe() if callable(describe) else None


def sequence_repr(layers: Iterable[Any]) -> Optional[str]:
    """`Sequence(` / `    (0):Linear layer (8 X 256)` / ... / `)`; None when some layer has no original form."""
    lines = ["Sequence("]
    for i, layer in enumerate(layers):
        text = original_form(layer)
        if text is None:
            return None
        lines.append(f"    ({i}):" + text.replace("\n", "\n    "))
    lines.append(")")
    return "\n".join(lines)


class PlainInput(Function):
    """y = x, a plain torch leaf requiring grad that enters a module, now a tracer  ->  dy/dx = 1 (into x.grad)"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


_SEQUENCES = (tuple, list)


def _is_plain_leaf(value: Any) -> bool:
    return type(value) is torch.Tensor and value.requires_grad and value.grad_fn is None


def _plain_leaves_as_tracers(module: torch.nn.Module, args: tuple) -> Optional[tuple]:
    """The arguments of a module with tracer parameters, each plain torch leaf requiring grad (or one inside a
    tuple/list argument, as an RNN's (h0, c0)) replaced by a tracer whose gradient torchtrace accumulates into the
    leaf's .grad, as when a plain leaf meets a tracer in an op: so torch code run on the input inside the module (a
    transpose, a module backward hook) is recorded by torchtrace. None: nothing to replace (a module whose
    parameters are plain, as under torch.func.functional_call, stays torch's)."""
    for a in args:
        if _is_plain_leaf(a) or (type(a) in _SEQUENCES and any(map(_is_plain_leaf, a))):
            break
    else:
        return None
    if not torch.is_grad_enabled() or not any(isinstance(p, tracer) for p in module.parameters()):
        return None

    def enter(value: Any) -> Any:
        return run_rule(tracer, PlainInput, None, (value,), {}) if _is_plain_leaf(value) else value

    return tuple(type(a)(map(enter, a)) if type(a) in _SEQUENCES else enter(a) for a in args)


def call_in_module(module: torch.nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
    """forward(*args, **kwargs) with `module` on the module stack: the nodes recorded meanwhile belong to it (their
    innermost running module). Plain torch leaves requiring grad among its arguments become tracers first; the node
    it returned notes the call's shapes when its class asks for them (`trace_grad_shapes`: trace's GRAD: line)."""
    outer = STATE.module_stack  # a tuple, replaced (never changed) on entry and exit: nodes share it as it is
    STATE.module_stack = (*outer, module)
    try:
        for a in args:  # a plain loop, the common case first: this runs on every module call
            if (type(a) is torch.Tensor and a.requires_grad) or type(a) in _SEQUENCES:
                args = _plain_leaves_as_tracers(module, args) or args
                break
        out = forward(*args, **kwargs)
    finally:
        STATE.module_stack = outer
    if isinstance(module, Module) and module.trace_grad_shapes and args and isinstance(args[0], torch.Tensor):
        node = getattr(out, "_tt_node", None)
        if node is not None and node.module_path[-1:] == (module,):
            with plain_torch():
                node.note(call_shapes=(args[0].shape, out.shape))
    return out


class ForwardInModule:
    """A ported module's `forward` (set on the instance): its class's forward (or the one the user had set on the
    instance, `own`), run by `call_in_module`.

    torch's Module.__call__ calls `self.forward`, so the module joins the module stack without forward hooks (which
    would send every call down torch's slower hooked path). `deepcopy` and pickling copy it with its module.
    """

    __slots__ = ("module", "own")

    def __init__(self, module: torch.nn.Module, own: Optional[Callable] = None):
        self.module, self.own = module, own

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        return call_in_module(module, self.own or type(module).forward.__get__(module), args, kwargs)

    @property
    def __wrapped__(self) -> Callable:
        """The forward it runs (what inspect.signature and help() show)."""
        return self.own or type(self.module).forward.__get__(self.module)

    def __reduce__(self) -> tuple:
        return ForwardInModule, (self.module, self.own)


class Module(torch.nn.Module):
    """A torch.nn.Module whose parameters are `Parameter` tracers.

    torch.nn.Parameters assigned to it (by torch's own layer code, or by load_state_dict(assign=True))
    become tracer Parameters sharing the same storage. state_dict() holds plain tensors, so it loads
    into the torch twin and survives torch.save / torch.load(weights_only=True). A layer (a module
    without sub-modules) is what traces print; every node recorded while a module runs has `node.module`,
    the innermost tt.nn module running at the time.
    """

    trace_grad_shapes = False  # True: the backprop trace shows the layer's GRAD: out -> in shapes (conv layers)

    def register_parameter(self, name: str, param: Optional[torch.Tensor]) -> None:
        if isinstance(param, torch.nn.Parameter) and not isinstance(param, Parameter):
            with plain_torch():
                requires_grad = param.requires_grad
            param = Parameter(param, requires_grad)
        super().register_parameter(name, param)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if keep_vars:
            return
        for name in [*self._parameters, *self._buffers]:
            value = destination.get(prefix + name)
            if isinstance(value, tracer):
                with plain_torch():
                    destination[prefix + name] = value.as_subclass(torch.Tensor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return call_in_module(self, super().__call__, args, kwargs)

    def original_repr(self) -> Optional[str]:
        """How the original torchtrace printed this layer inside a `Sequence(...)`; None: it has no such form.

        A layer without sub-modules prints as torch prints it (`ReLU()`); layers override this
        (`Linear layer (98 X 1)`, `Conv2d 3 -> 8`), containers list their layers.
        """
        return None if self._modules else torch.nn.Module.__repr__(self)


def original_or_torch_repr(module: torch.nn.Module) -> str:
    """The original `Sequence(...)` printing when every layer has an original form, torch's printing otherwise."""
    return original_form(module) or torch.nn.Module.__repr__(module)


class Model(Module):
    """The original torchtrace's Module: attributes may be assigned before `super().__init__()`.

    An optional `construct()` returns the ordered layers (already assigned as attributes): `print(model)`
    lists them as `Sequence(...)`, and, unless `forward` is overridden, the model runs them one after
    the other.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Model":
        model = super().__new__(cls)
        torch.nn.Module.__init__(model)  # so attributes can be set before the subclass calls super().__init__()
        return model

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Initialised in __new__ already: keeps every attribute assigned before this call."""

    def construct(self) -> Optional[List[torch.nn.Module]]:
        """Override to return the ordered layers of the model."""
        return None

    def layers(self) -> List[torch.nn.Module]:
        """construct()'s layers, or the sub-modules in the order they were assigned."""
        layers = self.construct()
        return list(self._modules.values()) if layers is None else list(layers)

    def forward(self, *inputs: Any) -> Any:
        layers = self.construct()
        if not layers:
            raise NotImplementedError(f"{type(self).__name__} defines neither forward() nor construct()")
        out = layers[0](*inputs)
        for layer in layers[1:]:
            out = layer(out)
        return out

    def original_repr(self) -> Optional[str]:
        return sequence_repr(self.layers())

    __repr__ = original_or_torch_repr
