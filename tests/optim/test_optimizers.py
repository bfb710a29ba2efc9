"""torchtrace.optim optimizers, run side by side with torch.optim on the same float64 model for 100 steps."""
import io

import pytest
import torch

import torchtrace as tt
import torchtrace.optim as tto

SHAPES = [(3, 4), (4,), (4,), ()]  # w1, b1, w2, c: a matrix, two vectors and a scalar


def initial_values(seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]


def batches(n: int = 4, seed: int = 1) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, generator=gen, dtype=torch.float64), torch.randn(8, generator=gen, dtype=torch.float64))
            for _ in range(n)]


DATA = batches()


def model_loss(params: list, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A one-hidden-layer regression net built from add/sub/mul/div/pow/sum (works on tracers and on tensors)."""
    w1, b1, w2, c = params
    h = (x.unsqueeze(-1) * w1).sum(1) + b1
    h = h / (1 + h * h)  # a smooth squashing nonlinearity
    out = (h * w2).sum(1) + c
    return ((out - y) ** 2).sum() / len(y)


def tracers(values: list) -> list:
    return [tt.tracer(v, requires_grad=True) for v in values]


def torch_leaves(values: list) -> list:
    return [v.clone().requires_grad_(True) for v in values]


def run(optimizer, params: list, steps: int, start: int = 0, set_to_none: bool = True) -> None:
    for i in range(start, start + steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        model_loss(params, *DATA[i % len(DATA)]).backward()
        optimizer.step()


def as_plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


def assert_params_equal(ours: list, theirs: list, atol: float = 1e-10) -> None:
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(as_plain(a), as_plain(b), atol=atol, rtol=0)


CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.002, momentum=0.5, maximize=True)),
    ("Adam", dict()),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1)),
    ("Adam", dict(lr=0.001, betas=(0.8, 0.99), eps=1e-6, maximize=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.5, amsgrad=True, betas=(0.5, 0.9))),
    # torch's multi-tensor kernels (its default on CUDA): every step at once for all parameters
    ("Adam", dict(lr=0.01, foreach=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, amsgrad=True, maximize=True, foreach=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.5, amsgrad=True, foreach=True)),
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=0.001, alpha=0.9, eps=1e-6, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, centered=True)),
    ("RMSprop", dict(lr=0.005, centered=True, momentum=0.5, weight_decay=0.01)),
    ("RMSprop", dict(lr=0.001, maximize=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.5)),
    ("Adagrad", dict(lr=0.01, eps=1e-5, maximize=True)),
]


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{sorted(o.items())}" for n, o in CASES])
def test_100_steps_match_torch_optim(name, options):
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = getattr(tto, name)(ours, **options), getattr(torch.optim, name)(theirs, **options)
    run(ours_opt, ours, 100)
    run(theirs_opt, theirs, 100)
    assert_params_equal(ours, theirs)
    assert any((as_plain(p) - v).abs().max() > 1e-3 for p, v in zip(ours, init)), "the parameters did not move"
    for a, b in zip(ours, theirs):  # same state, under torch's names
        assert set(ours_opt.state[a]) == set(theirs_opt.state[b])
        for key, value in theirs_opt.state[b].items():
            assert type(ours_opt.state[a][key]) is torch.Tensor
            torch.testing.assert_close(ours_opt.state[a][key], value, atol=1e-10, rtol=0, check_dtype=False)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_parameters_stay_leaves_and_nothing_is_recorded(name):
    params = tracers(initial_values())
    optimizer = getattr(tto, name)(params, lr=0.01)
    run(optimizer, params, 3)
    for p in params:
        assert type(p) is tt.tracer and p.is_leaf and p.grad_fn is None and p.requires_grad
        assert type(p.grad) is torch.Tensor


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_foreach_updates_are_torchs_bit_for_bit_in_float32(name):
    """The multi-tensor form (torch's default on CUDA; foreach=True here on the CPU) equals torch's own, exactly,
    and equals the one-parameter-at-a-time form to rounding."""
    init = [v.float() for v in initial_values()]
    results = []
    for module, foreach in ((tto, True), (torch.optim, True), (tto, False)):
        params = tracers(init) if module is tto else torch_leaves(init)
        optimizer = getattr(module, name)(params, lr=0.01, amsgrad=True, weight_decay=0.1, foreach=foreach)
        for i in range(30):
            optimizer.zero_grad()
            model_loss(params, *[t.float() for t in DATA[i % len(DATA)]]).backward()
            optimizer.step()
        results.append([as_plain(p) for p in params])
    ours, theirs, one_at_a_time = results
    for a, b, c in zip(ours, theirs, one_at_a_time):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c)


def test_foreach_with_a_tensor_lr_is_refused_as_torch_refuses_it():
    message = "lr as a Tensor is not supported for capturable=False and foreach=True"
    params = tracers(initial_values())
    with pytest.raises(ValueError, match=message):
        tto.Adam(params, lr=torch.tensor(0.01), foreach=True)
    optimizer = tto.Adam(params, lr=0.01, foreach=True)
    optimizer.param_groups[0]["lr"] = torch.tensor(0.01)  # set later: torch's step refuses it
    with pytest.raises(RuntimeError, match=message):
        run(optimizer, params, 1)


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("name, options", [("Adam", {}), ("AdamW", {}), ("Adam", {"weight_decay": 0.1}),
                                           ("Adagrad", {"lr_decay": 0.01}), ("SGD", {"momentum": 0.9}),
                                           ("Adam", {"betas": "tensors"}), ("RMSprop", {})])
def test_a_tensor_lr_updates_as_torchs_bit_for_bit(name, options, shape):
    """torch computes lr / (1 - beta1^t) (Adagrad's lr / (1 + (t - 1) lr_decay), AdamW's 1 - lr wd) in the tensor's
    float32; float(lr) first made it float64 arithmetic: 1 ulp off in a few steps. A 1-element tensor of one
    dimension is read as a 0-d one, as torch's optimizers read it (its step raised a TypeError from addcdiv_)."""
    init = initial_values()
    sides = []
    if options.get("betas") == "tensors":
        options = {"betas": (torch.tensor(0.9).reshape(shape), torch.tensor(0.999).reshape(shape))}
    for module, params in ((tto, tracers(init)), (torch.optim, torch_leaves(init))):
        optimizer = getattr(module, name)(params, lr=torch.tensor(0.1).reshape(shape), **options)
        run(optimizer, params, 8)
        sides.append([as_plain(p) for p in params])
    for ours, theirs in zip(*sides):
        assert torch.equal(ours, theirs)


def test_foreach_skips_a_group_without_gradients_as_torch():
    init = initial_values()
    sides = []
    for module, params in ((tto, tracers(init)), (torch.optim, torch_leaves(init))):
        optimizer = module.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 0.1}], foreach=True)
        (params[0] * params[1]).sum().backward()  # the second group gets no gradient
        optimizer.step()
        sides.append((params, len(optimizer.state)))
    (ours, our_states), (theirs, their_states) = sides
    assert our_states == their_states == 2
    assert_params_equal(ours, theirs, atol=0)


@pytest.mark.parametrize("betas, foreach, message", [
    ((torch.tensor(0.9), torch.tensor(0.99)), True, r"betas\[0\] as a Tensor is not supported"),
    ((0.9, torch.tensor(0.99)), None, "betas must be either both floats or both Tensors"),
])
def test_adam_refuses_betas_as_torch_does(betas, foreach, message):
    for module in (torch.optim, tto):
        with pytest.raises(ValueError, match=message):
            module.Adam(torch_leaves(initial_values()), betas=betas, foreach=foreach)


@pytest.mark.parametrize("foreach", [True, False])
def test_a_checkpoint_with_a_numeric_step_count_loads_as_torchs(foreach):
    """A state_dict whose step counts are numbers (older checkpoints): loaded, they become 0-d tensors and the
    steps continue exactly as torch's."""
    init = initial_values()
    sides = []
    for module, params in ((tto, tracers(init)), (torch.optim, torch_leaves(init))):
        optimizer = module.Adam(params, lr=0.01, foreach=foreach)
        run(optimizer, params, 2)
        saved = optimizer.state_dict()
        for values in saved["state"].values():
            values["step"] = float(values["step"])
        optimizer = module.Adam(params, lr=0.01, foreach=foreach)
        optimizer.load_state_dict(saved)
        run(optimizer, params, 3, start=2)
        sides.append((params, optimizer))
    (ours, ours_opt), (theirs, theirs_opt) = sides
    assert_params_equal(ours, theirs, atol=0)
    assert all(type(ours_opt.state[p]["step"]) is torch.Tensor for p in ours)


def test_param_groups_with_different_lrs():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    groups = lambda p: [{"params": p[:2], "lr": 0.1}, {"params": p[2:], "momentum": 0.5}]  # noqa: E731
    ours_opt = tto.SGD(groups(ours), lr=0.01, momentum=0.9)
    theirs_opt = torch.optim.SGD(groups(theirs), lr=0.01, momentum=0.9)
    assert [g["lr"] for g in ours_opt.param_groups] == [0.1, 0.01]
    assert [g["momentum"] for g in ours_opt.param_groups] == [0.9, 0.5]
    run(ours_opt, ours, 100)
    run(theirs_opt, theirs, 100)
    assert_params_equal(ours, theirs)


def test_add_param_group_later():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = tto.Adam(ours[:3], lr=0.01), torch.optim.Adam(theirs[:3], lr=0.01)
    run(ours_opt, ours, 5)
    run(theirs_opt, theirs, 5)
    ours_opt.add_param_group({"params": ours[3], "lr": 0.05})
    theirs_opt.add_param_group({"params": theirs[3], "lr": 0.05})
    run(ours_opt, ours, 50, start=5)
    run(theirs_opt, theirs, 50, start=5)
    assert_params_equal(ours, theirs)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    params = tracers(initial_values())
    optimizer = tto.SGD(params, lr=0.1)
    model_loss(params, *DATA[0]).backward()
    optimizer.zero_grad(set_to_none=set_to_none)
    for p in params:
        if set_to_none:
            assert p.grad is None
        else:
            assert type(p.grad) is torch.Tensor and p.grad.shape == p.shape and not p.grad.any()


def test_training_with_zero_grad_to_zeros_matches_torch():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = tto.RMSprop(ours, lr=0.01, momentum=0.9), torch.optim.RMSprop(theirs, lr=0.01, momentum=0.9)
    run(ours_opt, ours, 100, set_to_none=False)
    run(theirs_opt, theirs, 100, set_to_none=False)
    assert_params_equal(ours, theirs)


def test_zero_grad_drops_the_graph_of_a_create_graph_gradient():
    params = tracers(initial_values())
    optimizer = tto.SGD(params, lr=0.1)
    sum((p * p * p).sum() for p in params).backward(create_graph=True)  # no broadcasting: independent of other rules
    assert isinstance(params[0].grad, tt.tracer)
    optimizer.step()  # a tracer gradient is used as plain values
    assert all(p.is_leaf for p in params)
    optimizer.zero_grad(set_to_none=False)
    assert all(type(p.grad) is torch.Tensor and not p.grad.any() for p in params)


def test_gradients_accumulate_without_zero_grad_like_torch():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = tto.SGD(ours, lr=0.01), torch.optim.SGD(theirs, lr=0.01)
    for i in range(20):
        for params, optimizer in ((ours, ours_opt), (theirs, theirs_opt)):
            model_loss(params, *DATA[i % len(DATA)]).backward()  # no zero_grad: gradients pile up
            optimizer.step()
    assert_params_equal(ours, theirs)


def test_step_with_closure_returns_the_loss():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = tto.SGD(ours, lr=0.1, momentum=0.9), torch.optim.SGD(theirs, lr=0.1, momentum=0.9)

    def closure(params, optimizer):
        def evaluate():
            optimizer.zero_grad()
            loss = model_loss(params, *DATA[0])
            loss.backward()
            return loss
        return evaluate

    for _ in range(10):
        with tt.no_grad():  # step() turns recording back on for the closure, as torch does
            ours_loss = ours_opt.step(closure(ours, ours_opt))
        theirs_loss = theirs_opt.step(closure(theirs, theirs_opt))
        assert abs(ours_loss.item() - theirs_loss.item()) < 1e-10
    assert_params_equal(ours, theirs)


def test_works_on_plain_torch_parameters():
    init = initial_values()
    ours, theirs = torch_leaves(init), torch_leaves(init)
    run(tto.AdamW(ours, lr=0.01), ours, 30)
    run(torch.optim.AdamW(theirs, lr=0.01), theirs, 30)
    assert_params_equal(ours, theirs)


OPTIONS_FOR_ROUND_TRIP = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01)),
]


@pytest.mark.parametrize("name, options", OPTIONS_FOR_ROUND_TRIP, ids=[n for n, _ in OPTIONS_FOR_ROUND_TRIP])
def test_state_dict_round_trip_equals_an_uninterrupted_run(name, options):
    init = initial_values()
    uninterrupted = tracers(init)
    run(getattr(tto, name)(uninterrupted, **options), uninterrupted, 20)

    first = tracers(init)
    optimizer = getattr(tto, name)(first, **options)
    run(optimizer, first, 10)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)  # plain tensors and Python values: loads with weights_only=True
    buffer.seek(0)
    saved = torch.load(buffer)

    resumed = tracers([as_plain(p) for p in first])
    fresh = getattr(tto, name)(resumed, lr=123.0)  # the loaded hyperparameters replace these
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == options["lr"]
    run(fresh, resumed, 10, start=10)
    assert_params_equal(resumed, uninterrupted, atol=0)


def test_state_dict_structure_is_torchs():
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    groups = lambda p: [{"params": p[:1]}, {"params": p[1:], "lr": 0.1}]  # noqa: E731
    ours_opt, theirs_opt = tto.Adam(groups(ours), amsgrad=True), torch.optim.Adam(groups(theirs), amsgrad=True)
    run(ours_opt, ours, 2)
    run(theirs_opt, theirs, 2)
    ours_sd, theirs_sd = ours_opt.state_dict(), theirs_opt.state_dict()
    assert set(ours_sd) == {"state", "param_groups"}
    assert [g["params"] for g in ours_sd["param_groups"]] == [g["params"] for g in theirs_sd["param_groups"]] == [
        [0], [1, 2, 3]]
    assert {i: set(s) for i, s in ours_sd["state"].items()} == {i: set(s) for i, s in theirs_sd["state"].items()}
    for ours_group, theirs_group in zip(ours_sd["param_groups"], theirs_sd["param_groups"]):
        assert {key: theirs_group[key] for key in ours_group} == ours_group  # torch's keys, minus foreach/fused/...


def test_state_dict_is_a_snapshot():
    params = tracers(initial_values())
    optimizer = tto.Adam(params, lr=0.01)
    run(optimizer, params, 3)
    saved = optimizer.state_dict()
    exp_avg = saved["state"][0]["exp_avg"].clone()
    run(optimizer, params, 3, start=3)
    assert torch.equal(saved["state"][0]["exp_avg"], exp_avg)
    assert float(saved["state"][0]["step"]) == 3.0


@pytest.mark.parametrize("name, options", OPTIONS_FOR_ROUND_TRIP, ids=[n for n, _ in OPTIONS_FOR_ROUND_TRIP])
def test_loads_a_torch_optim_state_dict(name, options):
    init = initial_values()
    theirs = torch_leaves(init)
    theirs_opt = getattr(torch.optim, name)(theirs, **options)
    run(theirs_opt, theirs, 10)
    ours = tracers([as_plain(p) for p in theirs])
    ours_opt = getattr(tto, name)(ours)
    ours_opt.load_state_dict(theirs_opt.state_dict())
    run(ours_opt, ours, 10, start=10)
    run(theirs_opt, theirs, 10, start=10)
    assert_params_equal(ours, theirs)


def test_load_state_dict_casts_state_to_the_parameter_dtype():
    params32 = tracers([v.float() for v in initial_values()])
    source = tto.Adam(tracers(initial_values()), lr=0.01)
    run(source, source.param_groups[0]["params"], 2)
    target = tto.Adam(params32)
    target.load_state_dict(source.state_dict())
    assert target.state[params32[0]]["exp_avg"].dtype == torch.float32
    assert target.state[params32[0]]["step"].dtype == source.state[source.param_groups[0]["params"][0]]["step"].dtype


def test_load_state_dict_refuses_a_different_layout():
    params = tracers(initial_values())
    saved = tto.SGD(params, lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        tto.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1).load_state_dict(saved)
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        tto.SGD(params[:3], lr=0.1).load_state_dict(saved)


def test_repr_lists_the_groups():
    text = repr(tto.SGD(tracers(initial_values()), lr=0.1, momentum=0.9))
    assert text.startswith("SGD (") and "Parameter Group 0" in text
    assert "    lr: 0.1" in text and "    momentum: 0.9" in text


def test_named_parameters_are_accepted():
    params = tracers(initial_values())
    optimizer = tto.SGD([(f"p{i}", p) for i, p in enumerate(params)], lr=0.1)
    assert optimizer.param_groups[0]["params"] == params  # list equality by identity first
    assert optimizer.param_groups[0]["param_names"] == ["p0", "p1", "p2", "p3"]


@pytest.mark.parametrize("make, error, message", [
    (lambda p: tto.SGD(p, lr=-0.1), ValueError, "Invalid learning rate: -0.1"),
    (lambda p: tto.SGD(p, momentum=-1), ValueError, "Invalid momentum value: -1"),
    (lambda p: tto.SGD(p, nesterov=True), ValueError, "Nesterov momentum requires a momentum and zero dampening"),
    (lambda p: tto.SGD(p, momentum=0.9, dampening=0.1, nesterov=True), ValueError, "zero dampening"),
    (lambda p: tto.Adam(p, betas=(1.0, 0.999)), ValueError, "Invalid beta parameter at index 0: 1.0"),
    (lambda p: tto.Adam(p, betas=(0.9, -0.1)), ValueError, "Invalid beta parameter at index 1"),
    (lambda p: tto.Adam(p, eps=-1e-8), ValueError, "Invalid epsilon value"),
    (lambda p: tto.Adam(p, betas=(0.9,)), ValueError, "a pair"),  # step() failed to unpack it
    (lambda p: tto.Adam(p, betas=(0.9, 0.99, 0.5)), ValueError, "a pair"),
    (lambda p: tto.SGD(p, lr="a"), TypeError, "Invalid learning rate: 'a'"),  # '<' not supported between...
    (lambda p: tto.SGD(p, lr=0.1, momentum=None), TypeError, "Invalid momentum"),
    (lambda p: tto.AdamW(p, weight_decay=-1), ValueError, "Invalid weight_decay value: -1"),
    (lambda p: tto.RMSprop(p, alpha=-0.5), ValueError, "Invalid alpha value: -0.5"),
    (lambda p: tto.Adagrad(p, lr_decay=-1), ValueError, "Invalid lr_decay value"),
    (lambda p: tto.Adagrad(p, initial_accumulator_value=-1), ValueError, "Invalid initial_accumulator_value value"),
    (lambda p: tto.Adam(p, fused=True), NotImplementedError, "fused=True is not supported"),
    (lambda p: tto.RMSprop(p, capturable=True), NotImplementedError, "capturable=True"),
    (lambda p: tto.SGD(p, differentiable=True), NotImplementedError, "differentiable=True"),
    (lambda p: tto.SGD(p[0]), TypeError, "should be an iterable of Tensors or dicts"),
    (lambda p: tto.SGD([]), ValueError, "optimizer got an empty parameter list"),
    (lambda p: tto.SGD([p[0], 3.0]), TypeError, "optimizer can only optimize Tensors, but one of the params is float"),
    (lambda p: tto.SGD([p[0] * 2]), ValueError, "can't optimize a non-leaf Tensor"),
    (lambda p: tto.SGD([{"params": p[:2]}, {"params": p[1:]}]), ValueError, "more than one parameter group"),
    (lambda p: tto.SGD([{"params": set(p)}]), TypeError, "ordered collections"),
    (lambda p: tto.SGD([tt.tracer(torch.ones(2, dtype=torch.complex128), requires_grad=True)]), NotImplementedError,
     "complex parameters are not supported"),
])
def test_refused_arguments(make, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        make(tracers(initial_values()))


def test_duplicate_parameters_warn():
    p = tracers(initial_values())[0]
    with pytest.warns(UserWarning, match="duplicate parameters"):
        tto.SGD([p, p], lr=0.1)


def test_step_without_gradients_changes_nothing():
    init = initial_values()
    params = tracers(init)
    optimizer = tto.Adam(params, lr=0.1)
    optimizer.step()
    assert_params_equal(params, init, atol=0)
    assert not optimizer.state


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{sorted(o.items())}" for n, o in CASES])
def test_same_gradients_give_bit_identical_steps(name, options):
    """Fed torch's gradients (plain tensors, and tracers every other step), each update equals torch.optim's exactly."""
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt, theirs_opt = getattr(tto, name)(ours, **options), getattr(torch.optim, name)(theirs, **options)
    for i in range(10):
        theirs_opt.zero_grad()
        model_loss(theirs, *DATA[i % len(DATA)]).backward()
        for a, b in zip(ours, theirs):
            a.grad = b.grad.clone() if i % 2 else tt.tracer(b.grad.clone())
        ours_opt.step()
        theirs_opt.step()
        for a, b in zip(ours, theirs):
            assert torch.equal(as_plain(a), b.detach()), f"step {i}: {name} {options} differs from torch.optim"


def _side_by_side(name: str, groups=lambda params: params, **options) -> tuple:
    """The same parameters as tracers and as torch leaves, with torchtrace's and torch's optimizer `name` on them."""
    init = initial_values()
    ours, theirs = tracers(init), torch_leaves(init)
    ours_opt = getattr(tto, name)(groups(ours), **options)
    return ours, theirs, ours_opt, getattr(torch.optim, name)(groups(theirs), **options)


def _adam_checkpoint(without_flag: bool) -> dict:
    """torch.optim.Adam's state_dict after 3 steps (optionally as an older torch wrote it: no decoupled flag)."""
    theirs = torch_leaves(initial_values())
    adam = torch.optim.Adam(theirs, lr=0.05, weight_decay=0.1)
    run(adam, theirs, 3)
    saved = adam.state_dict()
    if without_flag:
        for group in saved["param_groups"]:
            del group["decoupled_weight_decay"]
    return saved


@pytest.mark.parametrize("without_flag", [False, True], ids=["an Adam checkpoint", "an older checkpoint"])
def test_adamw_keeps_its_decay_decoupled_after_loading_any_checkpoint(without_flag):
    """As torch's AdamW: loading Adam's state (or one without the flag) must not turn its decay into an L2 penalty."""
    ours, theirs, ours_opt, theirs_opt = _side_by_side("AdamW", lr=0.05, weight_decay=0.1)
    ours_opt.load_state_dict(_adam_checkpoint(without_flag))
    theirs_opt.load_state_dict(_adam_checkpoint(without_flag))
    assert ours_opt.param_groups[0]["decoupled_weight_decay"] is theirs_opt.param_groups[0]["decoupled_weight_decay"]
    run(ours_opt, ours, 5)
    run(theirs_opt, theirs, 5)
    assert_params_equal(ours, theirs)


def test_adagrad_starts_every_sum_at_the_constructors_value_as_torch():
    """torch reads no group's own initial_accumulator_value (given at construction or in add_param_group), and its
    state exists before the first step."""
    first_two = lambda p: [{"params": p[:2], "initial_accumulator_value": 3.0}]  # noqa: E731
    ours, theirs, ours_opt, theirs_opt = _side_by_side("Adagrad", first_two, lr=0.1, initial_accumulator_value=0.5)
    states = [{i: {k: v.tolist() for k, v in s.items()} for i, s in o.state_dict()["state"].items()}
              for o in (ours_opt, theirs_opt)]
    assert states[0] == states[1] != {}
    ours_opt.add_param_group({"params": ours[2:], "initial_accumulator_value": 7.0})
    theirs_opt.add_param_group({"params": theirs[2:], "initial_accumulator_value": 7.0})
    run(ours_opt, ours, 5)
    run(theirs_opt, theirs, 5)
    assert_params_equal(ours, theirs)


def test_sgd_without_momentum_keeps_no_state_entries_as_torch():
    ours, theirs, ours_opt, theirs_opt = _side_by_side("SGD", lr=0.1)
    run(ours_opt, ours, 2)
    run(theirs_opt, theirs, 2)
    assert ours_opt.state_dict()["state"] == theirs_opt.state_dict()["state"] == {}
    assert_params_equal(ours, theirs)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_a_tensor_learning_rate_of_several_elements_is_refused_as_torch(name):
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        getattr(tto, name)(tracers(initial_values()), lr=torch.tensor([0.1, 0.2]))
