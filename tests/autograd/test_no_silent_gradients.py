"""No silent gradients: each case, in the core and at its edges, matches torch or raises."""
import collections
import threading

import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.autograd import engine

X = torch.tensor([[0.5, -1.0, 2.0], [1.5, -0.25, 0.75]], dtype=torch.float64)


def grads_of(fn, *values, create_graph=False):
    """Leaf gradients of fn(*leaves).sum() under torchtrace and under torch autograd."""
    ours = [tt.tracer(v, requires_grad=True) for v in values]
    fn(*ours).sum().backward(create_graph=create_graph)
    theirs = [v.clone().requires_grad_(True) for v in values]
    fn(*theirs).sum().backward(create_graph=create_graph)
    return [o.grad for o in ours], [t.grad for t in theirs]


def assert_same(ours, theirs):
    for a, b in zip(ours, theirs):
        assert a is not None
        torch.testing.assert_close(a.as_subclass(torch.Tensor).detach(), b.detach())


Pair = collections.namedtuple("Pair", "first second")


class TensorList(list):
    pass


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.cat(tensors=[a, b]) ** 2,
    lambda a, b: torch.stack(tensors=(a, b), dim=1) ** 2,
    lambda a, b: torch.cat(Pair(a, b)) ** 2,
    lambda a, b: torch.stack(TensorList([a, b])) ** 2,
    lambda a, b: torch.cat(tensors=TensorList([a * 2, b]), dim=-1) ** 2,
])
def test_containers_of_tracers_are_seen_by_position_or_keyword(fn):
    assert_same(*grads_of(fn, X, X.flip(0)))


@pytest.mark.parametrize("inplace_fn", [
    lambda x: F.relu(x, inplace=True), lambda x: torch.nn.ReLU(inplace=True)(x),
    lambda x: F.leaky_relu(x, 0.1, inplace=True), lambda x: F.hardtanh(x, inplace=True),
    lambda x: F.elu(x, inplace=True), lambda x: F.relu6(x, inplace=True), lambda x: F.silu(x, inplace=True),
])
def test_inplace_flags_change_the_argument_and_its_later_uses(inplace_fn):
    def program(leaf):
        x = leaf * 3
        y = inplace_fn(x)
        return x * leaf + y  # x is used after the change: its new value must count
    assert_same(*grads_of(program, X))


def test_inplace_flag_without_recording_still_changes_the_argument():
    x = tt.tracer(X.clone())
    F.relu(x, inplace=True)
    assert torch.equal(x.as_subclass(torch.Tensor), X.relu())


def leaf_storages_distinct(*leaves):
    pointers = [leaf.grad.untyped_storage().data_ptr() for leaf in leaves]
    return len(set(pointers)) == len(pointers)


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("fn, sign_b", [(lambda a, b: a + b, 1), (lambda a, b: a.reshape(3, 2).reshape(2, 3) + b, 1),
                                        (lambda a, b: a.view(-1).view(2, 3) - b, -1)])
def test_every_leaf_owns_its_gradient(fn, sign_b, create_graph):
    a, b = tt.tracer(X, requires_grad=True), tt.tracer(X, requires_grad=True)
    fn(a, b).sum().backward(create_graph=create_graph)
    assert a.grad is not b.grad and leaf_storages_distinct(a, b)
    a.grad.mul_(10) if not create_graph else None
    assert torch.equal(b.grad.as_subclass(torch.Tensor), torch.ones_like(X) * sign_b)


def test_the_gradient_passed_to_backward_is_not_kept_by_a_leaf():
    x = tt.tracer(X, requires_grad=True)
    seed = torch.ones_like(X)
    (x * 1).backward(seed)
    x.grad.mul_(3)
    assert torch.equal(seed, torch.ones_like(X))


class ReturnsHeld(tt.Function):
    """y = x -> dy/dx = g, returned as a tensor the rule also keeps (whole, or a view of it)."""

    held: list = []

    @staticmethod
    def forward(ctx, x, as_view):
        ctx.as_view = as_view
        return x * 1

    @staticmethod
    def backward(ctx, g):
        kept = g.clone()
        ReturnsHeld.held.append(kept)
        return (kept.view(-1).view(kept.shape) if ctx.as_view else kept), None


@pytest.mark.parametrize("as_view", [False, True])
def test_a_leaf_never_takes_a_gradient_someone_else_holds(as_view):
    """The engine lets a leaf keep a fresh gradient as .grad (no copy, as torch); one still referenced elsewhere
    (or a view of one) is copied, so a later in-place accumulation into .grad reaches nobody else."""
    ReturnsHeld.held.clear()
    x = tt.tracer(X, requires_grad=True)
    ReturnsHeld.apply(x, as_view).sum().backward()
    ReturnsHeld.apply(x, as_view).sum().backward()  # accumulates into x.grad in place
    assert torch.equal(ReturnsHeld.held[0], torch.ones_like(X))
    assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.full_like(X, 2.0))


class StacksHeld(tt.Function):
    """y = stack(xs) -> dxs = the slices of g, returned as a list of tensors the rule also keeps."""

    held: list = []

    @staticmethod
    def forward(ctx, xs):
        return torch.stack(xs)

    @staticmethod
    def backward(ctx, g):
        kept = [g[i].clone() for i in range(g.shape[0])]
        StacksHeld.held.extend(kept)
        return (kept,)


def test_a_leaf_never_takes_a_gradient_a_users_function_returned_in_a_list():
    StacksHeld.held.clear()
    xs = [tt.tracer(X, requires_grad=True) for _ in range(2)]
    StacksHeld.apply(xs).sum().backward()
    StacksHeld.apply(xs).sum().backward()  # accumulates into each .grad in place
    assert all(torch.equal(kept, torch.ones_like(X)) for kept in StacksHeld.held[:2])
    assert all(torch.equal(x.grad.as_subclass(torch.Tensor), torch.full_like(X, 2.0)) for x in xs)


def test_a_fresh_gradient_from_a_builtin_rule_becomes_the_leaf_grad_without_a_copy(monkeypatch):
    copies = []
    monkeypatch.setattr(engine, "_private_copy", lambda g, *args: copies.append(g) or g.clone())
    x = tt.tracer(X, requires_grad=True)
    (x * 2).sum().backward()
    assert copies == [] and torch.equal(x.grad.as_subclass(torch.Tensor), torch.full_like(X, 2.0))


def test_a_users_function_result_is_copied_the_engine_cannot_vouch_for_it():
    """Without reference counts the engine cannot know whether a user's backward kept what it returned."""
    returned = []

    class Double(tt.Function):
        """y = 2x -> dy/dx = 2g"""

        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            returned.append(g * 2)
            return returned[-1]

    x = tt.tracer(X, requires_grad=True)
    Double.apply(x).sum().backward()
    Double.apply(x).sum().backward()
    assert torch.equal(returned[0], torch.full_like(X, 2.0))
    assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.full_like(X, 4.0))


def test_leaf_grad_accumulates_in_place_as_torch():
    x = tt.tracer(X, requires_grad=True)
    (x * 2).sum().backward()
    first = x.grad
    (x * 3).sum().backward()
    assert x.grad is first and torch.equal(first, torch.full_like(X, 5.0))


def test_a_plain_tensor_that_requires_grad_is_a_leaf_fgsm_pattern():
    image = X.clone().requires_grad_(True)
    model = tt.port(torch.nn.Linear(3, 2).double())
    loss = model(image).pow(2).sum()
    loss.backward()
    twin = torch.nn.Linear(3, 2).double()
    twin.load_state_dict(model.state_dict())
    expected = X.clone().requires_grad_(True)
    twin(expected).pow(2).sum().backward()
    torch.testing.assert_close(image.grad, expected.grad)
    assert loss.grad_fn is not None and torch.Tensor.requires_grad.__get__(loss) is False  # torch recorded nothing


def test_a_plain_leafs_own_hooks_run_when_a_tracer_reaches_it():
    """Tensor.register_hook and register_post_accumulate_grad_hook on a plain tensor that requires grad (the
    weight of an unported torch layer fed a tracer) never ran: .grad missed the hook's change."""
    def program(w, x):
        return (torch.nn.functional.linear(x, w) ** 2).sum()

    grads, seen = {}, {}
    for name, x in [("ours", tt.tracer(X, requires_grad=True)), ("torch", X.clone().requires_grad_(True))]:
        w = torch.eye(3, dtype=X.dtype)[:2].clone().requires_grad_(True)
        seen[name] = []
        w.register_hook(lambda g: g * 3)
        removed = w.register_hook(lambda g: g * 100)
        removed.remove()
        w.register_post_accumulate_grad_hook(lambda p, out=seen[name]: out.append(p.grad.clone()))
        program(w, x).backward()
        grads[name] = w.grad
    torch.testing.assert_close(grads["ours"], grads["torch"])
    assert len(seen["ours"]) == len(seen["torch"]) == 1
    torch.testing.assert_close(seen["ours"][0], seen["torch"][0])
    w0 = torch.eye(3, dtype=X.dtype)[:2]
    numeric = torch.zeros_like(w0)
    for i in range(2):
        for j in range(3):
            e = torch.zeros_like(w0)
            e[i, j] = 1e-6
            numeric[i, j] = (program(w0 + e, X) - program(w0 - e, X)) / 2e-6
    torch.testing.assert_close(grads["ours"], 3 * numeric, rtol=1e-6, atol=1e-6)


def test_a_tensor_computed_by_torch_autograd_meeting_a_tracer_is_refused():
    computed = X.clone().requires_grad_(True) * 2
    with pytest.raises(RuntimeError, match="computed by torch autograd.*met a tracer"):
        computed * tt.tracer(X, requires_grad=True)


def test_load_state_dict_assign_keeps_a_ported_model_learning():
    model = tt.port(torch.nn.Linear(3, 2).double())
    state = {k: v.clone() for k, v in torch.nn.Linear(3, 2).double().state_dict().items()}
    model.load_state_dict(state, assign=True)
    model(tt.tracer(X)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_retain_grad_then_in_place_reports_the_new_value():
    ours_leaf, theirs_leaf = tt.tracer(X, requires_grad=True), X.clone().requires_grad_(True)
    results = []
    for leaf in (ours_leaf, theirs_leaf):
        y = leaf * 2
        y.retain_grad()
        y.mul_(3)
        (y * y).sum().backward()
        results.append(y.grad)
    assert_same([results[0]], [results[1]])


class WithExtras(tt.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, 5, None

    @staticmethod
    def backward(ctx, g, g_five, g_none):
        assert g_five is None and g_none is None
        return g * 2


def test_function_outputs_mixed_with_non_tensors_are_recorded():
    x = tt.tracer(X, requires_grad=True)
    y, five, nothing = WithExtras.apply(x)
    assert five == 5 and nothing is None and y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(X, 2.0))


def test_post_accumulate_grad_hook_fires_after_accumulation():
    x = tt.tracer(X, requires_grad=True)
    seen = []
    handle = x.register_post_accumulate_grad_hook(lambda leaf: seen.append(leaf.grad.clone()))
    (x * x).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0], 2 * X)
    handle.remove()
    (x * x).sum().backward()
    assert len(seen) == 1
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered on non-leaf"):
        (x * 2).register_post_accumulate_grad_hook(print)


def test_create_graph_in_one_thread_is_not_disturbed_by_plain_backward_in_another():
    errors, stop = [], threading.Event()

    def plain_loop():
        while not stop.is_set():
            w = tt.tracer(X, requires_grad=True)
            (w * w).sum().backward()

    worker = threading.Thread(target=plain_loop)
    worker.start()
    try:
        for _ in range(30):
            x = tt.tracer(X, requires_grad=True)
            (g,) = tt.grad((x ** 3).sum(), x, create_graph=True)
            (h,) = tt.grad(g.sum(), x)
            if not torch.allclose(h, 6 * X):
                errors.append(h)
    finally:
        stop.set()
        worker.join()
    assert not errors


def test_autocast_forward_gets_a_backward_in_the_same_precision_and_torchs_gradient():
    torch.manual_seed(0)
    twin = torch.nn.Linear(3, 2)
    model = tt.port(torch.nn.Linear(3, 2))
    model.load_state_dict(twin.state_dict())
    x = torch.randn(4, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = model(tt.tracer(x))
        theirs = twin(x)
    ours.float().pow(2).sum().backward()
    theirs.float().pow(2).sum().backward()
    assert model.weight.grad.dtype == torch.float32
    torch.testing.assert_close(model.weight.grad, twin.weight.grad)


@pytest.mark.parametrize("returned, message", [
    (3.0, "Bad.backward returned a float; it must return a tensor, None, or a tuple"),
    ([None], "Bad.backward returned a list; it must return a tensor, None, or a tuple"),
    ((), r"function BadBackward returned an incorrect number of gradients \(expected 1, got 0\)"),
    (("grad",), "Bad.backward returned a str as the gradient of input 0"),
])
def test_a_backward_returning_the_wrong_thing_names_the_rule(returned, message):
    class Bad(tt.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return returned

    with pytest.raises(RuntimeError, match=message):
        Bad.apply(tt.tracer(X, requires_grad=True)).sum().backward()


@pytest.mark.parametrize("returned, message", [(5, "returned int; a hook must return None or a tensor"),
                                               (torch.ones(7), r"returned shape \(7,\); a hook must return")])
def test_a_hook_returning_a_non_gradient_is_an_error(returned, message):
    x = tt.tracer(X, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: returned)
    with pytest.raises(RuntimeError, match=message):
        y.sum().backward()


def test_detach_in_place_makes_a_leaf_that_does_not_require_grad():
    y = tt.tracer(X, requires_grad=True) * 2
    assert y.detach_() is y and y.is_leaf and not y.requires_grad


def test_out_is_allowed_when_nothing_is_recorded_and_refused_otherwise():
    x, out = tt.tracer(X, requires_grad=True), tt.zeros(2, 3, dtype=torch.float64)
    with tt.no_grad():
        torch.mul(x, 2, out=out)
    assert torch.equal(out.as_subclass(torch.Tensor), 2 * X)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.mul: out= cannot be recorded"):
        torch.mul(x, 2, out=out)


@pytest.mark.parametrize("optimizer", [lambda p: torch.optim.Adam(p, amsgrad=True), torch.optim.AdamW,
                                       lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)])
def test_stock_torch_optimizers_step_a_ported_model_like_torch(optimizer):
    torch.manual_seed(0)
    twin = torch.nn.Linear(3, 2).double()
    model = tt.port(torch.nn.Linear(3, 2).double())
    model.load_state_dict(twin.state_dict())
    ours, theirs = optimizer(model.parameters()), optimizer(twin.parameters())
    for _ in range(3):
        for net, opt, x in ((model, ours, tt.tracer(X)), (twin, theirs, X)):
            opt.zero_grad()
            net(x).pow(2).sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b.detach())


def test_grad_assignment_is_checked_as_torch_does():
    x = tt.tracer(X, requires_grad=True)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different type"):
        x.grad = torch.ones(2, 3, dtype=torch.float32)
    x.grad = torch.ones_like(X)
    assert torch.equal(x.grad, torch.ones_like(X))


def test_small_tensor_protocols():
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        list(tt.tracer(1.0))
    y = tt.tracer(X, requires_grad=True) * 2
    assert y.real is y
    assert y._base is None
    assert y[0]._base is y and y[0][1:]._base is y  # as torch: the base of a view of a view is the first base
    lost = y[0]
    lost._tt_base = None
    with pytest.raises(tt.UnsupportedOperationError, match="torch.Tensor._base: torchtrace does not know"):
        lost._base
    with torch.inference_mode():
        frozen = torch.ones(2)
    x = tt.tracer(frozen, requires_grad=True)
    (x * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0))


def test_no_grad_decorates_without_parentheses_and_generators():
    @tt.no_grad
    def double(x):
        return x * 2

    @tt.no_grad()
    def steps(x):
        yield (x * 2).requires_grad
        yield (x * 3).requires_grad

    x = tt.tracer(X, requires_grad=True)
    assert not double(x).requires_grad
    assert list(steps(x)) == [False, False]
    assert (x * 2).requires_grad  # recording is back on between and after the generator's steps


def test_detect_anomaly_can_be_entered_again():
    guard = tt.detect_anomaly()
    for _ in range(2):
        with guard:
            x = tt.tracer(X, requires_grad=True)
            (x * 2).sum().backward()


@pytest.mark.parametrize("update", [
    lambda y: y.__ipow__(2), lambda y: y.__imul__(3), lambda y: y.__itruediv__(2), lambda y: torch.relu_(y),
    lambda y: F.elu_(y), lambda y: y.__iadd__(y),
])
def test_augmented_assignments_and_functional_in_place_forms_are_recorded(update):
    def program(leaf):
        y = leaf * 1.5
        update(y)
        return y * leaf
    assert_same(*grads_of(program, X))


@pytest.mark.parametrize("change_input", [True, False])
@pytest.mark.parametrize("fn", [torch.neg, torch.sin, torch.exp, torch.sign, torch.floor, torch.sqrt, F.silu, F.relu6,
                                F.gelu, F.leaky_relu, torch.nan_to_num])
def test_an_inplace_change_of_what_a_rule_does_not_save_is_allowed_as_in_torch(fn, change_input):
    """A rule saves only what its gradient reads: changing the other tensor in place afterwards works in torch, so
    it works here; changing a saved one raises in both."""
    def program(leaf):
        h = leaf * 2
        y = fn(h)
        (h if change_input else y).add_(1)
        return y * 3

    theirs = X.abs().clone().requires_grad_(True)
    try:
        program(theirs).sum().backward()
    except RuntimeError:
        ours = tt.tracer(X.abs(), requires_grad=True)
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            program(ours).sum().backward()
        return
    ours = tt.tracer(X.abs(), requires_grad=True)
    program(ours).sum().backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


@pytest.mark.parametrize("changed", [0, 1])
@pytest.mark.parametrize("fn", [torch.div, torch.mul, torch.sub, torch.atan2, torch.maximum, torch.hypot,
                                lambda a, b: torch.lerp(a, b, 0.3), lambda a, b: torch.lerp(a, b, b.sigmoid()),
                                lambda a, b: torch.lerp(b, a, a.sigmoid())])
def test_binary_rules_save_only_what_the_needed_gradient_reads(fn, changed):
    """Only `a` needs a gradient here: an operand its gradient does not read may change in place afterwards (torch
    allows it, so torchtrace does); one it reads raises in both."""
    def program(leaf, other):
        a, b = leaf * 2, other * 1
        y = fn(a, b)
        (a, b)[changed].add_(1)
        return y * 3

    other = X.flip(0).abs() + 0.5
    theirs = X.abs().clone().requires_grad_(True)
    ours = tt.tracer(X.abs(), requires_grad=True)
    try:
        program(theirs, other).sum().backward()
    except RuntimeError:
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            program(ours, tt.as_tracer(other)).sum().backward()
        return
    program(ours, tt.as_tracer(other)).sum().backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


@pytest.mark.parametrize("program", [lambda z, r: (z * 2).sum(), lambda z, r: torch.exp(z), lambda z, r: r * 1j,
                                     lambda z, r: r.to(torch.complex128), lambda z, r: z.sum(), lambda z, r: z @ z])
def test_a_complex_result_is_refused_where_a_gradient_would_need_conjugates(program):
    """Rules are written for real tensors (g * b, not g * conj(b)): a complex result that would carry a gradient is
    refused, never differentiated with the real formula."""
    z = tt.tracer(torch.randn(3, dtype=torch.complex128), requires_grad=True)
    r = tt.tracer(torch.rand(3, dtype=torch.float64), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="complex"):
        program(z, r)
    with tt.no_grad():
        assert program(z, r).is_complex()


@pytest.mark.parametrize("program", [lambda z: z.abs().sum(), lambda z: (z.abs() ** 2).sum(),
                                     lambda z: torch.linalg.vector_norm(z)])
def test_real_results_of_a_complex_leaf_get_torchs_gradient(program):
    z0 = torch.randn(4, dtype=torch.complex128)
    ours, theirs = tt.tracer(z0, requires_grad=True), z0.clone().requires_grad_(True)
    program(ours).backward()
    program(theirs).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


def test_a_complex_gradient_for_a_real_output_is_refused_as_torch_does():
    x = tt.tracer(torch.randn(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="pass a real gradient"):
        (x * 2).exp().backward(torch.tensor([1 + 1j, 2, 3j]))
    theirs = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        (theirs * 2).exp().backward(torch.tensor([1 + 1j, 2, 3j]))


def _three_steps(program, leaves):
    """Three backward passes into the same leaves; what the user holds on the way (each step's .grad objects and
    what hooks kept) is read at the end, as a user reading a gradient kept from an earlier step would."""
    kept, held = [], []
    for _ in range(3):
        program(leaves, kept).backward()
        held += [x.grad for x in leaves if x.grad is not None]
    return [t.as_subclass(torch.Tensor).clone() for t in held + kept + [x.grad for x in leaves]]


@pytest.mark.parametrize("program", [
    lambda xs, kept: (xs[0] + xs[1]).sum(),
    lambda xs, kept: (xs[0] + xs[0]).sum() + xs[1].sum(),
    lambda xs, kept: (xs[0].reshape(-1) + xs[1].reshape(-1)).sum(),
    lambda xs, kept: torch.cat([xs[0], xs[1]]).sum(),
    lambda xs, kept: (xs[0].t() @ xs[1]).sum(),
    lambda xs, kept: (xs[0] + xs[1][0]).sum(),
    lambda xs, kept: (xs[0].register_hook(kept.append), (xs[0] * xs[1]).sum())[1],
    lambda xs, kept: (xs[0].register_hook(kept.append), (xs[0] + xs[1]).sum())[1],
    lambda xs, kept: (xs[0].register_post_accumulate_grad_hook(lambda p: kept.append(p.grad)),
                      (xs[0] * 3 + xs[1]).sum())[1],
    lambda xs, kept: ((t := xs[0] * 3).register_hook(kept.append), ((t + xs[1]) * 2).sum())[1],
], ids=["add", "self-add", "reshape", "cat", "matmul", "broadcast", "hook-mul", "hook-add", "post-hook",
        "hook-sees-a-leafs-gradient"])
def test_gradients_kept_by_hooks_and_users_across_steps_are_torchs(program):
    """Leaves keep fresh gradients without a copy and accumulate in place: whatever a hook or the user still holds
    from an earlier step reads what it reads in torch (in-place accumulation into .grad is visible, as in torch)."""
    x0 = [torch.randn(3, 3, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    ours = _three_steps(program, [tt.tracer(x, requires_grad=True) for x in x0])
    theirs = _three_steps(program, [x.clone().requires_grad_(True) for x in x0])
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("gradient", [torch.full((5,), 0.1, dtype=torch.float64), torch.full((5,), 3)])
def test_a_gradient_of_another_dtype_is_cast_to_the_outputs_as_torch_does(gradient):
    x0 = torch.randn(5)
    ours, theirs = tt.tracer(x0, requires_grad=True), x0.clone().requires_grad_(True)
    (ours * 0.1).exp().backward(gradient)
    (theirs * 0.1).exp().backward(gradient)
    assert ours.grad.dtype == torch.float32 and torch.equal(ours.grad, theirs.grad)
