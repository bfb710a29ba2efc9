"""An adversarial differential fuzzer of tt.compile: random programs of ops whose rules save nothing (add, neg, view,
expand, sum) and ones that save (mul, matmul, tanh, softmax, layer_norm, cross_entropy), called many times with
changing values, shapes, dtypes, floats and requires_grad, against eager torchtrace (bit for bit, or within rounding)
and torch autograd on plain float64 tensors. Beyond the plain backward: results kept across calls and backpropagated
in any order, retain_graph and the error of a second backward, hooks, retain_grad, tt.grad on values made inside,
create_graph, show=True, grad_fn state after backward, recurrent chaining, dropout, in-place ops, optimizers,
threads."""
import contextlib
import copy
import io
import random
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.port import port

F64 = torch.float64


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tt.compile's "runs eagerly from ..." / "has taken N paths" notes
        yield


# every op maps (N, N) values to an (N, N) value; `s` is a float read anew on every call
OPS = {
    "add": (2, lambda a, b, s: a + b),
    "sub": (2, lambda a, b, s: a - b),
    "mul": (2, lambda a, b, s: a * b),
    "div": (2, lambda a, b, s: a / (1.5 + b * b)),
    "neg": (1, lambda a, s: -a),
    "scale": (1, lambda a, s: a * s),
    "rscale": (1, lambda a, s: s - a),
    "addc": (1, lambda a, s: a + 2.0),
    "matmul": (2, lambda a, b, s: a @ b),
    "addmm": (3, lambda a, b, c, s: torch.addmm(c, a, b, alpha=s)),
    "tanh": (1, lambda a, s: torch.tanh(a)),
    "sigmoid": (1, lambda a, s: torch.sigmoid(a)),
    "relu": (1, lambda a, s: F.relu(a)),
    "softmax": (1, lambda a, s: F.softmax(a, dim=-1)),
    "logsm": (1, lambda a, s: F.log_softmax(a, dim=0)),
    "ln": (1, lambda a, s: F.layer_norm(a, a.shape[-1:])),
    "T": (1, lambda a, s: a.t()),
    "transpose": (1, lambda a, s: a.transpose(0, 1).contiguous()),
    "reshape": (1, lambda a, s: a.reshape(-1).reshape(a.shape)),
    "view": (1, lambda a, s: a.contiguous().view(-1).view(a.shape[0], -1)),
    "rowexp": (1, lambda a, s: a.sum(0, keepdim=True).expand(a.shape)),
    "colexp": (1, lambda a, s: a[:, :1].expand(a.shape[0], a.shape[1])),
    "mean": (1, lambda a, s: a - a.mean(dim=1, keepdim=True)),
    "catchunk": (2, lambda a, b, s: torch.cat([a, b], dim=1).chunk(2, dim=1)[1] + torch.cat([a, b], 0)[: a.shape[0]]),
    "pow": (1, lambda a, s: (a * a + 1.0).pow(0.5 + s)),
    "sin": (1, lambda a, s: a.sin()),
    "exp": (1, lambda a, s: torch.exp(a.clamp(-3, 3))),
    "where": (2, lambda a, b, s: torch.where(a > 0, a, b)),
    "bcast": (2, lambda a, b, s: a * b[0]),
    "unsq": (1, lambda a, s: a.unsqueeze(0).squeeze(0)),
    "lerp": (2, lambda a, b, s: torch.lerp(a, b, 0.3)),
    "maxd": (1, lambda a, s: a.max(dim=1, keepdim=True).values + a),
    "norm": (1, lambda a, s: a / (a.norm() + 1.0)),
    "sq": (1, lambda a, s: a ** 2),
}
NAMES = sorted(OPS)
N_LEAVES = 3


def make_program(seed, length=8):
    rng = random.Random(seed)
    prog, pool = [], N_LEAVES
    for _ in range(length):
        name = rng.choice(NAMES)
        prog.append((name, [rng.randrange(pool) for _ in range(OPS[name][0])]))
        pool += 1
    outs = sorted({pool - 1, rng.randrange(pool), rng.randrange(pool)})
    return prog, outs, rng.choice(["sum", "ce", "mse"])


def build(prog, outs, final):
    """fn(*leaves, s, target, tf) -> (loss, the values it made); the loss reaches every leaf."""

    def fn(*args):
        *leaves, s, target, tf = args
        vals = list(leaves)
        for name, idx in prog:
            vals.append(OPS[name][1](*(vals[i] for i in idx), s))
        total = None
        for k, i in enumerate(outs):
            v = vals[i]
            term = F.cross_entropy(v, target) if final == "ce" else F.mse_loss(v, tf) if final == "mse" else \
                (v * (k + 1)).sum()
            total = term if total is None else total + term
        for leaf in leaves:
            total = total + (leaf * leaf).sum() * 0.1
        return total, vals[len(leaves):]

    return fn


def loss_only(fn):
    return lambda *args: fn(*args)[0]


def inputs(g, n, dtype=F64):
    vals = [torch.randn(n, n, generator=g, dtype=dtype) for _ in range(N_LEAVES)]
    s = float(torch.rand((), generator=g, dtype=F64)) + 0.25
    return vals, s, torch.randint(0, n, (n,), generator=g), torch.randn(n, n, generator=g, dtype=dtype)


def plain(t):
    return t.as_subclass(torch.Tensor).detach() if isinstance(t, torch.Tensor) else t


def assert_same(a, b, rtol=1e-12, atol=1e-13, what=""):
    """None where the other is None; else equal shapes, dtypes and values within rounding."""
    assert (a is None) == (b is None), f"{what}: {a is None} vs {b is None}"
    if a is not None:
        a, b = plain(a), plain(b)
        assert a.shape == b.shape and a.dtype == b.dtype, what
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=what)


def raises(f):
    try:
        f()
    except RuntimeError:
        return True
    return False


SEEDS = range(0, 240)
CHUNKS = [list(SEEDS[i::4]) for i in range(4)]


def seeded_program(seed: int) -> tuple:
    """The program of a seed as a loss function, its random stream, which leaves need a gradient, its generator."""
    prog, outs, final = make_program(seed)
    rng = random.Random(seed)
    rg = [True] + [rng.random() < 0.6 for _ in range(N_LEAVES - 1)]
    return loss_only(build(prog, outs, final)), rng, rg, torch.Generator().manual_seed(seed)


# --- plain calls: changing values, shapes, floats, .data swaps; against eager and torch --------------------------
@pytest.mark.parametrize("seeds", CHUNKS, ids=lambda c: f"seeds{c[0]}")
def test_random_programs_match_eager_and_torch(seeds):
    replayed = checked = 0
    for seed in seeds:
        fn, rng, rg, g = seeded_program(seed)
        vals0, *rest0 = inputs(g, 4)
        leaves = [tt.tracer(v, requires_grad=r) for v, r in zip(vals0, rg)]
        c = tt.compile(fn, (*leaves, *rest0))
        for k, n in enumerate([4, 4, 4, 3, 4, 3]):
            vals, s, t, tf = inputs(g, n)
            if n == 4 and k % 2 == 0:  # the same leaf objects, their data replaced
                for leaf, v in zip(leaves, vals):
                    leaf.data, leaf.grad = v, None
                cl = leaves
            else:
                cl = [tt.tracer(v, requires_grad=r) for v, r in zip(vals, rg)]
            el = [tt.tracer(v, requires_grad=r) for v, r in zip(vals, rg)]
            tl = [v.clone().requires_grad_(r) for v, r in zip(vals, rg)]
            out = c(*cl, s, t, tf)
            out.backward()
            eo = fn(*el, s, t, tf)
            eo.backward()
            to = fn(*tl, s, t, tf)
            to.backward()
            what = f"seed {seed} call {k} (make_program(seed))"
            assert_same(out, eo, what=what + " value vs eager")
            torch.testing.assert_close(plain(out), to.detach(), rtol=1e-10, atol=1e-12)
            for i in range(N_LEAVES):
                assert_same(cl[i].grad, el[i].grad, what=f"{what} grad {i} vs eager")
                assert_same(cl[i].grad, tl[i].grad, rtol=1e-9, atol=1e-11, what=f"{what} grad {i} vs torch")
                checked += 1
        replayed += c.replayed
    assert replayed >= 4 * len(seeds)  # calls 2, 3, 5, 6 of each program replay it
    assert checked == len(seeds) * 6 * N_LEAVES


@pytest.mark.parametrize("seeds", [list(range(300, 380))], ids=["seeds300"])
def test_dtypes_requires_grad_and_accumulation_change_between_calls(seeds):
    """float32/float64, requires_grad flipped, .grad kept (accumulating) or zeroed, retain_graph then a last
    backward: the compiled function's gradients are eager's."""
    for seed in seeds:
        prog, outs, final = make_program(seed)
        fn = loss_only(build(prog, outs, final))
        rng = random.Random(seed)
        plan = [dict(dtype=rng.choice([F64, F64, torch.float32]), n=rng.choice([4, 4, 3]),
                     rg=[True] + [rng.random() < 0.6 for _ in range(N_LEAVES - 1)], zero=rng.random() < 0.4,
                     s=rng.random() + 0.3, retain=rng.random() < 0.3) for _ in range(6)]
        g = torch.Generator().manual_seed(seed)
        data = [inputs(g, p["n"], p["dtype"]) for p in plan]
        logs = {}
        for mode in ["eager", "compiled"]:
            log, c, leaves = [], None, None
            for p, (vals, _, t, tf) in zip(plan, data):
                if leaves is None or leaves[0].shape != vals[0].shape or leaves[0].dtype != vals[0].dtype:
                    leaves = [tt.tracer(v, requires_grad=r) for v, r in zip(vals, p["rg"])]
                else:
                    for leaf, v, r in zip(leaves, vals, p["rg"]):
                        leaf.data = v
                        leaf.requires_grad_(r)
                        if not r or p["zero"]:
                            leaf.grad = None
                if mode == "compiled" and c is None:
                    c = tt.compile(fn, (*leaves, p["s"], t, tf))
                out = (c or fn)(*leaves, p["s"], t, tf)
                out.backward(retain_graph=p["retain"])
                if p["retain"]:
                    out.backward()
                log.append([out] + [None if leaf.grad is None else leaf.grad.clone() for leaf in leaves])
            logs[mode] = log
        for k, (e, got) in enumerate(zip(logs["eager"], logs["compiled"])):
            for i, (a, b) in enumerate(zip(e, got)):
                tight = a is None or plain(a).dtype == F64
                assert_same(b, a, rtol=1e-12 if tight else 1e-5, atol=1e-13 if tight else 1e-6,
                            what=f"seed {seed} call {k} item {i}")


# --- results kept across calls, any order, retain_graph, the second backward's error ------------------------------
@pytest.mark.parametrize("seeds", [list(range(400, 520))], ids=["seeds400"])
def test_kept_results_backward_in_any_order_and_second_backward_raises_as_eager(seeds):
    for seed in seeds:
        fn, rng, rg, g = seeded_program(seed)
        calls = [inputs(g, 4) for _ in range(4)]
        order = list(range(4))
        rng.shuffle(order)
        logs = {}
        for mode in ["eager", "compiled"]:
            leaves = [tt.tracer(v, requires_grad=r) for v, r in zip(calls[0][0], rg)]
            c = tt.compile(fn, (*leaves, *calls[0][1:])) if mode == "compiled" else fn
            c(*leaves, *calls[0][1:])
            kept = []
            for vals, s, t, tf in calls:  # every call made before any backward; the leaves' data swapped between
                for leaf, v in zip(leaves, vals):
                    leaf.data = v
                kept.append(c(*leaves, s, t, tf))
            log = []

            def grads():
                log.append([None if leaf.grad is None else leaf.grad.clone() for leaf in leaves])

            for i in order:
                kept[i].backward(retain_graph=True)
                grads()
            kept[order[0]].backward()
            grads()
            log.append(raises(lambda: kept[order[0]].backward()))
            grads()
            last = kept[order[2]]
            kept = None  # the other results dropped before the last backwards
            log.append(raises(lambda: last.backward()))
            grads()
            log.append(raises(lambda: last.backward()))
            grads()
            logs[mode] = log
        for k, (a, b) in enumerate(zip(logs["eager"], logs["compiled"])):
            if isinstance(a, bool):
                assert a == b, f"seed {seed} step {k}: second backward raised {b}, eager {a}"
            else:
                for i, (x, y) in enumerate(zip(a, b)):
                    assert_same(y, x, what=f"seed {seed} step {k} grad {i}")


def test_saves_nothing_segment_backpropagates_again_and_saving_one_raises_as_eager():
    """Steps whose rules save nothing (add, neg, view, expand, sum) are not freed: a second backward runs (as eager's
    and torch's); a statement that saves (mul, tanh) makes it raise, as eager does."""
    cases = {
        "nothing_saved": (lambda x, w: (x + w).neg().reshape(-1).sum() + w[:1].expand(3, 4).sum(), False),
        "scaled": (lambda x, w: ((x + w).neg() * 2.0).sum(), True),
        "mixed": (lambda x, w: torch.tanh(x * w).sum() + (x + w).sum(), True),
    }
    g = torch.Generator().manual_seed(1)
    X, W = torch.randn(3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    for name, (fn, saves) in cases.items():
        results = {}
        for mode in ["eager", "compiled"]:
            x, w = tt.tracer(X, requires_grad=True), tt.tracer(W, requires_grad=True)
            c = tt.compile(fn, (x, w)) if mode == "compiled" else fn
            log = []
            for _ in range(3):
                x.grad = w.grad = None
                loss = c(x, w)
                loss.backward()
                log.append(raises(loss.backward))
                log.append(raises(loss.backward))
                log += [x.grad.clone(), w.grad.clone()]
            results[mode] = log
        for a, b in zip(results["eager"], results["compiled"]):
            if isinstance(a, bool):
                assert a == b == saves, name
            else:
                assert_same(b, a, what=name)
        if not saves:  # three backwards each: three times torch's gradient
            xt, wt = X.clone().requires_grad_(), W.clone().requires_grad_()
            fn(xt, wt).backward()
            assert_same(results["compiled"][-2], 3 * xt.grad, what=name)
            assert_same(results["compiled"][-1], 3 * wt.grad, what=name)


# --- values made inside: hooks, retain_grad, tt.grad, create_graph, show=True ---------------------------------------
def _inside(scenario, seed):
    """One call of a replayed program, by torch, eager torchtrace and the compiled function, with `scenario` done on
    the values it made; returns each one's list of tensors (or ("raised", message))."""
    prog, outs, final = make_program(seed)
    fn = build(prog, outs, final)
    rng = random.Random(seed)
    rg = [True] + [rng.random() < 0.6 for _ in range(N_LEAVES - 1)]
    picks = sorted({rng.randrange(len(prog)) for _ in range(3)})
    g = torch.Generator().manual_seed(seed)
    first = inputs(g, 4)
    c = tt.compile(fn, (*[tt.tracer(v, requires_grad=r) for v, r in zip(first[0], rg)], *first[1:]))
    c(*[tt.tracer(v, requires_grad=r) for v, r in zip(first[0], rg)], *first[1:])
    results = {}
    for _ in range(2):
        vals, s, t, tf = inputs(g, 4)
        for mode in ["torch", "eager", "compiled"]:
            if mode == "torch":
                leaves, f = [v.clone().requires_grad_(r) for v, r in zip(vals, rg)], fn
            else:
                leaves, f = [tt.tracer(v, requires_grad=r) for v, r in zip(vals, rg)], fn if mode == "eager" else c
            grad = torch.autograd.grad if mode == "torch" else tt.grad
            loss, inter = f(*leaves, s, t, tf)
            log = []
            try:
                if scenario == "hooks":
                    seen = []
                    for j in picks:
                        if not inter[j].requires_grad:
                            continue
                        if j % 2 == 0:
                            inter[j].retain_grad()
                        else:
                            inter[j].register_hook(lambda gr, j=j: (seen.append((j, gr.clone())), gr * 2)[1])
                    loss.backward()
                    log += [inter[j].grad if inter[j].requires_grad and j % 2 == 0 else None for j in picks]
                    log += [gr for _, gr in sorted(seen, key=lambda p: p[0])]
                elif scenario == "grad":
                    want = [inter[j] for j in picks if inter[j].requires_grad] + [x for x in leaves if x.requires_grad]
                    log += list(grad(loss, want, allow_unused=True))
                elif scenario == "double":
                    gs = grad(loss, [x for x in leaves if x.requires_grad], create_graph=True)
                    log += list(gs)
                    sum((gr * gr).sum() for gr in gs).backward()
                elif scenario == "show":
                    if mode == "torch":
                        loss.backward()
                    else:
                        printed = io.StringIO()
                        with contextlib.redirect_stdout(printed):
                            loss.backward(show=True)
                        assert "BackProp" in printed.getvalue()
                log += [x.grad for x in leaves]
            except RuntimeError as e:
                log = ("raised", str(e))
            results.setdefault(mode, []).append(log)
    return results


@pytest.mark.parametrize("scenario", ["hooks", "grad", "double", "show"])
def test_values_made_inside_hooks_grad_create_graph_show(scenario):
    compared = 0
    for seed in range(600, 660):
        results = _inside(scenario, seed)
        for call, (t, e, c) in enumerate(zip(results["torch"], results["eager"], results["compiled"])):
            what = f"{scenario} seed {seed} call {call}"
            assert e[0] != "raised" and c[0] != "raised" and t[0] != "raised", (what, t[:1], e[:1], c[:1])
            assert len(t) == len(e) == len(c), what
            for i, (a, b, d) in enumerate(zip(t, e, c)):
                assert_same(d, b, what=f"{what} item {i} vs eager")
                assert_same(d, a, rtol=1e-9, atol=1e-11, what=f"{what} item {i} vs torch")
                compared += 1
    assert compared >= 60 * 2 * N_LEAVES


def test_grad_fn_state_after_backward_and_second_backward_as_eager():
    """The grad_fn of each value made inside (held before the backward, or read after): its name, whether it is
    released, whether its saved_tensors raise; and whether a second backward raises: all as eager's."""

    def info(node):
        if node is None:
            return None
        return node.name, node.released, raises(lambda: node.saved_tensors)

    compared = 0
    for seed in range(700, 800):
        prog, outs, final = make_program(seed)
        fn = build(prog, outs, final)
        rng = random.Random(seed)
        rg = [True] + [rng.random() < 0.5 for _ in range(N_LEAVES - 1)]
        held_before = [rng.random() < 0.5 for _ in prog]
        retain = rng.random() < 0.3
        vals, s, t, tf = inputs(torch.Generator().manual_seed(seed), 4)
        logs = {}
        for mode in ["eager", "compiled"]:
            leaves = [tt.tracer(v, requires_grad=r) for v, r in zip(vals, rg)]
            f = fn
            if mode == "compiled":
                f = tt.compile(fn, (*leaves, s, t, tf))
                f(*leaves, s, t, tf)
            loss, inter = f(*leaves, s, t, tf)
            held = [v.grad_fn if b else None for v, b in zip(inter, held_before)]
            log = [info(h) for h in held]
            loss.backward(retain_graph=retain)
            log += [info(h) for h in held] + [info(v.grad_fn) for v in inter] + [info(loss.grad_fn)]
            log.append(raises(loss.backward))
            log += [leaf.grad for leaf in leaves]
            logs[mode] = log
        for i, (a, b) in enumerate(zip(logs["eager"], logs["compiled"])):
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                assert_same(b, a, what=f"seed {seed} grad {i}")
            else:
                assert a == b, (seed, i, a, b)
            compared += 1
    assert compared > 2000


# --- calls that feed each other, branches, dropout, in-place, training, threads -------------------------------------
def test_recurrent_chaining_and_branches_backward_out_of_order():
    """Each call reads the previous call's result; Python branches on a mode take other paths; every result is
    kept and backpropagated out of order, half with retain_graph, after the compiled function was dropped."""

    def cell(x, h, w, u, b, mode):
        z = x @ w + h @ u + b
        z = torch.tanh(z) if mode == 0 else F.relu(z) * b if mode == 1 else (z + b).sigmoid()
        return z

    g = torch.Generator().manual_seed(3)
    W, U, B = (torch.randn(3, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64),
               torch.randn(4, generator=g, dtype=F64))
    modes = [0, 1, 2, 0, 0, 1, 2, 2, 1, 0]
    xs = [torch.randn(2, 3, generator=g, dtype=F64) for _ in modes]
    order = [9, 3, 5, 0, 7, 1, 2, 4, 6, 8]
    logs = {}
    for mode in ["torch", "eager", "compiled"]:
        if mode == "torch":
            params, f = [v.clone().requires_grad_() for v in (W, U, B)], cell
        else:
            params = [tt.tracer(v, requires_grad=True) for v in (W, U, B)]
            f = tt.compile(cell, (xs[0], torch.zeros(2, 4, dtype=F64), *params, 0)) if mode == "compiled" else cell
        h, hs = torch.zeros(2, 4, dtype=F64), []
        for x, m in zip(xs, modes):
            h = f(x, h, *params, m)
            hs.append((h * h).sum())
        if mode == "compiled":
            assert f.replayed >= 4
        del f
        log = []
        for i in order:
            hs[i].backward(retain_graph=True)
            log += [p.grad.clone() for p in params]
        hs[9].backward()
        log += [p.grad.clone() for p in params]
        logs[mode] = log
    for t, e, c in zip(logs["torch"], logs["eager"], logs["compiled"]):
        assert_same(c, e)
        assert_same(c, t, rtol=1e-10, atol=1e-12)


def test_dropout_with_manual_seeds_and_changing_p():
    """F.dropout's p is a float of each call (0 included: nothing drawn, nothing saved): compiled and eager draw the
    same masks, give the same gradients, leave the same random stream, and a second backward raises as eager's."""

    def fn(x, w, p):
        return (F.dropout(x + w, p) + w).sum() + (F.dropout(x * w, p) * 0.5).sum()

    g = torch.Generator().manual_seed(4)
    X, W = torch.randn(4, 5, generator=g, dtype=F64), torch.randn(4, 5, generator=g, dtype=F64)
    for ps in [[0.5, 0.5, 0.0, 0.0, 0.3], [0.0, 0.0, 0.5, 0.5, 0.0], [0.3, 0.6, 0.0, 0.2, 0.9]]:
        logs = {}
        for mode in ["eager", "compiled"]:
            x, w = tt.tracer(X, requires_grad=True), tt.tracer(W, requires_grad=True)
            c = tt.compile(fn, (x, w, ps[0])) if mode == "compiled" else fn
            log = []
            for p in ps:
                torch.manual_seed(11)
                x.grad = w.grad = None
                loss = c(x, w, p)
                loss.backward()
                log += [loss, x.grad.clone(), w.grad.clone(), raises(loss.backward), torch.rand(3)]
            logs[mode] = log
        for a, b in zip(logs["eager"], logs["compiled"]):
            if isinstance(a, bool):
                assert a == b
            else:
                assert torch.equal(plain(a), plain(b))


def test_in_place_ops_inside_and_on_saved_inputs_between_forward_and_backward():
    def scaled_in_place(x, w):  # an in-place op on an input that needs no gradient, inside the function
        x.mul_(2.0)
        return (torch.tanh(x @ w) * x).sum()

    def saves_x(x, w):
        return (x * w).exp().sum()

    g = torch.Generator().manual_seed(5)
    X, W = torch.randn(3, 3, generator=g, dtype=F64), torch.randn(3, 3, generator=g, dtype=F64)
    logs = {}
    for mode in ["torch", "eager", "compiled"]:
        if mode == "torch":
            w, make, f, h = W.clone().requires_grad_(), X.clone, scaled_in_place, saves_x
        else:
            w, make = tt.tracer(W, requires_grad=True), lambda: tt.tracer(X)
            f = tt.compile(scaled_in_place, (make(), w)) if mode == "compiled" else scaled_in_place
            h = tt.compile(saves_x, (make(), w)) if mode == "compiled" else saves_x
        log = []
        for _ in range(3):
            x = make()
            f(x, w).backward()
            log += [w.grad.clone(), x.clone()]
        for _ in range(2):
            x = make()
            loss = h(x, w)
            x.add_(1.0)  # a tensor the mul saved, changed before the backward
            log.append(raises(loss.backward))
        logs[mode] = log
    for t, e, c in zip(logs["torch"], logs["eager"], logs["compiled"]):
        if isinstance(t, bool):
            assert t == e == c is True
        else:
            assert torch.equal(plain(c), plain(e))
            assert_same(c, t, rtol=1e-10, atol=1e-12)


def test_training_with_optimizer_steps_between_calls_and_eval_switch():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(8, 3)).double()
    data = [(torch.randn(6, 5, dtype=F64), torch.randint(0, 3, (6,))) for _ in range(5)]
    results = {}
    for mode in ["torch", "eager", "compiled"]:
        model = copy.deepcopy(net)
        if mode != "torch":
            model = port(model)
        opt = (torch.optim.Adam if mode == "torch" else tt.optim.Adam)(model.parameters(), lr=0.05)

        def step(x, y, model=model):
            return F.cross_entropy(model(x), y)

        f = tt.compile(step, data[0]) if mode == "compiled" else step
        torch.manual_seed(5)
        losses = []
        for i, (x, y) in enumerate(data * 2):
            model.train(i not in (3, 4, 5))
            opt.zero_grad()
            loss = f(x, y)
            loss.backward()
            if i % 3 == 2:  # gradient accumulated over a second call before the step
                f(x, y).backward()
            opt.step()
            losses.append(float(loss))
        if mode == "compiled":
            assert f.replayed >= 6
        results[mode] = losses, [plain(p).clone() for p in model.parameters()]
    for mode in ["eager", "compiled"]:
        assert results[mode][0] == pytest.approx(results["torch"][0], rel=1e-10)
        for a, b in zip(results[mode][1], results["torch"][1]):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert results["eager"][0] == results["compiled"][0]
    assert all(torch.equal(a, b) for a, b in zip(results["eager"][1], results["compiled"][1]))


def test_threads_calling_and_backpropagating_one_compiled_function():
    def fn(x, w, b):
        h = torch.tanh(x @ w + b)
        return F.softmax(h, -1).mul(h).sum() + (h + 1).sum()

    g = torch.Generator().manual_seed(6)
    W, B = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)
    xs = [torch.randn(3, 4, generator=g, dtype=F64) for _ in range(24)]
    c = tt.compile(fn, (xs[0], tt.tracer(W), tt.tracer(B)))
    got, errors = {}, []

    def worker(i):
        try:
            for j in range(6):
                x = xs[i * 6 + j]
                w, b = tt.tracer(W, requires_grad=True), tt.tracer(B, requires_grad=True)
                c(x, w, b).backward()
                got[i * 6 + j] = (w.grad.clone(), b.grad.clone())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(got) == 24
    for k, (gw, gb) in got.items():
        w, b = tt.tracer(W, requires_grad=True), tt.tracer(B, requires_grad=True)
        fn(xs[k], w, b).backward()
        assert torch.equal(gw, w.grad) and torch.equal(gb, b.grad)
    assert c.replayed >= 20


# --- a partial or finished backward through the generated code --------------------------------------------------
def test_data_swap_on_saved_result_after_backward():
    """`h.data = v` after a backward freed the statements that saved h: nothing left to follow, as eager."""
    def fn(x, w):
        h = x * w
        return (h.tanh() * h).sum(), h

    x, w = tt.tracer(torch.randn(3, 3, dtype=F64), requires_grad=True), tt.tracer(torch.randn(3, 3, dtype=F64),
                                                                                  requires_grad=True)
    loss, h = fn(x, w)
    loss.backward()
    h.data = torch.zeros(3, 3, dtype=F64)  # eager: fine
    c = tt.compile(fn, (x, w))
    c(x, w)
    loss, h = c(x, w)
    loss.backward()
    h.data = torch.zeros(3, 3, dtype=F64)
    assert torch.equal(torch.Tensor.as_subclass(h, torch.Tensor), torch.zeros(3, 3, dtype=F64))
    assert c.replayed >= 1


@pytest.mark.parametrize("how", ["tt.grad", "inputs="])
def test_partial_backward_leaves_statements_it_does_not_need(how):
    """tt.grad / inputs= run only the statements on the way to the inputs (the others keep their saved tensors)."""
    def fn(x, y):
        p = y.exp()
        return (x * x).sum() + p.sum(), p

    g = torch.Generator().manual_seed(7)
    X, Y = torch.randn(3, generator=g, dtype=F64), torch.randn(3, generator=g, dtype=F64)
    xt, yt = X.clone().requires_grad_(), Y.clone().requires_grad_()
    loss, p = fn(xt, yt)
    torch.autograd.grad(loss, [xt])
    p.sum().backward()  # torch: the exp was not run, so not freed
    for compiled in [False, True]:
        x, y = tt.tracer(X, requires_grad=True), tt.tracer(Y, requires_grad=True)
        f = tt.compile(fn, (x, y)) if compiled else fn
        f(x, y)
        loss, p = f(x, y)
        if how == "tt.grad":
            (gx,) = tt.grad(loss, [x])
            assert_same(gx, 2 * X)
        else:
            loss.backward(inputs=[x])
        assert y.grad is None
        p.sum().backward()
        assert_same(y.grad, yt.grad)
