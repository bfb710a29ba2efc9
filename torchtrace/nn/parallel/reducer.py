"""The Reducer: averages gradients across ranks in buckets, while backward is still running.

Parameters are packed into buckets in reverse order of registration (backward reaches the last layer first). A
hook on every parameter runs right after backward has accumulated its `.grad`; when every parameter of a bucket
is ready, the bucket's gradients are flattened into one buffer and `torch.distributed.all_reduce` starts on it
without waiting (gloo and nccl work in the background), so communication overlaps the rest of the backward.
Buckets start in index order on every rank (collectives must match across ranks); when the last one has
started, the reducer waits for all of them and writes back each rank's average:

    g_p <- (1 / world_size) * sum over ranks r of g_p^(r)      for every parameter p of the bucket

Each buffer carries one extra number per parameter (1 if this rank has a gradient for it), so a parameter
no rank has a gradient for keeps `.grad = None`, and one that only some ranks have averages with zeros.
"""
from typing import Any, List, Optional, Set

import torch
import torch.distributed as dist

from torchtrace.autograd.plain import plain_torch


def plan_buckets(params: List[torch.Tensor], cap_bytes: int) -> List[List[int]]:
    """Parameter indices per bucket: reverse registration order, at most `cap_bytes` a bucket (at least one
    parameter), a new bucket wherever dtype or device changes."""
    buckets: List[List[int]] = []
    size, kind = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if not buckets or size + nbytes > cap_bytes or (p.dtype, p.device) != kind:
            buckets.append([])
            size, kind = 0, (p.dtype, p.device)
        buckets[-1].append(i)
        size += nbytes
    return buckets


def reachable_leaves(outputs: List[torch.Tensor]) -> Set[int]:
    """ids of the leaves whose gradient a backward from `outputs` can reach (an iterative walk of the graph)."""
    stack = [t.grad_fn for t in outputs if getattr(t, "grad_fn", None) is not None]
    leaves = {id(t) for t in outputs if getattr(t, "grad_fn", 1) is None and t.requires_grad}
    seen = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(edge.node for edge in node.edges)
    return leaves


class Bucket:
    """Parameters reduced together; `pending` counts those whose gradient has not arrived in this iteration."""

    def __init__(self, index: int, members: List[int], names: List[str]):
        self.index, self.members, self.names = index, members, names
        self.pending = len(members)
        self.buffer: Optional[torch.Tensor] = None
        self.work: Any = None


class Reducer:
    """Per-iteration state: which gradients arrived, which buckets have started, and waiting for them."""

    def __init__(self, params: List[torch.Tensor], names: List[str], group: Any, cap_bytes: int):
        self.params, self.names, self.group = params, names, group
        self.world_size = dist.get_world_size(group)
        self.buckets = [Bucket(k, members, [names[i] for i in members])
                        for k, members in enumerate(plan_buckets(params, cap_bytes))]
        self.bucket_of = {i: bucket for bucket in self.buckets for i in bucket.members}
        self.armed = False  # a synchronised forward prepared this iteration: its backward reduces
        self.finished = False  # this iteration's reduction is done: another gradient now would stay local
        self.ready: List[bool] = [False] * len(params)
        self.next_bucket = 0
        self.hooks_fired = False

    def prepare(self, outputs: List[torch.Tensor], sync: bool) -> None:
        """Start an iteration after a forward. With `sync`, its backward reduces: parameters the outputs do not reach
        count as ready now. Without (no_sync), its gradients stay local."""
        if self.armed and self.hooks_fired:
            missing = [self.names[i] for i, ready in enumerate(self.ready) if not ready]
            raise RuntimeError(
                "DistributedDataParallel: the previous backward did not reach every parameter its forward used "
                f"({', '.join(missing)}), so their gradients were not averaged across ranks. Call backward on a loss "
                "that uses every output of the forward (once per forward), or run that forward under no_sync().")
        self._wait()
        self.finished = False
        if not sync:
            self.armed = False
            return
        reached = reachable_leaves(outputs)
        self.ready = [id(p) not in reached for p in self.params]
        for bucket in self.buckets:
            bucket.pending = sum(not self.ready[i] for i in bucket.members)
        self.next_bucket, self.hooks_fired, self.armed = 0, False, True
        self._start_ready_buckets()

    def gradient_ready(self, index: int) -> None:
        """A parameter's `.grad` is complete for this backward: count it; start every bucket that can start."""
        if self.finished:
            raise RuntimeError(
                f"DistributedDataParallel: parameter {self.names[index]} received a gradient after its forward's "
                "gradients were averaged (a second backward through the same outputs, or a separate backward into "
                "the parameters), which would stay unaveraged on this rank. Add every term to one loss and run one "
                "backward per forward, or run the forwards of the extra backward passes under no_sync().")
        if not self.armed:
            return  # a forward under no_sync(): gradients stay local
        if self.ready[index]:
            raise RuntimeError(
                f"DistributedDataParallel: parameter {self.names[index]} received a gradient twice after one forward "
                "(a second backward through the same outputs?). Run one backward per forward, or run the forwards "
                "of the extra backward passes under no_sync().")
        if type(self.params[index].grad) is not torch.Tensor:
            raise RuntimeError("DistributedDataParallel: averaging a gradient that is itself a tracer "
                               "(backward(create_graph=True)) is not supported; compute higher-order gradients "
                               "outside the DDP module or under no_sync()")
        self.hooks_fired = True
        self.ready[index] = True
        self.bucket_of[index].pending -= 1
        self._start_ready_buckets()

    def _start_ready_buckets(self) -> None:
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self._start(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets) and self.hooks_fired:
            self._wait()
            self.armed, self.finished = False, True

    def _start(self, bucket: Bucket) -> None:
        """Flatten the bucket's gradients (zeros for a parameter without one) and has-a-gradient flags; all-reduce."""
        parts = []
        with plain_torch():
            for i in bucket.members:
                p, grad = self.params[i], self.params[i].grad
                parts.append(grad.reshape(-1) if grad is not None else torch.zeros(p.numel(), dtype=p.dtype,
                                                                                   device=p.device))
            flags = torch.tensor([float(self.params[i].grad is not None) for i in bucket.members], dtype=parts[0].dtype,
                                 device=parts[0].device)
            bucket.buffer = torch.cat([*parts, flags])
        bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)

    def _wait(self) -> None:
        """Wait for every started bucket; write each average into `.grad` (in place when there is one)."""
        for bucket in self.buckets:
            if bucket.work is None:
                continue
            bucket.work.wait()
            with plain_torch():
                buffer = bucket.buffer
                counts = buffer[-len(bucket.members):]
                offset = 0
                for k, i in enumerate(bucket.members):
                    p = self.params[i]
                    average = buffer[offset:offset + p.numel()].view(p.shape) / self.world_size
                    offset += p.numel()
                    if p.grad is not None:
                        p.grad.copy_(average)
                    elif counts[k] > 0:
                        p.grad = average
            bucket.work = bucket.buffer = None

    def trace_lines(self, index: int, done: Set[int]) -> List[str]:
        """What the backprop trace prints after parameter `index` accumulates, given the ids of the leaves that have
        accumulated so far (it included): a line for each bucket whose all-reduce this starts."""
        if not self.armed:
            return []
        ready = [self.ready[i] or id(p) in done for i, p in enumerate(self.params)]
        before = [self.ready[i] or (id(p) in done and i != index) for i, p in enumerate(self.params)]
        return [self._describe(bucket) for bucket in self.buckets[self._startable(before):self._startable(ready)]]

    def _startable(self, ready: List[bool]) -> int:
        """How many buckets, in index order, can start when these parameters are ready."""
        count = 0
        while count < len(self.buckets) and all(ready[i] for i in self.buckets[count].members):
            count += 1
        return count

    def _describe(self, bucket: Bucket) -> str:
        numel = sum(self.params[i].numel() for i in bucket.members)
        return (f"all-reduce bucket {bucket.index} [{', '.join(bucket.names)}] starts: {numel} values, mean over "
                f"{self.world_size} ranks")


class GradientReady:
    """The post-accumulate-grad hook on one parameter: tells the reducer, and says what it does in the trace."""

    def __init__(self, reducer: Reducer, index: int):
        self.reducer, self.index = reducer, index

    def __call__(self, param: torch.Tensor) -> None:
        self.reducer.gradient_ready(self.index)

    def trace_lines(self, done: Set[int]) -> List[str]:
        return self.reducer.trace_lines(self.index, done)

