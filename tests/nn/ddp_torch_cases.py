"""Training scenarios run twice on each rank: under torch's DistributedDataParallel on a torch model, and under
torchtrace's on `tt.port` of a copy of that model. Each returns what it observed (gradients, parameters, buffers,
errors) as plain tensors; test_parallel.py requires the two runs to agree.
"""
import copy
import dataclasses
import gc
from typing import Any, Callable, Dict

import torch

import torchtrace as tt
from torchtrace.nn.parallel import DistributedDataParallel

ONE_PARAMETER_A_BUCKET = 1e-6  # MiB: every parameter gets its own bucket


def batch(seed: int, rank: int, n: int = 8, features: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(n, features, generator=gen, dtype=torch.float64)


def plain(t: Any) -> Any:
    return None if t is None else t.detach().as_subclass(torch.Tensor).clone()


def grads(model: torch.nn.Module) -> Dict[str, Any]:
    return {name: plain(p.grad) for name, p in model.named_parameters()}


def values(model: torch.nn.Module) -> Dict[str, Any]:
    return {name: plain(t) for name, t in [*model.named_parameters(), *model.named_buffers()]}


def error_of(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except RuntimeError as error:
        return str(error)
    return ""


class BodyAndHead(torch.nn.Module):
    """`head` is used only when asked."""

    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(5, 3), torch.nn.Linear(3, 3)

    def forward(self, x, use_head):
        h = torch.tanh(self.body(x))
        return self.head(h) if use_head else h


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(5, 2), torch.nn.Linear(5, 2)

    def forward(self, x):
        return self.first(x), self.second(x)


@dataclasses.dataclass
class Prediction:
    mean: torch.Tensor
    scale: torch.Tensor


class DataclassOutput(torch.nn.Module):
    """Returns a dataclass; `unused` never takes part."""

    def __init__(self):
        super().__init__()
        self.mean, self.scale, self.unused = torch.nn.Linear(5, 2), torch.nn.Linear(5, 2), torch.nn.Linear(2, 2)

    def forward(self, x):
        return Prediction(self.mean(x), torch.exp(self.scale(x)))


class NestedOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(5, 2), torch.nn.Linear(5, 2), torch.nn.Linear(5, 1)

    def forward(self, x):
        return {"pair": (self.a(x), [self.b(x)]), "single": self.c(x)}


def normalised() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def unused_head_after_zero_grad(wrap: Callable, rank: int) -> dict:
    """The head is used in step 0 only; zero_grad() runs between forward and backward (as some loops do)."""
    ddp = wrap(BodyAndHead(), find_unused_parameters=True, bucket_cap_mb=ONE_PARAMETER_A_BUCKET)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, foreach=False)
    seen = {}
    for step in range(3):
        out = ddp(batch(step, rank), use_head=step == 0)
        optimizer.zero_grad()
        (out ** 2).mean().backward()
        seen[f"grads{step}"] = grads(ddp.module)
        optimizer.step()
        seen[f"values{step}"] = values(ddp.module)
    return seen


def unused_head_without_find_unused(wrap: Callable, rank: int) -> dict:
    """find_unused_parameters=False: a backward that misses the head is reported at the next forward."""
    ddp = wrap(BodyAndHead(), bucket_cap_mb=ONE_PARAMETER_A_BUCKET)
    ddp(batch(0, rank), use_head=True).sum().backward()
    seen = {"grads": grads(ddp.module)}
    ddp.module.zero_grad()
    ddp(batch(1, rank), use_head=False).sum().backward()
    seen["error"] = error_of(lambda: ddp(batch(2, rank), use_head=False))
    return seen


def unused_on_one_rank_without_zero_grad(wrap: Callable, rank: int) -> dict:
    """No zero_grad between steps: a locally unused head contributes the .grad it holds."""
    ddp = wrap(BodyAndHead(), find_unused_parameters=True)
    seen = {}
    for step, use_head in enumerate([True, rank == 1, False]):
        ddp(batch(step, rank), use_head=use_head).sum().backward()
        seen[f"grads{step}"] = grads(ddp.module)
    return seen


def partial_outputs(wrap: Callable, rank: int) -> dict:
    """The loss uses only the first of two outputs (torch's DDPSink case)."""
    ddp = wrap(TwoHeads(), find_unused_parameters=True)
    seen = {}
    for step in range(2):
        ddp.module.zero_grad()
        ddp(batch(step, rank))[0].pow(2).sum().backward()
        seen[f"grads{step}"] = grads(ddp.module)
    return seen


def structured_outputs(wrap: Callable, rank: int) -> dict:
    seen = {}
    for find_unused in (False, True):
        model = DataclassOutput()
        if not find_unused:
            del model.unused  # without find_unused_parameters every parameter must be used
        ddp = wrap(model, find_unused_parameters=find_unused)
        for step in range(2):
            out = ddp(batch(step, rank))
            ((out.mean / out.scale) ** 2).sum().backward()
        seen[f"dataclass{find_unused}"] = grads(ddp.module)
        nested = wrap(NestedOutput(), find_unused_parameters=find_unused)
        out = nested(batch(3, rank))
        (out["pair"][0].sum() * out["pair"][1][0].sum() + out["single"].exp().sum()).backward()
        seen[f"nested{find_unused}"] = grads(nested.module)
    return seen


def batchnorm_accumulation(wrap: Callable, rank: int) -> dict:
    """Two micro-batches per step (the first under no_sync), then a forward under no_grad, then a step."""
    ddp = wrap(normalised())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, foreach=False)
    seen = {}
    for step in range(2):
        optimizer.zero_grad()
        with ddp.no_sync():
            ddp(batch(10 * step, rank) + rank).sum().backward()
        seen[f"after_no_sync{step}"] = values(ddp.module)
        (ddp(batch(10 * step + 1, rank) * (1 + rank)) ** 2).mean().backward()
        seen[f"grads{step}"] = grads(ddp.module)
        optimizer.step()
        seen[f"values{step}"] = values(ddp.module)
    with torch.no_grad():
        ddp(batch(30, rank) - rank)
    ddp(batch(31, rank)).sum().backward()
    seen["after_no_grad"] = values(ddp.module)
    seen["grads_after_no_grad"] = grads(ddp.module)
    return seen


def static_graph(wrap: Callable, rank: int) -> dict:
    """static_graph=True with a head no forward uses: as find_unused_parameters, without saying so."""
    ddp = wrap(BodyAndHead(), static_graph=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, foreach=False)
    seen = {}
    for step in range(3):
        optimizer.zero_grad()
        (ddp(batch(step, rank), use_head=False) ** 2).sum().backward()
        seen[f"grads{step}"] = grads(ddp.module)
        optimizer.step()
    seen["values"] = values(ddp.module)
    return seen


def gradient_as_bucket_view(wrap: Callable, rank: int) -> dict:
    """.grad becomes a view of the bucket, the same tensor across steps while zero_grad keeps it (torch moves its
    buckets once, after the first step, so identity is compared from step 1 on)."""
    ddp = wrap(BodyAndHead(), gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, foreach=False)
    seen, previous = {}, None
    for step in range(4):
        optimizer.zero_grad(set_to_none=step == 3)
        (ddp(batch(step, rank), use_head=True) ** 2).sum().backward()
        weight_grad = ddp.module.body.weight.grad
        seen[f"grads{step}"] = grads(ddp.module)
        seen[f"is_view{step}"] = torch.tensor(weight_grad._base is not None)
        if step >= 2:
            seen[f"kept{step}"] = torch.tensor(weight_grad is previous)
        previous = weight_grad
        optimizer.step()
    return seen


def buffers_at_construction(wrap: Callable, rank: int) -> dict:
    """Rank-local BatchNorm statistics before wrapping: given forward_sync_buffers, construction copies rank 0's
    whatever broadcast_buffers says (torch's docstring); broadcast_buffers=False alone keeps each rank's."""
    seen = {}
    for name, options in (("forward False, broadcast False", dict(forward_sync_buffers=False, broadcast_buffers=False)),
                          ("forward True, broadcast False", dict(forward_sync_buffers=True, broadcast_buffers=False)),
                          ("broadcast False", dict(broadcast_buffers=False)), ("default", {})):
        model = normalised()
        with torch.no_grad():
            model[1].running_mean.fill_(float(rank))
        ddp = wrap(model, **options)
        seen[name] = plain(ddp.module[1].running_mean).clone()
    return seen


def ignored_parameters(wrap: Callable, rank: int) -> dict:
    """torch's list of parameters and buffers to ignore (set by a private helper of its DDP, used by FSDP-style code):
    they are neither broadcast at construction nor averaged; the others are, though the ignored head is unused."""
    model = normalised()
    with torch.no_grad():
        model[1].running_mean.fill_(float(rank))
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, ["3.weight", "3.bias", "1.running_mean"])
    ddp = wrap(model)
    seen = {"at_construction": values(ddp.module)}
    (ddp(batch(0, rank))[:, 0] ** 2).sum().backward()  # the head's column 1 is left out: 3.weight[1] gets zeros
    seen["grads"] = grads(ddp.module)
    return seen


def input_gradient_then_a_step(wrap: Callable, rank: int) -> dict:
    """A gradient with respect to the input only (a saliency map: no parameter gets one), then a training step."""
    ddp = wrap(BodyAndHead(), find_unused_parameters=True)
    x = batch(0, rank).requires_grad_(True)
    grad = tt.grad if isinstance(ddp, DistributedDataParallel) else torch.autograd.grad
    (saliency,) = grad(ddp(x, use_head=True).sum(), [x])
    seen = {"saliency": plain(saliency), "untouched": grads(ddp.module)}
    (ddp(batch(1, rank), use_head=rank == 0) ** 2).sum().backward()
    seen["grads"] = grads(ddp.module)
    return seen


def the_module_alone_after_its_wrapper_is_gone(wrap: Callable, rank: int) -> dict:
    """Once the wrapper is deleted, the module's own backward keeps its gradient local, and a new wrapper averages."""
    ddp = wrap(BodyAndHead())
    (ddp(batch(0, rank), use_head=True) ** 2).sum().backward()
    module = ddp.module
    del ddp
    gc.collect()
    module.zero_grad()
    (module(batch(1, rank), use_head=True) ** 2).sum().backward()
    seen = {"local": grads(module)}
    again = (DistributedDataParallel if isinstance(next(module.parameters()), tt.tracer) else
             torch.nn.parallel.DistributedDataParallel)(module)
    module.zero_grad()
    (again(batch(2, rank), use_head=True) ** 2).sum().backward()
    seen["rewrapped"] = grads(module)
    return seen


CASES = [unused_head_after_zero_grad, unused_head_without_find_unused, unused_on_one_rank_without_zero_grad,
         partial_outputs, structured_outputs, batchnorm_accumulation, static_graph, gradient_as_bucket_view,
         buffers_at_construction, ignored_parameters, input_gradient_then_a_step,
         the_module_alone_after_its_wrapper_is_gone]


def run_both(rank: int) -> Dict[str, Dict[str, dict]]:
    """{case: {"torch": observations, "ours": observations}}; models start from the same seed on each rank pair
    (rank 1 differently from rank 0, so the initial broadcast matters)."""
    results = {}
    for case in CASES:
        runs = {}
        for name, ddp_class, convert in (("torch", torch.nn.parallel.DistributedDataParallel, lambda m: m),
                                         ("ours", DistributedDataParallel, tt.port)):
            def wrap(module, _ddp=ddp_class, _convert=convert, **options):
                torch.manual_seed(rank)
                fresh = copy.deepcopy(module).double()
                for p in fresh.parameters():  # a different start on every rank: construction broadcasts rank 0's
                    with torch.no_grad():
                        p.copy_(torch.randn(p.shape, dtype=p.dtype))
                return _ddp(_convert(fresh), **options)

            torch.manual_seed(0)
            try:
                runs[name] = case(wrap, rank)
            except Exception as error:  # noqa: BLE001 - reported by the test, which names the case
                runs[name] = {"crashed": f"{type(error).__name__}: {error}"}
        results[case.__name__] = runs
    return results
