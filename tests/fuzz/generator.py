"""Random small torch programs, built one statement at a time and kept only where torch accepts each statement.

A program is straight-line Python: `def program(x0, x1, ...)` whose body draws from the op table below and
which returns (outputs, tensors whose retained .grad is compared). Every statement is tried at once on
plain float64 tensors under torch autograd (the dry run), so shapes broadcast and arguments are valid;
a statement torch rejects is dropped and another one drawn.
"""
import math
import random
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .program import Pair, Program, TensorList

# Generator features that known core bugs still break. The CI budget leaves them out; the lead removes an entry once
# the bug is fixed (python -m tests.fuzz --known-bugs runs them anyway).
KNOWN_CORE_BUGS: Dict[str, str] = {
    "nan_inf": ("NaN/inf inputs anywhere. Masks are exact (torch.where / threshold_backward: an infinite or NaN "
                "incoming gradient gives 0 off the mask, as torch), and cumprod over a NaN follows torch (feature "
                "cumprod_nan), but torch's own NaN conventions depend on its kernels' vectorisation: hardtanh_backward "
                "(relu6) passes g at a NaN input in tensors of fewer than 8 elements and gives 0 from 8 on, and "
                "elu_backward passes g below 8 elements and gives NaN from 8 on (float64). Off: no NaN/inf inputs, "
                "and a difference involving a NaN/inf (or in a program holding one) is counted, not failed"),
}
FEATURES: FrozenSet[str] = frozenset({
    "pointwise", "binary", "reduction", "matmul", "view", "index", "cat", "where", "softmax", "inplace",
    "inplace_view", "inplace_viewed", "alias_self", "hook", "retain_grad", "double", "edges",
    # once known core bugs, fixed: cat/stack(tensors=...) and of containers, inplace= keywords, retain_grad then
    # in-place, relu6/hardtanh masks meeting an infinite gradient, atan2 at (0, 0), elu's second derivative at 0
    "cat_keyword", "cat_container", "inplace_keyword", "retain_then_inplace", "mask_inf", "atan2_zero",
    "elu_double_at_zero",
    # a hook on an in-place ELU's result in a second derivative (elu_ reads its result, as torch's elu_backward with
    # is_result=True), and cumprod of an input holding NaN past a zero (torch selects terms, never multiplies by 0)
    "hook_double", "cumprod_nan",
}) | frozenset(KNOWN_CORE_BUGS)
CI_FEATURES: FrozenSet[str] = FEATURES - frozenset(KNOWN_CORE_BUGS)

UNARY = [
    "torch.sin({a})", "{a}.cos()", "torch.exp({a})", "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})",
    "F.relu({a})", "{a}.abs()", "-{a}", "torch.sqrt({a})", "{a}.log()", "{a} ** 2", "{a} ** 3", "{a}.pow(0.5)",
    "{a}.clamp(min=-0.5, max=0.5)", "torch.clamp({a}, -1.0, 1.0)", "{a}.clamp(min=0.0)", "F.gelu({a})",
    "F.silu({a})", "F.leaky_relu({a}, 0.1)", "F.elu({a})", "{a}.square()", "torch.rsqrt({a})", "{a}.reciprocal()",
    "torch.log1p({a})", "torch.expm1({a})", "F.softplus({a})", "torch.erf({a})", "{a}.sign()", "F.hardtanh({a})",
    "F.relu6({a})", "{a}.floor()", "{a}.clone()", "{a}.contiguous()", "{a}.detach()", "{a} * 2.5", "2 - {a}",
    "1 / {a}", "{a} + 1", "{a} / 3", "{a} - 0.5", "2 ** {a}", "{a}.atan()", "torch.nan_to_num({a})",
]
BINARY = [
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "torch.add({a}, {b}, alpha=2)", "torch.sub({a}, {b})",
    "torch.maximum({a}, {b})", "torch.minimum({a}, {b})", "{a} ** {b}",
    "torch.mul({a}, {b})", "{a}.div({b})", "torch.hypot({a}, {b})",
    "torch.lerp({a}, {b}, 0.3)", "torch.where({a} > {b}, {a}, {b})", "torch.where({a} > 0, {a}, {b})",
    "torch.where({a} >= 0, {a}, 0.0)", "torch.fmax({a}, {b})", "torch.addcmul({a}, {a}, {b}, value=0.5)",
]
REDUCTION_ALL = ["{a}.sum()", "{a}.mean()", "{a}.max()", "{a}.min()", "{a}.prod()", "{a}.norm()", "{a}.amax()",
                 "torch.logsumexp({a}.reshape(-1), 0)", "{a}.std()", "{a}.var()"]
REDUCTION_DIM = ["{a}.sum({d}, keepdim={k})", "{a}.mean(dim={d}, keepdim={k})", "torch.prod({a}, {d}, keepdim={k})",
                 "{a}.max({d}, keepdim={k}).values", "{a}.min(dim={d})[0]", "{a}.amax({d}, keepdim={k})",
                 "torch.amin({a}, dim={d})", "torch.logsumexp({a}, {d}, keepdim={k})", "{a}.norm(dim={d})",
                 "{a}.var({d}, keepdim={k})", "{a}.std(dim={d})", "{a}.cumsum({d})", "torch.cumprod({a}, {d})",
                 "{a}.sum(axis={d}, keepdims={k})"]
CUMPROD_NAN = ["torch.cumprod(torch.where({a} > 1.2, float('nan'), {a}), {d})"]  # NaNs among zeros (EDGES)
SOFTMAX = ["torch.softmax({a}, dim={d})", "F.softmax({a}, {d})", "F.log_softmax({a}, dim={d})",
           "{a}.softmax({d})", "{a}.log_softmax({d})"]
INPLACE = ["{v}.add_({b})", "{v}.mul_({b})", "{v}.mul_(2.0)", "{v}.relu_()", "{v}.clamp_(-0.5, 0.5)",
           "{v}.sub_({b}, alpha=0.5)", "{v}.div_(2.0)", "{v} += {b}", "{v} *= {b}", "{v}.neg_()", "{v}.sigmoid_()",
           "{v}.tanh_()", "{v}.exp_()", "torch.relu_({v})", "{v}.abs_()", "{v}.pow_(2)", "{v}.clamp_(min=0.0)"]
INPLACE_KEYWORD = ["F.relu({v}, inplace=True)", "F.leaky_relu({v}, 0.2, inplace=True)", "F.hardtanh({v}, inplace=True)",
                   "F.elu({v}, inplace=True)", "F.relu6({v}, inplace=True)", "F.silu({v}, inplace=True)",
                   "F.dropout({v}, p=0.0, training=True, inplace=True)", "torch.nn.ReLU(inplace=True)({v})"]
VALUES = [-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 0.25, -0.75, 3.0]
EDGES = [0.0, 0.0, -0.0, 1e-3]
NAN_INF = [float("nan"), float("inf"), float("-inf")]


@dataclass
class Var:
    name: str
    leaf: bool
    view: bool = False
    retained: bool = False
    mutated: bool = False
    base: Optional["Var"] = None  # for a view: the tensor it views
    viewed: bool = False  # some view of this tensor exists


@dataclass
class Generator:
    """Draws one program from a seed. `features` switches op families on and off (see FEATURES)."""

    seed: int
    features: FrozenSet[str] = CI_FEATURES
    max_statements: int = 8
    rng: random.Random = field(init=False)
    program: Program = field(init=False)
    env: Dict[str, torch.Tensor] = field(init=False, default_factory=dict)
    vars: List[Var] = field(init=False, default_factory=list)
    counter: int = field(init=False, default=0)
    inplace_ran: bool = field(init=False, default=False)  # an in-place op ran (on any tensor): see statement()

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.program = Program(double="double" in self.features and self.rng.random() < 0.2,
                               strict_nonfinite="nan_inf" in self.features)

    # ---- values and inputs -------------------------------------------------------------------------------------
    def values(self, shape: Tuple[int, ...]) -> torch.Tensor:
        edge = "edges" in self.features and self.rng.random() < 0.3
        edges = EDGES + (NAN_INF if "nan_inf" in self.features else [])
        items = []
        for _ in range(math.prod(shape)):
            if edge and self.rng.random() < 0.25:
                value = self.rng.choice(edges)
            else:
                value = self.rng.choice(VALUES)
            items.append(value)
        return torch.tensor(items, dtype=torch.float64).reshape(shape)

    def new_input(self, shape: Tuple[int, ...]) -> str:
        name = f"x{len(self.program.inputs)}"
        value = self.values(shape)
        self.program.inputs.append((name, value))
        self.env[name] = value.clone().requires_grad_(True)
        self.vars.append(Var(name, leaf=True))
        return name

    def random_shape(self) -> Tuple[int, ...]:
        return tuple(self.rng.randint(1, 4) for _ in range(self.rng.choice([0, 1, 1, 2, 2, 2, 3])))

    def broadcastable(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        kind = self.rng.random()
        if kind < 0.4 or not shape:
            return shape if kind < 0.9 else ()
        if kind < 0.7:
            return tuple(1 if self.rng.random() < 0.4 else s for s in shape)
        return shape[self.rng.randint(1, len(shape)):]

    # ---- choosing operands -------------------------------------------------------------------------------------
    def pick(self, ok: Callable[[Var], bool] = lambda v: True) -> Optional[Var]:
        candidates = [v for v in self.vars if ok(v)]
        if not candidates:
            return None
        weights = [1 + i for i in range(len(candidates))]  # recent tensors more often, old ones reused too
        return self.rng.choices(candidates, weights)[0]

    def shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self.env[name].shape)

    def operand(self, a: str) -> str:
        """A second operand for `a`: a number, a tensor that broadcasts with it (maybe `a` itself), or a new input."""
        r = self.rng.random()
        if r < 0.15:
            return repr(self.rng.choice([2.0, -1.0, 0.5, 0.0, 3]))
        if r < 0.6:
            match = self.pick(lambda v: _broadcasts(self.shape(v.name), self.shape(a)))
            if match is not None:
                return match.name
        return self.new_input(self.broadcastable(self.shape(a)))

    def dim(self, a: str) -> int:
        """A valid dimension of `a` (either sign); 0 or -1 for a 0-d tensor, as torch allows."""
        n = len(self.shape(a))
        return self.rng.randrange(-n, n) if n else self.rng.choice([0, -1])

    # ---- statements --------------------------------------------------------------------------------------------
    def fresh(self) -> str:
        name = f"t{self.counter}"
        self.counter += 1
        return name

    def statement(self) -> Optional[Tuple[str, Optional[Var]]]:
        """One candidate statement (source, the Var it defines or None)."""
        families = [f for f in ("pointwise", "binary", "reduction", "matmul", "view", "index", "cat", "softmax",
                                "inplace", "hook", "retain_grad") if f in self.features]
        family = self.rng.choice(families)
        a = self.pick()
        if a is None:
            return None
        x = a.name
        if family == "pointwise":
            unary = [u for u in UNARY if ("F.elu" not in u or not self.program.double
                                          or "elu_double_at_zero" in self.features)
                     and ("relu6" not in u and "hardtanh" not in u or "mask_inf" in self.features)]
            return self.define(self.rng.choice(unary).format(a=x))
        if family == "binary":
            binary = BINARY + (["torch.atan2({a}, {b})"] if "atan2_zero" in self.features else [])
            return self.define(self.rng.choice(binary).format(a=x, b=self.operand(x)))
        if family == "reduction":
            if self.rng.random() < 0.35:
                return self.define(self.rng.choice(REDUCTION_ALL).format(a=x))
            template = self.rng.choice(REDUCTION_DIM + (CUMPROD_NAN if "cumprod_nan" in self.features else []))
            return self.define(template.format(a=x, d=self.dim(x), k=self.rng.choice([True, False])))
        if family == "softmax":
            return self.define(self.rng.choice(SOFTMAX).format(a=x, d=self.dim(x)))
        if family == "matmul":
            return self.matmul(x)
        if family == "view":
            return self.view(x)
        if family == "index":
            return self.index(x)
        if family == "cat":
            return self.cat(x)
        if family == "inplace":
            return self.inplace()
        if family == "hook":
            if self.program.double and not a.leaf and "hook_double" not in self.features:
                return None
            if self.inplace_ran and (a.view or a.viewed or self.shares_storage(x)):  # torch 2.13 segfaults in
                return None  # register_hook on a tensor sharing memory (a view, a base, an alias) changed in place
            factor = self.rng.choice([0.5, 2.0, -1.0, 3.0])  # scaling hooks: linear in g, as gradients are
            hook = self.rng.choice([f"lambda g: g * {factor}", "lambda g: None"])
            return f"{x}.register_hook({hook})", None
        target = self.pick(lambda v: not v.leaf and not v.retained and not v.mutated)
        if target is None:
            return None
        target.retained = True
        self.program.retained.append(target.name)
        return f"{target.name}.retain_grad()", None

    def shares_storage(self, name: str) -> bool:
        """Does another tensor of the program share this one's memory (a view, or the same object by an alias)?"""
        mine = self.env[name].untyped_storage().data_ptr()
        return any(k != name and isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == mine
                   for k, t in self.env.items())

    def define(self, expression: str, view: bool = False, of: Optional[Var] = None) -> Tuple[str, Var]:
        name = self.fresh()
        return f"{name} = {expression}", Var(name, leaf=False, view=view, base=of if view else None)

    def matmul(self, x: str) -> Tuple[str, Var]:
        shape = self.shape(x)
        if not shape:
            return self.define(f"{x} * {self.operand(x)}")
        if len(shape) >= 2 and self.rng.random() < 0.3:
            gram = self.rng.choice(["{a} @ {a}.mT", "{a}.mT @ {a}", "torch.matmul({a}, {a}.mT)"])
            return self.define(gram.format(a=x))
        cols = self.rng.choice([(), (self.rng.randint(1, 3),)])
        other = self.new_input((shape[-1],) + cols)
        if len(shape) == 2 and cols and self.rng.random() < 0.4:
            return self.define(f"torch.mm({x}, {other})")
        return self.define(self.rng.choice(["{a} @ {b}", "torch.matmul({a}, {b})", "{a}.matmul({b})"])
                           .format(a=x, b=other))

    def view(self, x: str) -> Tuple[str, Var]:
        shape = self.shape(x)
        n = len(shape)
        options = ["{a}.reshape(-1)", "{a}.flatten()", "{a}.unsqueeze({d0})", "{a}.view(-1)", "{a}.squeeze()",
                   "{a}.reshape({rev})", "{a}.expand({exp})", "{a}[None]"]
        if n >= 2:
            options += ["{a}.transpose({d}, {d2})", "{a}.permute({perm})", "{a}.mT", "{a}.t()" if n == 2 else "{a}.mT",
                        "{a}.unflatten(0, (1, {s0}))", "{a}.flip({d})", "{a}.movedim(0, -1)"]
        perm = list(range(n))
        self.rng.shuffle(perm)
        text = self.rng.choice(options).format(
            a=x, d0=self.rng.randint(-n - 1, n), d=self.dim(x), d2=self.dim(x), perm=tuple(perm),
            rev=tuple(reversed(shape)) if shape else "()", exp=(2,) + shape, s0=shape[0] if shape else 1)
        return self.define(text, view=".flip(" not in text)

    def index(self, x: str) -> Tuple[str, Var]:
        shape = self.shape(x)
        if not shape or not shape[0]:
            return self.define(f"{x}[None][0]" if not shape else f"{x}[1:]", view=True)
        size = shape[0]
        options = [(f"{x}[{self.rng.randrange(-size, size)}]", True), (f"{x}[1:]", True), (f"{x}[..., :2]", True),
                   (f"{x}[::2]", True), (f"{x}[torch.tensor({[self.rng.randrange(size) for _ in range(3)]})]", False),
                   (f"{x}[{x} > 0]", False), (f"{x}.index_select(0, torch.tensor([0, 0]))", False),
                   (f"{x}.narrow(0, 0, 1)", True), (f"{x}.select(0, -1)", True), (f"{x}.unbind(0)[0]", True),
                   (f"{x}.chunk(2)[-1]", True), (f"{x}.split(1)[0]", True)]
        if len(shape) >= 2:
            options += [(f"{x}[:, 1:]", True), (f"{x}[:, 0]", True), (f"{x}.diagonal()", True),
                        (f"torch.gather({x}, 1, torch.zeros({shape[0]}, 2, dtype=torch.long))", False)]
        text, view = self.rng.choice(options)
        return self.define(text, view=view)

    def cat(self, x: str) -> Tuple[str, Var]:
        same = self.pick(lambda v: self.shape(v.name) == self.shape(x))
        other = same.name if same is not None and self.rng.random() < 0.6 else self.new_input(self.shape(x))
        parts = self.rng.choice([[x, other], [x, other, x], [other, x]])
        stack = self.rng.random() < 0.4 or not self.shape(x)
        d = self.rng.randint(-len(self.shape(x)) - 1, len(self.shape(x))) if stack else self.dim(x)
        fn = "torch.stack" if stack else self.rng.choice(["torch.cat", "torch.concat", "torch.cat"])
        forms = ["list", "tuple"] + (["keyword"] if "cat_keyword" in self.features else []) + (
            ["namedtuple", "listsubclass"] if "cat_container" in self.features else [])
        form = self.rng.choice(forms)
        if form == "namedtuple":
            parts = parts[:2]
            return self.define(f"{fn}(Pair({parts[0]}, {parts[1]}), {d})")
        container = {"list": "[{}]", "tuple": "({},)", "keyword": "[{}]", "listsubclass": "TensorList([{}])"}[form]
        items = container.format(", ".join(parts))
        return self.define(f"{fn}(tensors={items}, dim={d})" if form == "keyword" else f"{fn}({items}, {d})")

    def inplace(self) -> Optional[Tuple[str, Optional[Var]]]:
        allow_view = "inplace_view" in self.features and self.rng.random() < 0.2
        allow_retained = "retain_then_inplace" in self.features
        allow_viewed = "inplace_viewed" in self.features
        target = self.pick(lambda v: not v.leaf and (allow_view or not v.view) and (allow_retained or not v.retained)
                           and (allow_viewed or not v.viewed))
        if target is None:
            return None
        v = target.name
        target.mutated = True
        self.inplace_ran = True
        if "inplace_keyword" in self.features and self.rng.random() < 0.4:
            text = self.rng.choice(INPLACE_KEYWORD).format(v=v)
            return self.define(text, view=True, of=target) if self.rng.random() < 0.5 else (text, None)  # an alias
        template = self.rng.choice(INPLACE)
        return template.format(v=v, b=self.operand(v) if "{b}" in template else ""), None

    # ---- the whole program -------------------------------------------------------------------------------------
    def cumprod_nan_is_strict(self) -> bool:
        """A program whose NaNs come from CUMPROD_NAN fails on any difference, NaN or not, unless it also runs relu6 /
        hardtanh / elu, whose NaN convention in torch depends on the tensor's size (KNOWN_CORE_BUGS["nan_inf"];
        torchtrace passes g at a NaN, torch's small-tensor answer, at every size)."""
        lines = self.program.lines
        return (any("cumprod(torch.where(" in line for line in lines)
                and not any(name in line for line in lines for name in ("relu6", "hardtanh", "elu(")))

    def generate(self) -> Program:
        for _ in range(self.rng.randint(1, 2)):
            self.new_input(self.random_shape())
        attempts, target = 0, self.rng.randint(1, self.max_statements)
        while len(self.program.lines) < target and attempts < 40:
            attempts += 1
            n_inputs, n_vars = len(self.program.inputs), len(self.vars)
            drawn = self.statement()
            if drawn is None:
                continue
            line, var = drawn
            if var is not None and var.view and var.base is None:
                var.base = self.var_named(line.split(" = ", 1)[1])
            if self.try_line(line):
                self.program.lines.append(line)
                if var is not None and isinstance(self.env.get(var.name), torch.Tensor):
                    if self.env[var.name].is_floating_point():
                        self.vars.append(var)
                    base = var.base
                    while base is not None:  # the viewed tensor, and what it views in turn
                        base.viewed = True
                        base = base.base
            else:  # forget inputs drawn for the rejected statement
                del self.program.inputs[n_inputs:]
                del self.vars[n_vars:]
        self.program.outputs = self.outputs()
        if self.cumprod_nan_is_strict():
            self.program.strict_nonfinite = True
        return self.program

    def var_named(self, expression: str) -> Optional[Var]:
        """The tensor a view expression starts from (`t3[1:]`, `t3.mT`, `x0.reshape(-1)` -> t3 / x0)."""
        head = re.match(r"\w+", expression)
        return next((v for v in self.vars if head and v.name == head.group(0)), None)

    def try_line(self, line: str) -> bool:
        scope = dict(self.env)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(line, {"torch": torch, "F": F, "Pair": Pair, "TensorList": TensorList}, scope)
        except Exception:
            return False
        new = {k: v for k, v in scope.items() if isinstance(v, torch.Tensor) and self.env.get(k) is not v}
        known = {id(v) for v in self.env.values()}
        if "alias_self" not in self.features and any(id(v) in known for v in new.values()):
            return False  # torch handed back an existing tensor object (x.contiguous() ...): see KNOWN_CORE_BUGS
        self.env.update(new)
        return True

    def outputs(self) -> List[str]:
        defined = [v.name for v in self.vars if not v.leaf]
        if not defined:
            return [self.vars[-1].name]
        chosen = [defined[-1]] + [n for n in defined[:-1] if self.rng.random() < 0.3]
        return chosen


def _broadcasts(a: Tuple[int, ...], b: Tuple[int, ...]) -> bool:
    """True when a op= b keeps b's shape (so a can be the second operand of an in-place op on b, too)."""
    try:
        return torch.broadcast_shapes(a, b) == torch.Size(b)
    except RuntimeError:
        return False


def generate(seed: int, features: FrozenSet[str] = CI_FEATURES) -> Program:
    """The program drawn from `seed`."""
    return Generator(seed, features).generate()
