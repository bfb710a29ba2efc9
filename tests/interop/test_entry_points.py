"""torch's autograd entry points that cannot serve tracers refuse them by name, naming what to use; on plain tensors
they are torch's own, untouched."""
import pytest
import torch

import torchtrace as tt

CALLS = {
    "torch.autograd.gradcheck": (lambda x: torch.autograd.gradcheck(torch.sin, (x,)), "tt.gradcheck"),
    "torch.autograd.gradgradcheck": (lambda x: torch.autograd.gradgradcheck(torch.sin, (x,)), "tt.gradgradcheck"),
    "torch.autograd.graph.register_multi_grad_hook": (  # (an AssertionError from inside torch's engine before)
        lambda x: torch.autograd.graph.register_multi_grad_hook((x, x * 1), lambda grads: None), "t.register_hook"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_an_entry_point_of_torch_autograd_refuses_tracers_by_name(name):
    call, instead = CALLS[name]
    with pytest.raises(tt.UnsupportedOperationError, match=f"^{name}: torch's autograd does not see tracers") as error:
        call(tt.tracer([1.0, 2.0], requires_grad=True))
    assert instead in str(error.value)


def test_register_multi_grad_hook_on_plain_tensors_is_torchs():
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    seen = []
    torch.autograd.graph.register_multi_grad_hook((a, b), lambda grads: seen.append([g.tolist() for g in grads]))
    ((a * 2).sum() + (b * 3).sum()).backward()
    assert seen == [[[2.0, 2.0], [3.0, 3.0, 3.0]]]


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather"])
def test_a_collective_writing_a_tracer_that_requires_grad_in_place_is_refused(name):
    """torch.distributed's collectives write below torch's dispatch: unrecorded, backward took dist.all_reduce(y) for
    the identity (torch warns 'may lead to silently incorrect behavior'). A value without its graph, or a leaf
    (dist.broadcast(p, 0) of a parameter), still goes to torch (which here says no process group was initialised)."""
    import torch.distributed as dist

    y = tt.tracer(torch.rand(3), requires_grad=True) * 2
    call = {"all_reduce": lambda t: dist.all_reduce(t), "broadcast": lambda t: dist.broadcast(t, src=0),
            "all_gather": lambda t: dist.all_gather([torch.zeros(3), torch.zeros(3)], t)}[name]
    with pytest.raises(tt.UnsupportedOperationError, match=f"torch.distributed.{name} writes a result that requires"):
        call(y)
    for value in (y.detach(), tt.tracer(torch.rand(3), requires_grad=True)):  # no graph, or a leaf (a parameter)
        with pytest.raises(ValueError, match="process group has not been initialized"):
            call(value)
    with tt.no_grad(), pytest.raises(ValueError, match="process group has not been initialized"):
        call(y)


def test_torchs_distributed_data_parallel_refuses_a_ported_module_and_names_torchtraces():
    """torch's DDP builds a C++ reducer that hooks torch autograd's gradient accumulators, which tracers do not have:
    constructing it around a ported module crashed the process (a segmentation fault). A plain module still reaches
    torch's own constructor (which here says no process group was initialised)."""
    ported = tt.port(torch.nn.Linear(3, 2))
    with pytest.raises(tt.UnsupportedOperationError, match="use tt.nn.parallel.DistributedDataParallel"):
        torch.nn.parallel.DistributedDataParallel(ported)
    with pytest.raises((RuntimeError, ValueError), match="process group has not been initialized"):
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
