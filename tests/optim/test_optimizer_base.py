"""tt.optim optimizers are torch.optim.Optimizers: torch's hooks, swa_utils, clip_grad_norm_ and state dicts work with
them, with the numbers torch.optim gets on torch autograd."""
import copy

import pytest
import torch
from test_optimizers import DATA, as_plain, assert_params_equal, initial_values, model_loss, run, torch_leaves, tracers
from torch.optim import swa_utils

import torchtrace as tt
import torchtrace.optim as tto


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_every_optimizer_is_a_torch_optimizer(name):
    assert issubclass(getattr(tto, name), torch.optim.Optimizer)
    assert isinstance(getattr(tto, name)(tracers(initial_values()), lr=0.1), torch.optim.Optimizer)


def test_step_hooks_run_around_the_update():
    params = tracers(initial_values())
    optimizer = tto.SGD(params, lr=0.1)
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(("pre", as_plain(params[3]).item())))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: seen.append(("post", as_plain(params[3]).item())))
    run(optimizer, params, 1)
    assert [when for when, _ in seen] == ["pre", "post"] and seen[0][1] != seen[1][1]


@pytest.mark.parametrize("name, options", [("Adam", dict(lr=0.01, amsgrad=True)), ("SGD", dict(lr=0.05, momentum=0.9)),
                                           ("AdamW", dict(lr=0.01)), ("RMSprop", dict(lr=0.01, centered=True))])
def test_torch_optim_continues_from_our_state_dict(name, options):
    init = initial_values()
    ours, straight = tracers(init), torch_leaves(init)
    ours_opt, straight_opt = getattr(tto, name)(ours, **options), getattr(torch.optim, name)(straight, **options)
    run(ours_opt, ours, 10)
    run(straight_opt, straight, 10)
    theirs = torch_leaves([as_plain(p) for p in ours])
    theirs_opt = getattr(torch.optim, name)(theirs, lr=123.0)
    theirs_opt.load_state_dict(ours_opt.state_dict())
    assert theirs_opt.param_groups[0]["lr"] == options["lr"]
    run(theirs_opt, theirs, 10, start=10)
    run(straight_opt, straight, 10, start=10)
    assert_params_equal(theirs, straight)


def test_loading_a_state_dict_shares_no_tensor_with_it():
    params = tracers(initial_values())
    source = torch.optim.Adam(torch_leaves(initial_values()), lr=0.01)
    run(source, source.param_groups[0]["params"], 3)
    saved = source.state_dict()
    exp_avg = saved["state"][0]["exp_avg"].clone()
    ours = tto.Adam(params, lr=0.01)
    ours.load_state_dict(saved)
    run(ours, params, 3, start=3)
    assert torch.equal(saved["state"][0]["exp_avg"], exp_avg) and float(saved["state"][0]["step"]) == 3.0


def test_clip_grad_norm_training_matches_torch():
    init = initial_values()
    runs = [(tracers(init), tto), (torch_leaves(init), torch.optim)]
    norms = []
    for params, module in runs:
        optimizer = module.SGD(params, lr=0.1, momentum=0.9)
        for i in range(30):
            optimizer.zero_grad()
            model_loss(params, *DATA[i % len(DATA)]).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)))
            optimizer.step()
    assert norms[:30] == pytest.approx(norms[30:], rel=1e-12, abs=0) and max(norms) > 0.5  # it clipped
    assert_params_equal(runs[0][0], runs[1][0])


def twin_models():
    """The same small BatchNorm net: a torch module, and a deep copy ported to tracers."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    theirs = theirs.double()
    return tt.port(copy.deepcopy(theirs)), theirs


def test_swa_averaged_model_swalr_and_update_bn_match_torch():
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(16, 3, generator=gen, dtype=torch.float64), torch.randn(16, 1, generator=gen,
                                                                                   dtype=torch.float64))
            for _ in range(4)]
    results = []
    for model, module in zip(twin_models(), (tto, torch.optim)):
        optimizer = module.SGD(model.parameters(), lr=0.1, momentum=0.9)
        averaged = swa_utils.AveragedModel(model)
        ema = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
        schedule = swa_utils.SWALR(optimizer, swa_lr=0.02, anneal_epochs=3)
        for epoch in range(6):
            for x, y in data:
                optimizer.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                optimizer.step()
            averaged.update_parameters(model)
            ema.update_parameters(model)
            schedule.step()
        swa_utils.update_bn([x for x, _ in data], averaged)
        with torch.no_grad():
            prediction = averaged(data[0][0])
        results.append([*averaged.state_dict().values(), *ema.state_dict().values(), prediction,
                        torch.tensor(optimizer.param_groups[0]["lr"])])
    for ours, theirs in zip(*results):
        torch.testing.assert_close(as_plain(ours), theirs, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_param_groups_hold_the_keys_torchs_hold(name):
    """Code that reads group['foreach'] or group['fused'] (as torch's helpers do) finds them, with torch's values."""
    ours = getattr(tto, name)([tt.tracer([1.0], requires_grad=True)], lr=0.1).param_groups[0]
    theirs = getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)], lr=0.1).param_groups[0]
    assert set(ours) == set(theirs)
    assert {k: v for k, v in ours.items() if k != "params"} == {k: v for k, v in theirs.items() if k != "params"}
