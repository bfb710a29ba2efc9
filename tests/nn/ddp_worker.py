"""One rank of the DistributedDataParallel test: `python ddp_worker.py RANK WORLD PORT OUT_DIR` (gloo, 127.0.0.1).

Each scenario writes what it observed into OUT_DIR/rank{RANK}.pt; test_parallel.py compares it with torch
autograd on the full batch in a single process.
"""
import contextlib
import io
import sys

import torch
import torch.distributed as dist
from ddp_torch_cases import TwoHeads, run_both

import torchtrace as tt
from torchtrace.nn.parallel import DistributedDataParallel

BUCKET_CAP_MB = 300 / 2**20  # 300 bytes: the float64 MLP's parameters fall into several buckets


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return tt.nn.Sequential(tt.nn.Linear(5, 8), tt.nn.Tanh(), tt.nn.Linear(8, 6), tt.nn.Tanh(),
                            tt.nn.Linear(6, 3)).double()


class WithBranch(tt.nn.Module):
    """`extra` is used only when asked (on rank 1 only); `unused` never."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.body, self.extra, self.unused = tt.nn.Linear(5, 3), tt.nn.Linear(5, 3), tt.nn.Linear(2, 2)

    def forward(self, x, use_extra):
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def data(seed: int, n: int = 16):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=gen, dtype=torch.float64), torch.randn(n, 3, generator=gen, dtype=torch.float64)


def shard(tensors, rank: int, world: int):
    return [t.chunk(world)[rank] for t in tensors]


def grads(model: torch.nn.Module) -> dict:
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


def plain_params(model: torch.nn.Module) -> dict:
    return {name: p.detach().as_subclass(torch.Tensor).clone() for name, p in model.named_parameters()}


def error_of(fn) -> str:
    try:
        fn()
    except (RuntimeError, TypeError, NotImplementedError) as error:
        return str(error)
    return ""


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mse = tt.nn.MSELoss()
    result = {}

    model = make_model(seed=100 + rank)  # a different initialisation on every rank
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    result["initial"] = plain_params(model)  # rank 0's, everywhere
    result["buckets"] = [bucket.names for bucket in ddp.reducer.buckets]

    x, y = shard(data(1), rank, world)
    loss = mse(ddp(tt.tracer(x)), y)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        loss.backward(show=True)
    result["trace"], result["grads"] = printed.getvalue(), grads(model)

    model.zero_grad()  # gradient accumulation: micro-batch 2 without sync, micro-batch 3 with it
    x2, y2 = shard(data(2), rank, world)
    x3, y3 = shard(data(3), rank, world)
    with ddp.no_sync():
        mse(ddp(tt.tracer(x2)), y2).backward()
    result["local_grads"] = grads(model)
    mse(ddp(tt.tracer(x3)), y3).backward()
    result["accumulated_grads"] = grads(model)

    optimizer = tt.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        xs, ys = shard(data(10 + step), rank, world)
        optimizer.zero_grad()
        mse(ddp(tt.tracer(xs)), ys).backward()
        optimizer.step()
    result["trained"] = plain_params(model)

    branch = DistributedDataParallel(WithBranch().double(), find_unused_parameters=True)
    result["branch_initial"] = plain_params(branch.module)
    xb, yb = shard(data(4), rank, world)
    mse(branch(tt.tracer(xb), use_extra=rank == 1), yb).backward()
    result["branch_grads"] = grads(branch.module)
    branch.module.zero_grad()  # rank 1 accumulates into `extra` without sync; then no rank uses it
    with branch.no_sync():
        mse(branch(tt.tracer(xb), use_extra=rank == 1), yb).backward()
    mse(branch(tt.tracer(xb), use_extra=False), yb).backward()
    result["branch_accumulated_grads"] = grads(branch.module)

    norm = DistributedDataParallel(tt.nn.BatchNorm1d(5).double())
    norm(tt.tracer(x + rank))  # a synchronised forward: each rank's running statistics move toward its own data
    result["norm_before"] = [b.clone() for b in norm.module.buffers()]
    norm.eval()
    with tt.no_grad():
        norm(tt.tracer(x))  # broadcasts rank 0's statistics first; in eval mode they do not move
    result["norm_after"] = [b.clone() for b in norm.module.buffers()]

    out = ddp(tt.tracer(x))
    mse(out, y).backward(retain_graph=True)
    result["second_backward"] = error_of(lambda: mse(out, y).backward())
    heads = DistributedDataParallel(tt.port(TwoHeads()))
    heads(tt.tracer(x.float()))[0].sum().backward()  # the second head's parameters get no gradient
    result["after_partial_backward"] = error_of(lambda: heads(tt.tracer(x.float())))
    result["plain_parameters"] = error_of(lambda: DistributedDataParallel(torch.nn.Linear(2, 2)))
    result["refused_option"] = error_of(lambda: DistributedDataParallel(model, mixed_precision=object()))
    changing = DistributedDataParallel(WithBranch().double(), static_graph=True)
    mse(changing(tt.tracer(xb), use_extra=False), yb).backward()
    result["static_graph_changed"] = error_of(lambda: mse(changing(tt.tracer(xb), use_extra=True), yb).backward())
    result["torch_cases"] = run_both(rank)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
