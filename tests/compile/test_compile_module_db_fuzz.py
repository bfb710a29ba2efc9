"""PyTorch's own module_db trained under tt.compile, side by side with eager torchtrace and torch autograd.

Each module of `torch.testing._internal.common_modules.module_db` (float64, CPU) is built from its ModuleInfo's
constructor arguments, copied three times (torch, eager torchtrace, compiled torchtrace) and trained for several
steps: the compiled function is forward + loss (then backward and a tt.optim step outside it), or the whole step
(zero_grad, forward, backward, optimizer.step inside it). Inputs change values every call and sometimes shape,
`requires_grad` and train/eval mode; the optimizer (SGD with momentum, Adam, AdamW, RMSprop) rotates by module.
After every step: the loss, every parameter's .grad, the inputs' .grad, the parameters and buffers. Compiled
against eager: bit for bit. Compiled against torch: within 1e-10 relative (different kernels and summation orders).

A parameterless module gets a learnable factor in (0.9, 1) on its first floating input (so there is something to
train). Exemptions from the torch comparison, each with its reason, are in `_torch_exempt`.
The second half drives hand-written training loops through what the module sweep cannot: torch's random stream
seeded once, BatchNorm momentum / eval switches, frozen parameters, attribute changes, packed sequences, carried
hidden state, validation under no_grad, hooks, gradient clipping and schedulers, a gradient penalty.
"""
import copy
import warnings
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchtrace as tt
from torchtrace.port import port

DT = torch.float64
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
SIDES = ("torch", "eager", "compiled")


# ---------------------------------------------------------------------------------------------------- helpers

def plain(t: Any) -> Any:
    return t.as_subclass(torch.Tensor).detach() if isinstance(t, torch.Tensor) else t


def leaves(o: Any) -> List[torch.Tensor]:
    if isinstance(o, torch.Tensor):
        return [o]
    if isinstance(o, (tuple, list)):
        return [t for x in o for t in leaves(x)]
    if isinstance(o, dict):
        return [t for x in o.values() for t in leaves(x)]
    return []


def tree_map(o: Any, f: Callable) -> Any:
    if isinstance(o, torch.Tensor):
        return f(o)
    if isinstance(o, (tuple, list)):
        return type(o)(tree_map(x, f) for x in o)
    if isinstance(o, dict):
        return {k: tree_map(v, f) for k, v in o.items()}
    return o


def weighted(o: torch.Tensor) -> torch.Tensor:
    """A fixed, non-uniform weighting of o's elements (every element gets its own gradient)."""
    w = torch.cos(torch.arange(o.numel(), dtype=o.dtype) * 0.7 + 0.3).reshape(o.shape)
    return (o * w).sum()


def loss_of(out: Any) -> Any:
    total: Any = 0
    for o in leaves(out):
        if o.is_floating_point() and o.requires_grad:
            total = total + weighted(o) + 0.1 * (o * o).mean()
    return total


def make_optimizer(kind: str, params: list, lib: Any) -> Any:
    if kind == "sgd":
        return lib.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adam":
        return lib.Adam(params, lr=0.01)
    if kind == "adamw":
        return lib.AdamW(params, lr=0.01, weight_decay=0.1)
    return lib.RMSprop(params, lr=0.01)


def leaf(side: str, t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    t = t.detach().clone()
    if not (requires_grad and t.is_floating_point()):
        return t
    return t.requires_grad_() if side == "torch" else tt.as_tracer(t, requires_grad=True)


def randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(500 + seed), dtype=DT)


def assert_bitwise(got: Any, expected: Any, what: str) -> None:
    got, expected = plain(got), plain(expected)
    assert (got is None) == (expected is None), what
    if got is not None:
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def assert_like_torch(got: Any, expected: Any, what: str, mask: Optional[torch.Tensor] = None) -> None:
    got, expected = plain(got), plain(expected)
    assert (got is None) == (expected is None), what
    if got is None:
        return
    if mask is not None:
        got, expected = got[mask], expected[mask]
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10, equal_nan=True, msg=lambda m: f"{what}: {m}")


class Snapshot:
    """What one side has after one step: loss, parameter grads, input grads, parameters, buffers."""

    def __init__(self, loss: Any, model: nn.Module, inputs: Any):
        self.loss = plain(loss).clone() if isinstance(loss, torch.Tensor) else loss
        self.grads = [None if p.grad is None else plain(p.grad).clone() for p in model.parameters()]
        self.input_grads = [None if t.grad is None else plain(t.grad).clone() for t in leaves(inputs)
                            if t.is_leaf and t.requires_grad]
        self.params: List[torch.Tensor] = []
        self.buffers: List[torch.Tensor] = []

    def after_step(self, model: nn.Module) -> "Snapshot":
        self.params = [plain(p).clone() for p in model.parameters()]
        self.buffers = [plain(b).clone() for b in model.buffers()]
        return self


class QuietGradients:
    """Elements of a parameter whose torch gradient has been roundoff (|g| <= 1e-13 (1 + max|g|)) at every step so
    far. Their true gradient is zero (attention's key bias: softmax ignores a shift of a row of scores), so Adam-like
    optimizers, which divide by sqrt(v), turn two engines' different roundoff into steps of size lr: such elements'
    values are not compared with torch's (their gradients are, at 1e-10)."""

    def __init__(self) -> None:
        self.masks: Dict[int, torch.Tensor] = {}

    def update(self, grads: List[Optional[torch.Tensor]]) -> None:
        for i, g in enumerate(grads):
            if g is None:
                continue
            quiet = g.abs() <= 1e-13 * (1 + g.abs().max())
            self.masks[i] = self.masks.get(i, quiet) & quiet

    def compared(self, i: int, kind: str) -> Optional[torch.Tensor]:
        return ~self.masks[i] if kind != "sgd" and i in self.masks else None


def compare_step(step: int, snaps: Dict[str, Snapshot], quiet: QuietGradients, optimizer: str,
                 exempt: Callable[[str], bool] = lambda what: False) -> None:
    ours, eager, ref = snaps["compiled"], snaps["eager"], snaps["torch"]
    assert_bitwise(ours.loss, eager.loss, f"step {step}: loss vs eager")
    assert len(ours.grads) == len(eager.grads) and len(ours.input_grads) == len(eager.input_grads)
    assert len(ours.input_grads) == len(ref.input_grads)
    pairs = [("grad", ours.grads, eager.grads, ref.grads), ("input grad", ours.input_grads, eager.input_grads,
                                                            ref.input_grads),
             ("param", ours.params, eager.params, ref.params), ("buffer", ours.buffers, eager.buffers, ref.buffers)]
    for kind, got, same, expected in pairs:
        for i, (a, b) in enumerate(zip(got, same)):
            assert_bitwise(a, b, f"step {step}: {kind} {i} vs eager")
    if isinstance(ref.loss, torch.Tensor):
        assert_like_torch(ours.loss, ref.loss, f"step {step}: loss vs torch")
    quiet.update(ref.grads)
    for kind, got, _, expected in pairs:
        for i, (a, b) in enumerate(zip(got, expected)):
            if not exempt(f"{kind} {i}"):
                mask = quiet.compared(i, optimizer) if kind == "param" else None
                assert_like_torch(a, b, f"step {step}: {kind} {i} vs torch", mask)


# ------------------------------------------------------------------------------------------ the module_db sweep

def _module_db() -> list:
    from torch.testing._internal.common_modules import module_db
    return [info for info in module_db if info.name != "nn.LinearCrossEntropyLoss"]  # 857 inputs: too slow here


MODULES = _module_db()


class Scaled(nn.Module):
    """A parameterless module behind a learnable factor in (0.9, 1) on its first floating input: the factor keeps
    signs and [0, 1] ranges (BCELoss's input), so every module_db input stays valid. CTC's log-probabilities are
    renormalised after it (torch's ctc_loss gradient is the derivative only for normalised log_probs: nn/ctc.py)."""

    def __init__(self, inner: nn.Module, log_softmax: bool = False):
        super().__init__()
        self.inner, self.log_softmax = inner, log_softmax
        self.p = nn.Parameter(torch.zeros(()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args_list = list(args)
        for i, a in enumerate(args_list):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a * (0.9 + 0.1 * torch.sigmoid(self.p))
                args_list[i] = a.log_softmax(-1) if self.log_softmax else a
                break
        return self.inner(*args_list, **kwargs)


def _groups(info: Any) -> list:
    """module_db's inputs grouped by constructor: [(constructor input, [forward inputs])]."""
    torch.manual_seed(0)
    found: dict = {}
    for mi in info.module_inputs_func(info, device="cpu", dtype=DT, requires_grad=True, training=True):
        if mi.forward_input is not None:
            key = repr((mi.constructor_input.args, mi.constructor_input.kwargs))
            found.setdefault(key, (mi.constructor_input, []))[1].append(mi.forward_input)
    return list(found.values())


def _inputs(forward_input: Any, step: int, side: str, requires_grad: bool) -> tuple:
    """The forward input with new values for this step: floats scaled by (0.9, 1) (signs and ranges kept), integer
    tensors redrawn between their min and max, boolean masks permuted along their last dim on odd steps."""
    g = torch.Generator().manual_seed(1000 + step)

    def each(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():  # a float module_db keeps plain (a target) stays plain
            return leaf(side, t * (0.9 + 0.1 * torch.rand(t.shape, generator=g, dtype=t.dtype)),
                        requires_grad and t.requires_grad)
        if t.dtype == torch.bool:
            return t[..., torch.randperm(t.shape[-1], generator=g)].clone() if t.dim() and step % 2 else t.clone()
        if t.numel() > 1:
            return torch.randint(int(t.min()), int(t.max()) + 1, t.shape, generator=g, dtype=t.dtype)
        return t.clone()

    return tree_map(forward_input.args, each), tree_map(forward_input.kwargs, each)


def _torch_exempt(info: Any, constructor: Any) -> Callable[[str], bool]:
    if info.name == "nn.PoissonNLLLoss" and constructor.kwargs.get("full"):
        # torch's composite differentiates target * log(target) where target == 0 before masking it: NaN; the rule
        # (nn/loss_probabilistic.py) returns the masked term's zero there. An engine choice, not the compiler's.
        return lambda what: what.startswith("input grad")
    return lambda what: False


FORWARD_PLAN = [0, 0, 1, 0, 1, 1]  # which forward input of the group (another shape, where module_db has one)
REQUIRES_GRAD_PLAN = [True, True, True, False, True, True]
TRAIN_PLAN = [True, True, False, True, False, True]


def train_module(info: Any, constructor: Any, forward_inputs: list, optimizer: str, whole: bool,
                 toggles: bool) -> int:
    """Train one module_db module on the three sides; compare every step. Returns the compiled calls replayed."""
    torch.manual_seed(0)
    base = info.module_cls(*constructor.args, **constructor.kwargs).to(DT)
    if "Lazy" in info.name:  # materialise the parameters first, with torch
        with torch.no_grad():
            base(*forward_inputs[0].args, **forward_inputs[0].kwargs)
    if not list(base.parameters()):
        base = Scaled(base, log_softmax=info.name == "nn.CTCLoss").to(DT)
    models = {"torch": copy.deepcopy(base), "eager": port(copy.deepcopy(base)), "compiled": port(copy.deepcopy(base))}
    optimizers = {side: make_optimizer(optimizer, list(m.parameters()), torch.optim if side == "torch" else tt.optim)
                  for side, m in models.items()}

    def function(side: str) -> Callable:
        m, opt = models[side], optimizers[side]

        def forward_and_loss(*args: Any, **kwargs: Any) -> Any:
            return loss_of(m(*args, **kwargs))

        def training_step(*args: Any, **kwargs: Any) -> Any:
            opt.zero_grad()
            loss = loss_of(m(*args, **kwargs))
            loss.backward()
            opt.step()
            return loss.detach()

        return training_step if whole else forward_and_loss

    functions = {side: function(side) for side in SIDES}
    functions["compiled"] = tt.compile(functions["compiled"], _inputs(forward_inputs[0], 0, "compiled", True)[0])
    quiet, exempt = QuietGradients(), _torch_exempt(info, constructor)
    for step in range(len(FORWARD_PLAN)):
        forward_input = forward_inputs[FORWARD_PLAN[step] % len(forward_inputs)]
        requires_grad = REQUIRES_GRAD_PLAN[step] if toggles else True
        snaps = {}
        for side in SIDES:
            m = models[side]
            m.train(TRAIN_PLAN[step] if toggles else True)
            args, kwargs = _inputs(forward_input, step, side, requires_grad)
            torch.manual_seed(7 + step)
            if not whole:
                optimizers[side].zero_grad()
            loss = functions[side](*args, **kwargs)
            if not whole:
                loss.backward()
            snaps[side] = Snapshot(loss, m, (args, kwargs))
            if not whole:
                optimizers[side].step()
            snaps[side].after_step(m)
        compare_step(step, snaps, quiet, optimizer, exempt)
    return functions["compiled"].replayed


@pytest.mark.parametrize("index", range(len(MODULES)), ids=[info.name for info in MODULES])
def test_module_db_trains_compiled_as_eager_and_torch(index):
    """Per module, up to three constructors: (1) forward + loss compiled, with shape, requires_grad and train/eval
    changes, then the whole step compiled; (2) the whole step with the changes; (3) forward + loss."""
    info = MODULES[index]
    runs = [(0, False, True), (0, True, False), (1, True, True), (2, False, False)]
    groups = _groups(info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # module_db's modules warn (lazy modules, nested tensors, ...)
        for group, whole, toggles in runs:
            if group < len(groups):
                constructor, forward_inputs = groups[group]
                optimizer = OPTIMIZERS[(index + group + whole) % 4]
                replayed = train_module(info, constructor, forward_inputs, optimizer, whole, toggles)
                assert replayed >= 2, f"{info.name}: only {replayed} of {len(FORWARD_PLAN)} calls replayed"


# ------------------------------------------------------------------------------------- hand-written loops

def three_way(build: Callable[[], nn.Module], make_inputs: Callable[[int, str], tuple], loss_fn: Callable,
              optimizer: str = "sgd", steps: int = 6, mutate: Optional[Callable] = None, whole: bool = False,
              seed_each_call: bool = True) -> Any:
    """Train build() on the three sides with loss_fn(model, *make_inputs(step, side)); compare every step.
    mutate(model, step) runs on each side before its call (attribute changes, freezing, modes). With
    seed_each_call=False torch's stream is seeded once, and each side keeps its own (the sides run in turn)."""
    torch.manual_seed(0)
    base = build().to(DT)
    models = {"torch": copy.deepcopy(base), "eager": port(copy.deepcopy(base)), "compiled": port(copy.deepcopy(base))}
    optimizers = {side: make_optimizer(optimizer, list(m.parameters()), torch.optim if side == "torch" else tt.optim)
                  for side, m in models.items()}
    functions: Dict[str, Callable] = {}
    for side in SIDES:
        m, opt = models[side], optimizers[side]

        def training_step(*args: Any, m: nn.Module = m, opt: Any = opt) -> Any:
            opt.zero_grad()
            loss = loss_fn(m, *args)
            loss.backward()
            opt.step()
            return loss.detach()

        functions[side] = training_step if whole else (lambda *args, m=m: loss_fn(m, *args))
    functions["compiled"] = tt.compile(functions["compiled"], make_inputs(0, "compiled"))
    streams = {side: torch.Generator().manual_seed(4321).get_state() for side in SIDES}
    quiet = QuietGradients()
    for step in range(steps):
        snaps = {}
        for side in SIDES:
            m = models[side]
            if mutate is not None:
                mutate(m, step)
            args = make_inputs(step, side)
            if seed_each_call:
                torch.manual_seed(100 + step)
            else:
                torch.set_rng_state(streams[side])
            if not whole:
                optimizers[side].zero_grad()
            loss = functions[side](*args)
            if not whole:
                loss.backward()
            if not seed_each_call:
                streams[side] = torch.get_rng_state()
            snaps[side] = Snapshot(loss, m, args)
            if not whole:
                optimizers[side].step()
            snaps[side].after_step(m)
        compare_step(step, snaps, quiet, optimizer)
    return functions["compiled"]


def inputs_of(*shape: int, requires_grad: Callable[[int], bool] = lambda step: True) -> Callable:
    return lambda step, side: (leaf(side, randn(step, *shape), requires_grad(step)),)


def weighted_out(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = m(x)
    return weighted(out[0] if isinstance(out, tuple) else out)


RANDOM_LAYERS = {
    "rrelu": (lambda: nn.Sequential(nn.Linear(4, 6), nn.RReLU(0.1, 0.4), nn.Linear(6, 2)), (5, 4)),
    "dropouts": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.3), nn.AlphaDropout(0.2), nn.Linear(6, 6),
                                       nn.FeatureAlphaDropout(0.2), nn.Linear(6, 2)), (5, 4)),
    "dropout2d": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.Dropout2d(0.3), nn.Conv2d(4, 2, 1)), (2, 2, 6, 6)),
    "transformer-encoder-layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True,
                                                                     activation="gelu"), (2, 5, 8)),
    "gru-dropout": (lambda: nn.GRU(4, 3, num_layers=3, dropout=0.4), (5, 2, 4)),
    "lstm-dropout-bidirectional-proj": (lambda: nn.LSTM(4, 3, num_layers=2, dropout=0.4, bidirectional=True,
                                                        proj_size=2), (5, 2, 4)),
    "fractional-max-pool2d": (lambda: nn.Sequential(nn.Conv2d(2, 3, 1), nn.FractionalMaxPool2d(2, output_size=3)),
                              (2, 2, 7, 7)),
}
def _random_layer_cases() -> list:
    return [pytest.param(name, whole, id=f"{name}-{'whole-step' if whole else 'forward'}")
            for name in RANDOM_LAYERS for whole in (False, True)]


@pytest.mark.parametrize("name, whole", _random_layer_cases())
def test_random_layers_seeded_once_train_as_eager_and_torch(name, whole):
    """torch.manual_seed once, then six steps: every side's random stream must advance as eager's does."""
    build, shape = RANDOM_LAYERS[name]
    compiled = three_way(build, inputs_of(*shape), weighted_out, "adam" if whole else "sgd", whole=whole,
                         seed_each_call=False)
    assert compiled.replayed >= 4


RANDOM_STREAM_CASES = {
    "dropout": lambda w: F.dropout(w, 0.3).sum(),
    "rrelu": lambda w: F.rrelu(w - 0.5, training=True).sum(),
    "normal": lambda w: torch.normal(w, w).sum(),
    "bernoulli": lambda w: (torch.bernoulli(w.clamp(0, 1)) * w).sum(),
    "poisson": lambda w: (torch.poisson(w) * w).sum(),
    "alpha-dropout": lambda w: F.alpha_dropout(w, 0.3, True).sum(),
    "dropout2d": lambda w: F.dropout2d(w, 0.3).sum(),
    "normal-rsample": lambda w: torch.distributions.Normal(w, 1.0).rsample().sum(),
    "fractional-max-pool2d": lambda w: F.fractional_max_pool2d(w, 2, output_size=3).sum(),
    "fractional-max-pool3d": lambda w: F.fractional_max_pool3d(w.unsqueeze(0), (1, 2, 2), output_size=(1, 3, 3)).sum(),
    "standard-gamma": lambda w: torch._standard_gamma(w).sum(),
    "gamma-rsample": lambda w: torch.distributions.Gamma(w[:, :1].exp(), 1.0).rsample().sum(),  # another shape:
    # step_code's cache would otherwise hold standard-gamma's trace, and nothing would be traced again
}
@pytest.mark.parametrize("name", list(RANDOM_STREAM_CASES))
def test_a_recording_call_draws_torchs_random_stream_once(name):
    """The first (recording) compiled call leaves torch's generator where eager leaves it, and so do later calls."""
    f = RANDOM_STREAM_CASES[name]
    x = torch.rand(2, 2, 7, 7, dtype=DT) + 0.1

    def after(fn: Callable) -> tuple:
        torch.manual_seed(1)
        w = tt.as_tracer(x.clone(), requires_grad=True)
        out = fn(w)
        out.backward()
        return plain(out).clone(), plain(w.grad).clone(), torch.get_rng_state()

    eager = after(f)
    compiled = tt.compile(f, (x,))
    for call in range(3):
        got = after(compiled)
        for a, b, what in zip(got, eager, ("output", "gradient", "torch's generator state after the call")):
            assert torch.equal(a, b), f"call {call}: {what} differs from eager"


def _batch_norm_changes(m: nn.Module, step: int) -> None:
    m[1].momentum = [0.1, None, None, 0.5, None, 0.1, None, 0.3][step]  # None: cumulative average
    m[1].track_running_stats = step != 4
    m.train(step not in (3, 6))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("whole", [False, True], ids=["forward", "whole-step"])
def test_batch_norm_momentum_tracking_and_mode_changes(optimizer, whole):
    build = lambda: nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Tanh())  # noqa: E731
    compiled = three_way(build, inputs_of(5, 4), lambda m, x: (m(x) ** 2).sum(), optimizer, steps=8,
                         mutate=_batch_norm_changes, whole=whole)
    assert compiled.replayed >= 4


def _freeze(m: nn.Module, step: int) -> None:
    m[0].weight.requires_grad_(step not in (2, 3))
    m[2].bias.requires_grad_(step % 2 == 0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("whole", [False, True], ids=["forward", "whole-step"])
def test_parameters_frozen_and_unfrozen_between_calls(optimizer, whole):
    build = lambda: nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 2))  # noqa: E731
    compiled = three_way(build, inputs_of(5, 4), lambda m, x: (m(x) ** 2).sum(), optimizer, mutate=_freeze,
                         whole=whole)
    assert compiled.replayed >= 2


class Head(nn.Module):
    """A Linear, then the layer under test (of y, or of y and a target)."""

    def __init__(self, layer: Any, takes_target: bool = False):
        super().__init__()
        self.lin, self.layer, self.takes_target = nn.Linear(4, 6), layer, takes_target

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return self.layer(y, t) if self.takes_target else self.layer(y)


def _head_inputs(step: int, side: str) -> tuple:
    """Odd steps put exact zeros into x (kinks of the activations at zero)."""
    x = randn(step, 5, 4) * 2
    if step % 2:
        x = torch.where(randn(step + 1, 5, 4) > 0, 0.0, x)
    return leaf(side, x), randn(step + 33, 5, 6)


ATTRIBUTE_CHANGES = {  # a layer and one of its attributes, set to these values before each call
    "SmoothL1Loss.beta": (lambda: nn.SmoothL1Loss(beta=1.0), True, "beta", [1.0, 0.5, 0.0, 1.0, 0.0, 2.0]),
    "HuberLoss.delta": (lambda: nn.HuberLoss(delta=1.0), True, "delta", [1.0, 0.3, 1.0, 2.5, 0.3, 1.0]),
    "LeakyReLU.negative_slope": (lambda: nn.LeakyReLU(0.1), False, "negative_slope", [0.1, 0.0, 1.0, -0.5, 0.1, 0.0]),
    "ELU.alpha": (lambda: nn.ELU(), False, "alpha", [1.0, 0.0, 2.0, 1.0, -1.0, 0.5]),
    "Softplus.threshold": (lambda: nn.Softplus(), False, "threshold", [20.0, 0.5, 0.0, 20.0, 1.0, 0.5]),
    "Hardtanh.max_val": (lambda: nn.Hardtanh(), False, "max_val", [1.0, 0.2, 3.0, 1.0, 0.0, 0.5]),
    "Threshold.value": (lambda: nn.Threshold(0.1, 20.0), False, "value", [20.0, 0.0, -1.0, 20.0, 1.0, 0.0]),
    "Softshrink.lambd": (lambda: nn.Softshrink(), False, "lambd", [0.5, 0.0, 1.0, 0.5, 2.0, 0.1]),
    "GELU.approximate": (lambda: nn.GELU(), False, "approximate", ["none", "tanh", "none", "tanh", "tanh", "none"]),
    "Dropout.p": (lambda: nn.Dropout(0.5), False, "p", [0.5, 1.0, 0.0, 0.5, 1.0, 0.2]),
    "Dropout.inplace": (lambda: nn.Dropout(0.5), False, "inplace", [False, True, False, True, True, False]),
    "Softmax.dim": (lambda: nn.Softmax(1), False, "dim", [1, 0, 1, -1, 0, 1]),
    "LayerNorm.eps": (lambda: nn.LayerNorm(6), False, "eps", [1e-5, 1.0, 1e-5, 10.0, 0.0, 1e-5]),
    "RMSNorm.eps": (lambda: nn.RMSNorm(6), False, "eps", [None, 1.0, None, 1e-3, 10.0, None]),
    "BatchNorm1d.eps": (lambda: nn.BatchNorm1d(6), False, "eps", [1e-5, 1.0, 1e-5, 10.0, 0.5, 1e-5]),
    "GroupNorm.eps": (lambda: nn.GroupNorm(2, 6), False, "eps", [1e-5, 1.0, 1e-5, 10.0, 0.5, 1e-5]),
    "KLDivLoss.log_target": (lambda: nn.KLDivLoss(reduction="batchmean"), True, "log_target",
                             [False, True, False, True, True, False]),
    "CrossEntropyLoss.label_smoothing": (lambda: nn.CrossEntropyLoss(), True, "label_smoothing",
                                         [0.0, 0.1, 0.0, 0.5, 0.1, 0.0]),
}


@pytest.mark.parametrize("name", ATTRIBUTE_CHANGES)
def test_a_layer_attribute_changed_between_calls(name):
    """Floats (and flags) a rule may branch on: beta 0 turns smooth L1 into L1, p = 1 drops everything, ..."""
    build, takes_target, attribute, values = ATTRIBUTE_CHANGES[name]

    def loss(m: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if name.startswith("CrossEntropy"):
            t = t.argmax(1)
        out = m(x, t)
        return weighted(out) if out.dim() else out

    def change(m: nn.Module, step: int) -> None:
        setattr(m.layer, attribute, values[step])

    compiled = three_way(lambda: Head(build(), takes_target), _head_inputs, loss, OPTIMIZERS[len(name) % 4],
                         mutate=change)
    assert compiled.replayed >= 3


LENGTHS = [[5, 2, 2], [5, 3, 1], [5, 2, 2], [4, 4, 1], [5, 3, 1], [5, 2, 2]]  # same data size, other batch_sizes


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN], ids=lambda c: c.__name__)
@pytest.mark.parametrize("whole", [False, True], ids=["forward", "whole-step"])
def test_packed_sequences_whose_batch_sizes_change_with_the_same_data_shape(cell, whole):
    def inputs(step: int, side: str) -> tuple:
        return leaf(side, randn(step, 5, 3, 4)), torch.tensor(LENGTHS[step])

    def loss(m: nn.Module, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, _ = m(pack_padded_sequence(x, lengths, enforce_sorted=False))
        return weighted(pad_packed_sequence(out, total_length=5)[0])

    build = (lambda: cell(4, 3, bidirectional=True)) if whole else (lambda: cell(4, 3, num_layers=2))
    compiled = three_way(build, inputs, loss, "rmsprop" if whole else "adam", whole=whole)
    assert compiled.replayed == 3  # steps 2, 4, 5 repeat a recorded path; the others take a new one


CLASS_WEIGHTS = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.7], dtype=DT)


@pytest.mark.parametrize("options", [{}, {"weight": CLASS_WEIGHTS}, {"label_smoothing": 0.2},
                                     {"weight": CLASS_WEIGHTS, "label_smoothing": 0.1}],
                         ids=["plain", "weight", "smoothing", "weight-smoothing"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_with_a_changing_number_of_ignored_targets(options, reduction):
    def inputs(step: int, side: str) -> tuple:
        t = torch.randint(0, 5, (6,), generator=torch.Generator().manual_seed(step))
        t[: step % 4] = -100  # 0 to 3 ignored targets: the mean's divisor changes, the shapes do not
        return leaf(side, randn(step, 6, 5)), t

    compiled = three_way(lambda: nn.Linear(5, 5), inputs,
                         lambda m, x, t: F.cross_entropy(m(x), t, reduction=reduction, **options), "adamw")
    assert compiled.replayed == 5


def _run_loop(build: Callable[[], nn.Module], optimizer: str, loop: Callable) -> None:
    """loop(side, model, optimizer, compile_or_not) -> list of tensors; the three sides' lists compared."""
    torch.manual_seed(0)
    base = build().to(DT)
    results = {}
    for side in SIDES:
        m = copy.deepcopy(base)
        if side != "torch":
            port(m)
        opt = make_optimizer(optimizer, list(m.parameters()), torch.optim if side == "torch" else tt.optim)
        maybe_compile = (lambda fn, example: tt.compile(fn, example)) if side == "compiled" else (lambda fn, _: fn)
        results[side] = [plain(t).clone() for t in loop(side, m, opt, maybe_compile)]
    assert len(results["compiled"]) == len(results["eager"]) == len(results["torch"])
    for i, (a, b, c) in enumerate(zip(results["compiled"], results["eager"], results["torch"])):
        assert_bitwise(a, b, f"value {i} vs eager")
        assert_like_torch(a, c, f"value {i} vs torch")


def _state(m: nn.Module) -> list:
    return [*m.parameters(), *(p.grad for p in m.parameters() if p.grad is not None), *m.buffers()]


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU], ids=lambda c: c.__name__)
@pytest.mark.parametrize("detach", [True, False], ids=["truncated-bptt", "bptt-over-three-calls"])
def test_hidden_state_carried_from_one_compiled_call_into_the_next(cell, detach):
    def loop(side: str, m: nn.Module, opt: Any, maybe_compile: Callable) -> list:
        def fn(x: torch.Tensor, h: Any) -> tuple:
            out, h = m(x, h)
            return (out * out.detach().sin()).sum(), h

        fn = maybe_compile(fn, (randn(0, 5, 2, 3), None))
        values: list = []
        h, pending = None, 0
        for step in range(6):
            if detach or step % 3 == 0:
                opt.zero_grad()
                pending = 0
            loss, h = fn(leaf(side, randn(step, 5, 2, 3), step % 2 == 0), h)
            pending = pending + loss
            values.append(loss)
            if detach or step % 3 == 2:
                pending.backward()
                h = tuple(t.detach() for t in h) if isinstance(h, tuple) else h.detach()
                opt.step()
                values += _state(m)
        return values

    _run_loop(lambda: cell(3, 4, num_layers=2), "adam", loop)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_validation_under_no_grad_and_hooks_added_and_removed_between_training_calls(optimizer):
    def loop(side: str, m: nn.Module, opt: Any, maybe_compile: Callable) -> list:
        fn = maybe_compile(lambda x, t: F.mse_loss(m(x), t), (randn(0, 5, 4), randn(1, 5, 2)))
        values: list = []
        handles: list = []
        for step in range(8):
            x, t = leaf(side, randn(step, 5, 4), step % 3 != 1), randn(step + 40, 5, 2)
            torch.manual_seed(step)
            if step in (2, 5):  # a validation call of the same compiled function
                m.eval()
                with torch.no_grad():
                    values.append(fn(x, t))
                m.train()
                continue
            if step == 3:
                handles.append(m[4].weight.register_hook(lambda g: g * 2))
                handles.append(m[1].register_forward_hook(lambda mod, args, out: out * 0.5))
            if step == 6:
                for h in handles:
                    h.remove()
            opt.zero_grad()
            loss = fn(x, t)
            loss.backward()
            values += [loss, *([x.grad] if x.requires_grad else [])]
            opt.step()
            values += _state(m)
        return values

    build = lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.2), nn.Linear(6, 2))  # noqa
    _run_loop(build, optimizer, loop)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_whole_step_with_accumulation_clipping_and_a_scheduler(optimizer, micro_batches):
    def loop(side: str, m: nn.Module, opt: Any, maybe_compile: Callable) -> list:
        scheduler = (torch.optim if side == "torch" else tt.optim).lr_scheduler.StepLR(opt, 2, gamma=0.5)

        def step_fn(xs: list, ts: list) -> torch.Tensor:
            opt.zero_grad(set_to_none=micro_batches == 1)
            total = 0
            for x, t in zip(xs, ts):
                loss = F.mse_loss(m(x), t) / len(xs)
                loss.backward()
                total = total + loss.detach()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            opt.step()
            scheduler.step()
            return total

        step_fn = maybe_compile(step_fn, ([randn(0, 3, 2, 6)] * micro_batches, [randn(1, 3, 2)] * micro_batches))
        values: list = []
        for step in range(6):
            xs = [randn(10 * step + j, 3, 2, 6) for j in range(micro_batches)]
            ts = [randn(10 * step + j + 5, 3, 2) for j in range(micro_batches)]
            m.train(step != 3)
            values += [step_fn(xs, ts), *_state(m)]
        return values

    build = lambda: nn.Sequential(nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3), nn.SiLU(), nn.Flatten(), nn.Linear(12, 2))  # noqa
    _run_loop(build, optimizer, loop)


@pytest.mark.parametrize("whole", [False, True], ids=["forward", "whole-step"])
def test_a_gradient_penalty_with_create_graph_inside_the_compiled_function(whole):
    def loop(side: str, m: nn.Module, opt: Any, maybe_compile: Callable) -> list:
        def loss_fn(x: torch.Tensor) -> torch.Tensor:
            x = leaf(side, x)
            y = m(x).sum()
            (gx,) = torch.autograd.grad(y, x, create_graph=True)
            return y + 10 * ((gx.norm(2, dim=1) - 1) ** 2).mean()

        def training_step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_fn(x)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = maybe_compile(training_step if whole else loss_fn, (randn(0, 4, 3),))
        values: list = []
        for step in range(5):
            if not whole:
                opt.zero_grad()
            loss = fn(randn(step, 4, 3))
            if not whole:
                loss.backward()
                opt.step()
            values += [loss, *_state(m)]
        return values

    _run_loop(lambda: nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)), "adam", loop)


def test_the_same_tensor_as_both_arguments_and_other_layouts():
    """Bilinear(x1, x2) recorded, then Bilinear(x, x); a transposed and a channels_last input after contiguous ones."""
    def aliasing(step: int, side: str) -> tuple:
        x1, x2 = leaf(side, randn(step, 3, 4)), leaf(side, randn(step + 50, 3, 4))
        return (x1, x1) if step in (2, 3, 5) else (x1, x2)

    three_way(lambda: nn.Bilinear(4, 4, 2), aliasing, lambda m, a, b: (m(a, b) ** 2).sum())

    def transposed(step: int, side: str) -> tuple:
        return (leaf(side, randn(step, 3, 4).t() if step in (2, 4) else randn(step, 4, 3)),)

    three_way(lambda: nn.Linear(3, 5), transposed, lambda m, x: (m(x) ** 3).sum())

    def channels_last(step: int, side: str) -> tuple:
        x = randn(step, 2, 3, 5, 5)
        return (leaf(side, x.contiguous(memory_format=torch.channels_last) if step in (2, 4, 5) else x),)

    build = lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())  # noqa: E731
    three_way(build, channels_last, lambda m, x: (m(x) ** 2).mean(), "adam", whole=True)


def test_two_compiled_calls_then_one_backward():
    def loop(side: str, m: nn.Module, opt: Any, maybe_compile: Callable) -> list:
        fn = maybe_compile(lambda x: (m(x) ** 2).mean(), (randn(0, 5, 4),))
        values: list = []
        for step in range(5):
            opt.zero_grad()
            a = leaf(side, randn(step, 5, 4))
            first, second = fn(a), fn(randn(step + 20, 5, 4))
            loss = first * second + first
            loss.backward()
            opt.step()
            values += [loss, a.grad, *_state(m)]
        return values

    build = lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1))  # noqa: E731
    _run_loop(build, "rmsprop", loop)


def test_sweep_covers_modules_with_buffers_dropout_recurrence_and_attention():
    names = {info.name for info in MODULES}
    assert {"nn.BatchNorm1d", "nn.BatchNorm2d", "nn.LSTM", "nn.GRU", "nn.RNN", "nn.TransformerEncoderLayer",
            "nn.TransformerDecoderLayer", "nn.Transformer", "nn.MultiheadAttention", "nn.FractionalMaxPool2d"} <= names
    assert len(names) >= 100
