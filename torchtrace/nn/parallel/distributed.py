"""DistributedDataParallel: data parallelism for models whose parameters are tracers, on torch.distributed.

Every rank holds a replica of the model and a shard of the batch. At construction the parameters and buffers
of rank 0 are broadcast to every rank; during each backward the Reducer averages the gradients across ranks in
buckets (see reducer.py). With the same replicas and equal shards, every rank ends the backward with

    .grad = (1 / world_size) * sum over ranks r of d loss_r / d theta  =  the full-batch gradient of the mean loss

torch's own DistributedDataParallel cannot be used here: it refuses tensor-subclass parameters and relies on
torch autograd's hooks. This one hooks torchtrace's engine (post-accumulate-grad hooks on the parameters).
"""
import contextlib
import weakref
from typing import Any, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

from torchtrace.autograd.plain import plain_torch
from torchtrace.nn.parallel.outputs import find_tensors, through_sink
from torchtrace.nn.parallel.reducer import GradientReady, Reducer

# torch's arguments this implementation does not follow, and why (each refused only when set)
_REFUSED = {
    "delay_all_reduce_named_params": "averaging some parameters only when another one's gradient is ready",
    "param_to_hook_all_reduce": "averaging some parameters only when another one's gradient is ready",
    "mixed_precision": "communicating gradients in another dtype",
    "device_mesh": "device meshes",
    "skip_all_reduce_unused_params": "skipping the all-reduce of unused parameters",
    "bucket_cap_mb_list": "a size per bucket",
}


class DistributedDataParallel(torch.nn.Module):
    """Wrap `module` so that each backward averages its parameters' gradients across the ranks of `process_group`.

    Needs `torch.distributed.init_process_group(...)` first (e.g. "gloo" under `torchrun`; "nccl" for CUDA
    tensors). Parameters must be tracers (a `tt.nn` model, or `tt.port(torch_model)`). The arguments mean what they
    mean for torch's DistributedDataParallel:

    - `bucket_cap_mb`: buckets hold at most this many MiB of gradients each (25 by default).
    - `find_unused_parameters`: parameters the forward does not use, or that only outputs the loss leaves out
      reach, are averaged without a gradient of this rank, and keep `.grad` untouched where no rank used them.
      Without it every parameter must receive a gradient in each synchronised backward.
    - `static_graph`: the same parameters are used in every iteration; unused ones are then allowed as with
      find_unused_parameters, and an iteration that uses another set raises.
    - `gradient_as_bucket_view`: after the first averaging each `.grad` is a view of its communication bucket (no
      copy between them; `.grad.detach_()` is then refused, as in torch).
    - `forward_sync_buffers` (or the older `broadcast_buffers`): rank 0's buffers (BatchNorm statistics) are copied
      to every rank at the start of a forward that follows a synchronised forward with gradients (not after one
      under no_sync() or torch.no_grad()). `init_sync=False` skips copying parameters and buffers at construction.
    - `device_ids` / `output_device` / `dim` / `check_reduction` / `batched_grad_copy` are accepted for ported code:
      the module is not moved and the values are the same.
    """

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Optional[Any] = None, dim: int = 0, broadcast_buffers: Optional[bool] = None,
                 init_sync: bool = True, process_group: Optional[Any] = None, bucket_cap_mb: Optional[float] = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, *,
                 forward_sync_buffers: Optional[bool] = None, batched_grad_copy: bool = False, **unsupported: Any):
        super().__init__()
        _refuse(unsupported)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedDataParallel needs torch.distributed: call "
                               "torch.distributed.init_process_group('gloo') first (torchrun sets the environment)")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.forward_sync_buffers = (forward_sync_buffers if forward_sync_buffers is not None
                                     else broadcast_buffers is not False)
        self.broadcast_buffers = self.forward_sync_buffers
        self.find_unused_parameters = find_unused_parameters or static_graph
        self.static_graph, self.gradient_as_bucket_view = static_graph, gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True  # the last forward synchronised: the next one copies rank 0's buffers
        ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))  # (torch's private list of names,
        # set by DistributedDataParallel._set_params_and_buffers_to_ignore_for_model: neither broadcast nor averaged)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad and name not in ignored]
        self._buffers_synced = [b for name, b in module.named_buffers() if name not in ignored]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module has no parameter that requires "
                               "a gradient")
        refused = [name for name, p in named if not hasattr(type(p), "_tt_node")]
        if refused:
            raise TypeError(f"torchtrace's DistributedDataParallel needs tracer parameters, but {', '.join(refused)} "
                            "are plain torch tensors: wrap tt.port(model) (or use torch.nn.parallel's DDP for torch "
                            "autograd)")
        if init_sync:  # as torch: the shapes checked across ranks first; buffers too, unless broadcast_buffers=False
            from torch.distributed.utils import _verify_param_shape_across_processes  # (torch.distributed is there)
            synced = [p for name, p in module.named_parameters() if name not in ignored]
            with plain_torch():  # alone asks otherwise (forward_sync_buffers given: always, whatever it says)
                _verify_param_shape_across_processes(self.process_group, [
                    p.detach().as_subclass(torch.Tensor) for p in synced])
            self._broadcast(synced + (self._buffers_synced if forward_sync_buffers is not None
                                      or broadcast_buffers is not False else []))
        params = [p for _, p in named]
        cap = 25.0 if bucket_cap_mb is None else bucket_cap_mb
        self.reducer = Reducer(params, [name for name, _ in named], self.process_group, int(cap * 2**20),
                               self.find_unused_parameters, gradient_as_bucket_view, static_graph)
        self._handles = [p.register_post_accumulate_grad_hook(GradientReady(self.reducer, i))
                         for i, p in enumerate(params)]
        weakref.finalize(self, _remove_all, self._handles)  # once the wrapper is gone, the module trains alone again

    def _broadcast(self, tensors: List[torch.Tensor]) -> None:
        """Overwrite these tensors with rank 0's values (in place: the tracers keep their identity)."""
        with plain_torch():
            for t in tensors:
                dist.broadcast(t.detach().as_subclass(torch.Tensor), src=0, group=self.process_group)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled:
            self.reducer.check_prior_reduction()
        if self.require_forward_param_sync and self.forward_sync_buffers and self._buffers_synced:
            self._broadcast(self._buffers_synced)
        output = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = grad_enabled and self.require_backward_grad_sync
        if grad_enabled:
            self.reducer.prepare(find_tensors(output), sync=self.require_backward_grad_sync)
            if self.require_backward_grad_sync and self.find_unused_parameters:
                output = through_sink(output, self.reducer)
        return output

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Not done here: every bucket is averaged with one all_reduce (torch's default allreduce_hook)."""
        raise NotImplementedError(
            "torchtrace's DistributedDataParallel averages each bucket with all_reduce and takes no communication "
            "hook (fp16_compress_hook, PowerSGD): leave register_comm_hook out (its default, allreduce_hook, is what "
            "runs), or use torch's DistributedDataParallel on a torch model")

    def join(self, *args: Any, **kwargs: Any) -> None:
        """Not done here: ranks must see the same number of batches."""
        raise NotImplementedError(
            "torchtrace's DistributedDataParallel has no join() for uneven inputs: give every rank the same number of "
            "batches (a DistributedSampler with drop_last=True does)")

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside the block keep their gradients local (accumulated in `.grad`);
        the first synchronised backward after it averages the accumulated sum, as torch's no_sync()."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous


def _remove_all(handles: List[Any]) -> None:
    """The gradient hooks of a wrapper no one holds any more (torch's Reducer removes its own when destroyed)."""
    for handle in handles:
        handle.remove()


def _refuse(arguments: dict) -> None:
    """torch's arguments set to something this implementation does not do: say which and why."""
    for name, value in arguments.items():
        if name not in _REFUSED:
            raise TypeError(f"DistributedDataParallel got an unexpected keyword argument '{name}'")
        if value not in (None, False):
            raise NotImplementedError(f"torchtrace's DistributedDataParallel does not support {name}= "
                                      f"({_REFUSED[name]}): leave it unset")
