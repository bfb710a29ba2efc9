"""Conventions a torch user relies on in the first hour: formatting, numpy(), the non-leaf .grad warning,
grad_fn.name() and grad_fn hooks, module backward hooks — each compared with what torch does."""
import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchtrace as tt


def test_format_of_a_0_dim_tracer_is_its_number_as_torch():
    loss = tt.tracer([1.5, 2.0], requires_grad=True).pow(2).sum()
    plain = torch.tensor([1.5, 2.0]).pow(2).sum()
    assert f"{loss:.4f}" == f"{plain:.4f}" == "6.2500"
    idx = tt.tracer(torch.tensor(0))
    assert f"expert_{idx}" == f"expert_{torch.tensor(0)}" == "expert_0"


def test_format_of_a_tracer_with_dimensions_is_its_str_and_refuses_a_spec_as_torch():
    x = tt.tracer([1.0, 2.0])
    assert f"{x}" == str(x)
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{torch.tensor([1.0, 2.0]):.2f}"
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{x:.2f}"


TORCH_NUMPY_MESSAGE = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."


@pytest.mark.parametrize("to_numpy", [lambda t: t.numpy(), np.asarray], ids=["numpy", "asarray"])
def test_numpy_of_a_tracer_requiring_grad_refuses_with_torchs_message(to_numpy):
    with pytest.raises(RuntimeError) as theirs:
        to_numpy(torch.ones(2, requires_grad=True))
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    for t in (x, x * 2):
        with pytest.raises(RuntimeError) as ours:
            to_numpy(t)
        assert str(ours.value) == str(theirs.value) == TORCH_NUMPY_MESSAGE


def test_numpy_force_and_detach_give_the_values():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    np.testing.assert_array_equal(x.numpy(force=True), [1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(x.detach()), [1.0, 2.0])
    np.testing.assert_array_equal(tt.tracer([3.0]).numpy(), [3.0])


def _warnings_of(read):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read()
    return value, [(w.category, str(w.message)) for w in caught]


def test_reading_grad_of_a_non_leaf_warns_as_torch_and_gives_none():
    x_torch = torch.ones(2, requires_grad=True)
    _, theirs = _warnings_of(lambda: (x_torch * 2).grad)
    x = tt.tracer([1.0, 1.0], requires_grad=True)
    value, ours = _warnings_of(lambda: (x * 2).grad)
    assert value is None
    assert len(ours) == len(theirs) == 1
    assert ours[0][0] is theirs[0][0] is UserWarning
    assert theirs[0][1].startswith(ours[0][1])


def test_no_warning_for_leaves_and_retained_non_leaves():
    x = tt.tracer([1.0, 1.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.sum().backward()
    (grads, caught) = _warnings_of(lambda: (x.grad, y.grad, tt.tracer([1.0]).grad))
    assert caught == []
    torch.testing.assert_close(grads[1], torch.ones(2))


def test_grad_fn_name_is_callable_as_torch_and_still_reads_as_text():
    y = tt.tracer([1.0], requires_grad=True) * 2
    assert y.grad_fn.name() == "MulBackward" == y.grad_fn.name
    assert f"{y.grad_fn.name}" == "MulBackward"


def _hooked_run(x, w, make_leaf):
    """z = (x * w).exp().sum() with a pre-hook (doubling grad_outputs) and a post-hook (recording grad_inputs and
    adding 1 to the first) on the mul node."""
    x, w = make_leaf(x), make_leaf(w)
    y = x * w
    seen = []
    y.grad_fn.register_prehook(lambda grad_outputs: (grad_outputs[0] * 2,))
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: seen.append((grad_inputs, grad_outputs))
                            or (grad_inputs[0] + 1, grad_inputs[1]))
    y.exp().sum().backward()
    return x.grad, w.grad, seen


def test_grad_fn_register_hook_and_prehook_as_torch():
    x, w = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    ours = _hooked_run(x, w, lambda t: tt.tracer(t, requires_grad=True))
    theirs = _hooked_run(x, w, lambda t: t.clone().requires_grad_(True))
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])
    (grad_inputs, grad_outputs), = ours[2]
    (their_inputs, their_outputs), = theirs[2]
    assert len(grad_inputs) == len(their_inputs) == 2
    torch.testing.assert_close(grad_inputs[1], their_inputs[1])
    torch.testing.assert_close(grad_outputs[0], their_outputs[0])
    # the math: dz/dx = 2 exp(xw) w + 1 (pre-hook doubles, post-hook adds one)
    torch.testing.assert_close(ours[0], 2 * (x * w).exp() * w + 1)


def test_a_hook_returning_the_wrong_number_of_gradients_is_refused():
    x = tt.tracer([1.0], requires_grad=True)
    y = x * 2
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0],) * 3)
    with pytest.raises(RuntimeError, match="incorrect number of values"):
        y.sum().backward()


def _module_hook_run(model, x, port):
    model = copy.deepcopy(model)
    if port:
        tt.port(model)
        x = tt.tracer(x, requires_grad=True)
    else:
        x = x.clone().requires_grad_(True)
    record = []

    def pre(module, grad_output):
        record.append(("pre", [g.clone() for g in grad_output if g is not None]))
        return (grad_output[0] * 3,)

    def post(module, grad_input, grad_output):
        record.append(("post", [g.clone() for g in grad_input if g is not None],
                       [g.clone() for g in grad_output if g is not None]))
        return tuple(None if g is None else g * 0.5 for g in grad_input)

    model[0].register_full_backward_pre_hook(pre)
    model[0].register_full_backward_hook(post)
    model[2].register_full_backward_hook(post)
    model(x).pow(2).sum().backward()
    return x.grad, [p.grad for p in model.parameters()], record


def _assert_same_runs(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0])
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b)
    assert [r[0] for r in ours[2]] == [r[0] for r in theirs[2]]
    for a, b in zip(ours[2], theirs[2]):
        for ga, gb in zip(a[1:], b[1:]):
            assert len(ga) == len(gb)
            for u, v in zip(ga, gb):
                torch.testing.assert_close(u, v)


def test_full_backward_hooks_on_a_ported_model_as_torch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    ours, theirs = _module_hook_run(model, x, port=True), _module_hook_run(model, x, port=False)
    assert ours[2]
    _assert_same_runs(ours, theirs)


def test_full_backward_hooks_on_tt_nn_layers_as_torch():
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(4, 5), tt.nn.Tanh(), tt.nn.Linear(5, 2))
    twin = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    with torch.no_grad():
        for p, q in zip(twin.parameters(), model.parameters()):
            p.copy_(q.detach().as_subclass(torch.Tensor))
    x = torch.randn(3, 4)
    ours, theirs = _module_hook_run(model, x, port=False), _module_hook_run(twin, x, port=False)
    # model's input is a plain tensor requiring grad: torchtrace fills its .grad as torch does
    _assert_same_runs(ours, theirs)


class _TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        y = self.layer(x)
        return y, y.exp()


def _unused_output_run(model, x):
    seen = []

    def pre(module, grad_output):
        seen.append(("pre", [None if g is None else g.clone() for g in grad_output]))
        return tuple(None if g is None else g * 2 for g in grad_output)

    def post(module, grad_input, grad_output):
        seen.append(("post", [None if g is None else g.clone() for g in (*grad_input, *grad_output)]))

    model.register_full_backward_pre_hook(pre)
    model.register_full_backward_hook(post)
    y, _ = model(x)  # the second output gets no gradient
    (y * y).sum().backward()
    return x.grad, seen


def test_full_backward_hooks_see_none_for_a_module_output_no_gradient_reached():
    """As torch's: the hooks see None there (not zeros), and the rule still gets zeros for it."""
    torch.manual_seed(0)
    model = _TwoOutputs().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    ours = _unused_output_run(tt.port(copy.deepcopy(model)), tt.tracer(x, requires_grad=True))
    theirs = _unused_output_run(model, x.clone().requires_grad_(True))
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-12)
    nones = [[(kind, [g is None for g in gs]) for kind, gs in run[1]] for run in (ours, theirs)]
    assert nones[0] == nones[1] == [("pre", [False, True]), ("post", [False, False, True])]
    for (_, mine), (_, torchs) in zip(ours[1], theirs[1]):
        for a, b in zip(mine, torchs):
            if a is not None:
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    w, b = model.layer.weight.detach(), model.layer.bias.detach()  # dL/dx = 2 * 2y W: the pre-hook doubles dL/dy
    torch.testing.assert_close(ours[0].as_subclass(torch.Tensor), 4 * (x @ w.T + b) @ w, rtol=0, atol=1e-12)


FACTORIES_LIKE = {
    "zeros_like": lambda x: torch.zeros_like(x, requires_grad=True),
    "ones_like": lambda x: torch.ones_like(x, requires_grad=True),
    "full_like": lambda x: torch.full_like(x, 0.5, requires_grad=True),
    "new_zeros": lambda x: x.new_zeros(x.shape, requires_grad=True),
    "new_ones": lambda x: x.new_ones(x.shape, requires_grad=True),
    "new_full": lambda x: x.new_full(x.shape, -1.5, requires_grad=True),
    "new_tensor": lambda x: x.new_tensor([0.25, -2.0, 3.0], requires_grad=True),
}


@pytest.mark.parametrize("name", sorted(FACTORIES_LIKE))
def test_a_factory_called_on_a_tracer_with_requires_grad_makes_a_leaf_that_gets_its_gradient(name):
    """torch.zeros_like(x, requires_grad=True) (delta = ...; an adversarial perturbation) gave a tracer that did
    not require grad, with torch's own flag left True underneath: no gradient and no error."""
    make = FACTORIES_LIKE[name]
    values = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)

    def program(x, d):
        return ((x + d) ** 3 * x).sum()

    ours_x = tt.tracer(values.clone(), requires_grad=True)
    ours_d = make(ours_x)
    assert type(ours_d) is tt.tracer and ours_d.requires_grad and ours_d.is_leaf
    assert not torch.Tensor.requires_grad.__get__(ours_d)  # torch's own flag stays False
    program(ours_x, ours_d).backward()
    theirs_x = values.clone().requires_grad_()
    theirs_d = make(theirs_x)
    program(theirs_x, theirs_d).backward()
    torch.testing.assert_close(ours_d.grad.as_subclass(torch.Tensor), theirs_d.grad)
    base = theirs_d.detach()
    numeric = torch.stack([(program(values, base + e) - program(values, base - e)) / 2e-6
                           for e in torch.eye(3, dtype=torch.float64) * 1e-6])
    torch.testing.assert_close(ours_d.grad.as_subclass(torch.Tensor), numeric, rtol=1e-6, atol=1e-6)


def test_a_factory_with_requires_grad_and_an_integer_dtype_is_refused_as_torch():
    with pytest.raises(RuntimeError, match="floating point"):
        torch.zeros_like(tt.tracer([1.0, 2.0]), dtype=torch.int64, requires_grad=True)


def test_set_on_a_tracer_that_requires_grad_is_refused_and_works_under_no_grad_as_torch():
    """Tensor.set_ never reaches __torch_function__: it swapped a leaf's data unchecked, and a non-leaf's later
    backward failed with a shape error from the engine."""
    ours, theirs = tt.tracer([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
    for t in (theirs, ours):
        with pytest.raises(RuntimeError):
            t.set_(torch.zeros(3))
    with pytest.raises(RuntimeError, match="set_ has no derivative"):
        (ours * 2).set_(torch.zeros(3))
    for t in (theirs, ours):
        with torch.no_grad():
            t.set_(torch.arange(3.0))
    assert type(ours) is tt.tracer and ours.requires_grad and ours.tolist() == theirs.tolist() == [0.0, 1.0, 2.0]
    (ours * ours).sum().backward()
    (theirs * theirs).sum().backward()
    assert ours.grad.tolist() == theirs.grad.tolist() == [0.0, 2.0, 4.0]


def test_retain_grad_on_a_tracer_that_does_not_require_grad_is_refused_as_torch():
    with pytest.raises(RuntimeError, match="requires_grad=False") as theirs:
        torch.ones(2).retain_grad()
    with pytest.raises(RuntimeError) as ours:
        tt.tracer([1.0, 2.0]).retain_grad()
    assert str(ours.value) == str(theirs.value)
    leaf = tt.tracer([1.0, 2.0], requires_grad=True)
    leaf.retain_grad()  # a leaf that requires grad: nothing to do, as torch
    (leaf * 3).sum().backward()
    assert leaf.grad.tolist() == [3.0, 3.0]


@pytest.mark.parametrize("create_graph", [False, True])
def test_grad_materialize_grads_gives_zeros_for_unused_inputs_as_torch(create_graph):
    values = torch.tensor([1.5, -2.0], dtype=torch.float64)
    x, unused = tt.tracer(values.clone(), requires_grad=True), tt.tracer(torch.ones(3), requires_grad=True)
    tx, tunused = values.clone().requires_grad_(), torch.ones(3, requires_grad=True)
    ours = tt.grad((x ** 3).sum(), [x, unused], materialize_grads=True, create_graph=create_graph)
    theirs = torch.autograd.grad((tx ** 3).sum(), [tx, tunused], materialize_grads=True, create_graph=create_graph)
    for mine, torchs in zip(ours, theirs):
        torch.testing.assert_close(mine.detach().as_subclass(torch.Tensor), torchs.detach())
        assert mine.requires_grad == torchs.requires_grad
    torch.testing.assert_close(ours[0].detach().as_subclass(torch.Tensor), 3 * values ** 2)  # d/dx x^3
    with pytest.raises(ValueError, match="allow_unused"):
        tt.grad((x ** 3).sum(), [x, unused], allow_unused=False, materialize_grads=True)
    with pytest.raises(ValueError, match="allow_unused"):
        torch.autograd.grad((tx ** 3).sum(), [tx, tunused], allow_unused=False, materialize_grads=True)


def test_a_plain_backward_after_a_create_graph_one_adds_into_the_same_grad_as_torch():
    """The second backward replaced .grad by a new tensor without a graph; torch adds in place into the .grad the
    first one made (which keeps its graph)."""
    results = []
    for x in (torch.tensor([1.0, 2.0], requires_grad=True), tt.tracer([1.0, 2.0], requires_grad=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's warning about the reference cycle create_graph makes
            (x ** 2).sum().backward(create_graph=True)
        first = x.grad
        (x ** 3).sum().backward()
        results.append((x.grad is first, x.grad.requires_grad, x.grad.tolist()))
    assert results[0] == results[1] == (True, True, [5.0, 16.0])  # 2x + 3x^2


def test_backward_and_grad_refuse_gradients_that_do_not_fit_as_torch():
    """A second output without a gradient was dropped by zip (no error, no gradient from it); a list of floats as
    gradient raised an AttributeError; tt.grad with no inputs returned ()."""
    for make, backward, grad in [(lambda: tt.tracer([1.0, 2.0, 3.0], requires_grad=True), tt.backward, tt.grad),
                                 (lambda: torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.autograd.backward,
                                  torch.autograd.grad)]:
        y = make() * 2
        with pytest.raises(TypeError, match="Tensors or None, but got float"):
            y.backward([1.0, 1.0, 1.0])
        with pytest.raises(RuntimeError, match="got 2 tensors and 1 gradients"):
            backward([y.sum(), (y * y).sum()], [torch.tensor(1.0)])
        with pytest.raises(RuntimeError, match="cannot be empty"):
            grad(y.sum(), [])


def test_gradients_beyond_the_outputs_are_ignored_as_torch_ignores_them():
    """torch.autograd.grad / backward given more gradients than outputs use the first ones (torch's engine zips
    them); torchtrace raised. Both against torch autograd and the analytic gradient (d/dx sum(x * 3) * 0.5 = 1.5)."""
    answers = []
    for make, backward, grad in [(lambda: tt.tracer([1.0, 2.0, 3.0], requires_grad=True), tt.backward, tt.grad),
                                 (lambda: torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.autograd.backward,
                                  torch.autograd.grad)]:
        for entry in (grad, torch.autograd.grad):
            x = make()
            (g,) = entry([(x * 3).sum()], [x], grad_outputs=[torch.tensor(0.5), torch.tensor(7.0)])
            answers.append(g.tolist())
        x = make()
        backward([(x * 3).sum()], [torch.tensor(0.5), torch.tensor(7.0)])
        answers.append(x.grad.tolist())
    assert answers == [[1.5, 1.5, 1.5]] * 6


LAYOUTS = {
    "transposed": lambda: torch.randn(4, 3, dtype=torch.float64).t(),
    "channels_last": lambda: torch.randn(2, 3, 4, 5, dtype=torch.float64).to(memory_format=torch.channels_last),
    "contiguous": lambda: torch.randn(3, 4, dtype=torch.float64),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", ["tracer", "plain leaf"])
def test_grad_is_laid_out_as_its_leaf_as_torch(layout, kind):
    """torch's gradient layout contract: a dense leaf's .grad has the leaf's strides (a transposed or channels_last
    weight); torchtrace's was always contiguous. Values against torch and central differences; strides as torch's,
    after the first backward and after an accumulating second one."""
    values = LAYOUTS[layout]()
    weights = torch.rand(values.shape, dtype=torch.float64)

    def program(w, x):
        return ((w * x) ** 2 * weights).sum()

    theirs = values.clone(memory_format=torch.preserve_format).requires_grad_()
    ours_x = tt.tracer(torch.ones((), dtype=torch.float64), requires_grad=True)
    if kind == "tracer":
        ours = tt.tracer(values.clone(memory_format=torch.preserve_format), requires_grad=True)
    else:
        ours = values.clone(memory_format=torch.preserve_format).requires_grad_()
    assert ours.stride() == theirs.stride()
    for _ in range(2):
        program(theirs, torch.ones((), dtype=torch.float64)).backward()
        program(ours, ours_x).backward()
        assert ours.grad.stride() == theirs.grad.stride()
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad, rtol=1e-12, atol=1e-12)
    base = values.detach().reshape(-1)
    numeric = torch.stack([(program((base + e).reshape(values.shape), 1.0) - program((base - e).reshape(
        values.shape), 1.0)) / 2e-6 for e in torch.eye(base.numel(), dtype=torch.float64) * 1e-6])
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor).reshape(-1), 2 * numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("where", ["leaf", "non-leaf"])
def test_a_hook_that_changes_the_dtype_is_refused_as_torch(where):
    """torch refuses it; torchtrace left a float32 .grad on a float64 leaf (on a non-leaf: rounded it silently)."""
    for make in (lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True),
                 lambda v: tt.tracer(torch.tensor(v, dtype=torch.float64), requires_grad=True)):
        x = make([1.0, 2.0, 3.0])
        h = x if where == "leaf" else x * 1
        h.register_hook(lambda g: (g / 3).float())
        with pytest.raises(RuntimeError, match="hook '<lambda>' has changed the type of value"):
            (h * 2).sum().backward()


def test_a_leaf_frozen_between_forward_and_backward_gets_no_grad_as_torch():
    """w.requires_grad_(False) after the forward: torch leaves w.grad None (its optimizers then skip w); torchtrace
    filled it. The other leaf's gradient is unchanged, against torch and central differences."""
    results = []
    for make in (lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True),
                 lambda v: tt.tracer(torch.tensor(v, dtype=torch.float64), requires_grad=True)):
        w, x = make([1.0, 2.0]), make([0.5, -1.0])
        loss = (w * x * x).sum()
        w.requires_grad_(False)
        loss.backward()
        assert w.grad is None
        results.append(x.grad.as_subclass(torch.Tensor))
    torch.testing.assert_close(results[1], results[0])
    numeric = torch.tensor([((torch.tensor([1.0, 2.0]) * (torch.tensor([0.5, -1.0]) + e) ** 2).sum()
                             - (torch.tensor([1.0, 2.0]) * (torch.tensor([0.5, -1.0]) - e) ** 2).sum()) / 2e-3
                            for e in torch.eye(2) * 1e-3], dtype=torch.float64)
    torch.testing.assert_close(results[1], numeric, rtol=1e-4, atol=1e-4)


def test_grad_with_respect_to_a_result_does_not_run_its_own_node_as_torch():
    """tt.grad(loss, h) for h = x.exp() ran (and freed) ExpBackward: a later backward through h failed with 'backward
    through the graph a second time'. torch captures h's gradient without running h's node."""
    outcomes = []
    for grad, make in ((torch.autograd.grad, lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True)),
                       (tt.grad, lambda v: tt.tracer(torch.tensor(v, dtype=torch.float64), requires_grad=True))):
        x = make([1.0, 2.0])
        h = x.exp()
        (gh,) = grad((h * h).sum(), h)
        (again,) = grad(h, h, torch.ones(2, dtype=torch.float64))  # h itself: captured at its node, not run
        h.sum().backward()
        outcomes.append((gh.as_subclass(torch.Tensor), again.as_subclass(torch.Tensor),
                         x.grad.as_subclass(torch.Tensor)))
    for ours, theirs in zip(outcomes[1], outcomes[0]):
        torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(outcomes[1][2], torch.tensor([1.0, 2.0], dtype=torch.float64).exp())  # d/dx sum e^x


def _pack_rounded(calls):
    return (lambda t: calls.append("pack") or torch.round(t.detach() * 4) / 4,
            lambda t: calls.append("unpack") or t)


def test_saved_tensors_hooks_pack_and_unpack_what_rules_save_as_torch():
    """Hooks that change what is saved (compressed activations) were never called: another gradient than torch's.
    Now each saved tensor goes through pack in forward and unpack in backward, as torch's; the gradient equals
    torch's, and (without the rounding) central differences."""
    def program(x, w):
        return (torch.tanh(x * w) * x).sum()

    outcomes = []
    for make in (lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True),
                 lambda v: tt.tracer(torch.tensor(v, dtype=torch.float64), requires_grad=True)):
        x, w = make([0.3, -1.2, 2.1]), make([1.1, 0.7, -0.4])
        calls = []
        with torch.autograd.graph.saved_tensors_hooks(*_pack_rounded(calls)):
            y = program(x, w)
        y.backward()
        outcomes.append((x.grad.as_subclass(torch.Tensor), w.grad.as_subclass(torch.Tensor), sorted(calls)))
        with pytest.raises(RuntimeError, match="second time"):
            y.backward()
    torch.testing.assert_close(outcomes[1][:2], outcomes[0][:2])
    assert outcomes[1][2] == outcomes[0][2] and "pack" in outcomes[1][2]
    x0 = torch.tensor([0.3, -1.2, 2.1], dtype=torch.float64)
    w0 = torch.tensor([1.1, 0.7, -0.4], dtype=torch.float64)
    x, w = tt.tracer(x0.clone(), requires_grad=True), tt.tracer(w0.clone(), requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        program(x, w).backward()
    numeric = torch.stack([(program(x0 + e, w0) - program(x0 - e, w0)) / 2e-6 for e in torch.eye(3) * 1e-6])
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), numeric, rtol=1e-6, atol=1e-6)


def test_create_graph_through_hooked_saves_is_refused_and_compile_runs_eagerly_under_hooks():
    x = tt.tracer(torch.tensor([0.3, -1.2], dtype=torch.float64), requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = torch.tanh(x).sum()
    with pytest.raises(RuntimeError, match="create_graph=True through tensors saved under"):
        tt.grad(y, x, create_graph=True)
    compiled = tt.compile(lambda v: (v * v * 0.5).sum(), (x,))
    calls = []
    with torch.autograd.graph.saved_tensors_hooks(*_pack_rounded(calls)):
        out = compiled(x)
    (gx,) = tt.grad(out, x)
    theirs = torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(*_pack_rounded([])):
        (expected,) = torch.autograd.grad((theirs * theirs * 0.5).sum(), theirs)
    torch.testing.assert_close(gx.as_subclass(torch.Tensor), expected)
    assert "pack" in calls


def test_torch_checkpoint_without_reentrance_still_gives_the_exact_gradient():
    """torch.utils.checkpoint's default mode works through saved_tensors_hooks of its own: those are not followed
    on tracers (they rebuild torch autograd's graph), so what it saves is kept and the gradient is exact."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    theirs = torch.nn.Linear(3, 3).double()
    ours = tt.port(copy.deepcopy(theirs))
    data = torch.randn(2, 3, dtype=torch.float64)
    x = tt.tracer(data.clone(), requires_grad=True)
    checkpoint(lambda h: torch.tanh(ours(h)), x, use_reentrant=False).sum().backward()
    plain_x = data.clone().requires_grad_()
    checkpoint(lambda h: torch.tanh(theirs(h)), plain_x, use_reentrant=False).sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), plain_x.grad)
    torch.testing.assert_close(ours.weight.grad.as_subclass(torch.Tensor), theirs.weight.grad)


@pytest.mark.parametrize("where", ["tensor hook", "tt.Function backward", "torch Function backward"])
def test_autograd_inside_a_hook_or_a_backward_as_torch(where):
    """with torch.enable_grad(): tt.grad(...) inside a hook or a custom backward (implicit differentiation, a
    reentrant checkpoint) failed: the walk hid the tracers' ops from torchtrace. Gradients against torch's and the
    closed form d/dx Σ 2x · 3w² = 6w²."""
    def program(make, grad, base, x0, w0):
        w, x = make(w0), make(x0)

        def hook(g):
            with torch.enable_grad():
                (gw,) = grad((w ** 3).sum(), w)
            return g * gw

        class Twice(base):
            @staticmethod
            def forward(ctx, v):
                return v * 2

            @staticmethod
            def backward(ctx, g):
                return hook(g) * 2

        if where == "tensor hook":
            y = x * 2
            y.register_hook(hook)
        else:
            y = Twice.apply(x)
        y.sum().backward()
        return x.grad.as_subclass(torch.Tensor)

    torch_make = lambda v: v.clone().requires_grad_()  # noqa: E731
    tt_make = lambda v: tt.tracer(v.clone(), requires_grad=True)  # noqa: E731
    x0, w0 = torch.tensor([3.0, 4.0], dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
    ours = program(tt_make, tt.grad, torch.autograd.Function if where.startswith("torch") else tt.Function, x0, w0)
    theirs = program(torch_make, torch.autograd.grad, torch.autograd.Function, x0, w0)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours, 2 * 3 * w0 ** 2)  # d/dx sum(2x) = 2, scaled by 3w² elementwise


def test_a_leafs_accumulate_grad_node_takes_grad_fn_hooks_as_torch():
    """y.grad_fn.next_functions[0][0] (a leaf's AccumulateGrad, where older DDP code hooks) had no register_hook /
    register_prehook (AttributeError). A pre-hook may replace the gradient; a hook sees ((), (grad,)) after."""
    seen = {}
    for name, make in (("torch", lambda: torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)),
                       ("tt", lambda: tt.tracer(torch.tensor([1.0, -2.0], dtype=torch.float64), requires_grad=True))):
        w = make()
        acc = (w * 1).grad_fn.next_functions[0][0]
        acc.register_prehook(lambda gs: (gs[0] * 2,))
        calls = []
        handle = acc.register_hook(lambda gi, go: calls.append((len(gi), go[0].as_subclass(torch.Tensor).clone())))
        (w * w * 3).sum().backward()
        handle.remove()
        (w * 1).sum().backward()
        seen[name] = (w.grad.as_subclass(torch.Tensor), calls)
    torch.testing.assert_close(seen["tt"][0], seen["torch"][0])
    torch.testing.assert_close(seen["tt"][0], torch.tensor([1.0, -2.0], dtype=torch.float64) * 12 + 2)  # 2·6w, 2·1
    assert [n for n, _ in seen["tt"][1]] == [n for n, _ in seen["torch"][1]] == [0]
    torch.testing.assert_close(seen["tt"][1][0][1], seen["torch"][1][0][1])


@pytest.mark.parametrize("lib", ["torch", "tt"])
def test_a_handle_removed_twice_removes_its_own_registration_only(lib):
    """The same function registered twice, the first handle removed twice: the second registration still runs (x.grad
    = 2 * 3 from the non-leaf's doubling hook, 2 from the leaf's), as do grad_fn and post-accumulate hooks."""
    make = (lambda: torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)) if lib == "torch" else (
        lambda: tt.tracer([1.0, 2.0], dtype=torch.float64, requires_grad=True))
    for leaf, expected in ((False, 6.0), (True, 2.0)):
        x = make()
        t = x if leaf else x * 3
        double = lambda g: g * 2  # noqa: E731
        first = t.register_hook(double)
        t.register_hook(double)
        first.remove()
        first.remove()
        (t * 1).sum().backward()
        assert x.grad.tolist() == [expected, expected]
    calls = []
    x = make()
    y = x * 3
    for register, hook in ((y.grad_fn.register_prehook, lambda go: calls.append("pre")),
                           (y.grad_fn.register_hook, lambda gi, go: calls.append("post")),
                           (x.register_post_accumulate_grad_hook, lambda p: calls.append("accumulated"))):
        handle = register(hook)
        register(hook)
        handle.remove()
        handle.remove()
    y.sum().backward()
    assert calls == ["pre", "post", "accumulated"]


def test_grad_of_a_dict_of_inputs_is_a_dict_of_the_same_keys_as_torchs():
    """tt.grad(out, dict(model.named_parameters())): the dict's keys were taken as the inputs."""
    model = torch.nn.Linear(3, 2).double()
    ported = tt.port(copy.deepcopy(model))
    x = torch.rand(4, 3, dtype=torch.float64)
    expected = torch.autograd.grad((model(x) ** 2).sum(), dict(model.named_parameters()))
    got = tt.grad((ported(x) ** 2).sum(), dict(ported.named_parameters()))
    assert list(got) == list(expected) == ["weight", "bias"]
    for name in expected:
        torch.testing.assert_close(got[name].as_subclass(torch.Tensor), expected[name])


@pytest.mark.parametrize("leaf", ["tracer", "torch leaf"])
def test_a_post_accumulate_grad_hook_that_returns_a_tensor_is_refused_as_torch(leaf):
    """The returned tensor was ignored silently (a student expecting it to become .grad got no signal)."""
    x = tt.ones(2, requires_grad=True) if leaf == "tracer" else torch.ones(2, requires_grad=True)
    x.register_post_accumulate_grad_hook(lambda t: torch.zeros(2))
    with pytest.raises(RuntimeError, match="post accumulate grad hooks should return None"):
        (x * tt.ones(2)).sum().backward()
    plain = torch.ones(2, requires_grad=True)
    plain.register_post_accumulate_grad_hook(lambda t: torch.zeros(2))
    with pytest.raises(RuntimeError, match="post accumulate grad hooks should return None"):
        (plain * 1).sum().backward()


def test_grad_fn_saved_tensors_as_torchs_and_refused_once_freed():
    class Double(tt.Function):
        """y = 2 a  ->  dy/da = 2"""

        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = tt.ones(2, requires_grad=True)
    y = Double.apply(x)
    assert len(y.grad_fn.saved_tensors) == 1 and y.grad_fn.saved_tensors[0] is x
    assert len((x * x).grad_fn.saved_tensors) == 2
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.grad_fn.saved_tensors
