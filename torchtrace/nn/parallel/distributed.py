"""DistributedDataParallel: data parallelism for models whose parameters are tracers, on torch.distributed.

Every rank holds a replica of the model and a shard of the batch. At construction the parameters and buffers
of rank 0 are broadcast to every rank; during each backward the Reducer averages the gradients across ranks in
buckets (see reducer.py). With the same replicas and equal shards, every rank ends the backward with

    .grad = (1 / world_size) * sum over ranks r of d loss_r / d theta  =  the full-batch gradient of the mean loss

torch's own DistributedDataParallel cannot be used here: it refuses tensor-subclass parameters and relies on
torch autograd's hooks. This one hooks torchtrace's engine (post-accumulate-grad hooks on the parameters).
"""
import contextlib
from typing import Any, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

from torchtrace.autograd.plain import plain_torch
from torchtrace.nn.parallel.reducer import GradientReady, Reducer


def _tensors(value: Any) -> List[torch.Tensor]:
    """The tensors inside a forward's output (a tensor, or nested tuples / lists / dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


class DistributedDataParallel(torch.nn.Module):
    """Wrap `module` so that each backward averages its parameters' gradients across the ranks of `process_group`.

    Needs `torch.distributed.init_process_group(...)` first (e.g. "gloo" under `torchrun`; "nccl" for CUDA
    tensors). Parameters must be tracers (a `tt.nn` model, or `tt.port(torch_model)`). Buckets hold at most
    `bucket_cap_mb` MiB of gradients each. `broadcast_buffers=True` copies rank 0's buffers (BatchNorm statistics)
    to every rank at each forward, as torch does. Parameters a forward's outputs do not reach count as ready at
    once (torch's find_unused_parameters=True behaviour, always on; the argument is accepted for ported code).
    `device_ids` / `output_device` are accepted for ported code: the module is not moved.
    """

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Optional[Any] = None, dim: int = 0, broadcast_buffers: bool = True,
                 process_group: Optional[Any] = None, bucket_cap_mb: float = 25.0,
                 find_unused_parameters: bool = False):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedDataParallel needs torch.distributed: call "
                               "torch.distributed.init_process_group('gloo') first (torchrun sets the environment)")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        refused = [name for name, p in named if not hasattr(type(p), "_tt_node")]
        if refused:
            raise TypeError(f"torchtrace's DistributedDataParallel needs tracer parameters, but {', '.join(refused)} "
                            "are plain torch tensors: wrap tt.port(model) (or use torch.nn.parallel's DDP for torch "
                            "autograd)")
        self._broadcast([p for p in module.parameters()] + list(module.buffers()))
        params = [p for _, p in named]
        self.reducer = Reducer(params, [name for name, _ in named], self.process_group, int(bucket_cap_mb * 2**20))
        self._handles = [p.register_post_accumulate_grad_hook(GradientReady(self.reducer, i))
                         for i, p in enumerate(params)]

    def _broadcast(self, tensors: List[torch.Tensor]) -> None:
        """Overwrite these tensors with rank 0's values (in place: the tracers keep their identity)."""
        with plain_torch():
            for t in tensors:
                dist.broadcast(t.detach().as_subclass(torch.Tensor), src=0, group=self.process_group)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and dist.get_world_size(self.process_group) > 1:
            self._broadcast(list(self.module.buffers()))
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled():
            self.reducer.prepare(_tensors(output), sync=self.require_backward_grad_sync)
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside the block keep their gradients local (accumulated in `.grad`);
        the first synchronised backward after it averages the accumulated sum, as torch's no_sync()."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous
