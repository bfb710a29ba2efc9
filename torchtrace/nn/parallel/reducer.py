"""The Reducer: averages gradients across ranks in buckets, while backward is still running (torch's DDP Reducer).

Parameters are packed into buckets in reverse order of registration (backward reaches the last layer first); each
bucket owns one flat buffer for the whole run. A hook on every parameter runs right after backward has
accumulated its `.grad`; when every parameter of a bucket is ready, its gradients are written into the buffer,
already divided by the world size, and `torch.distributed.all_reduce` (a sum) starts on it without waiting (gloo
and nccl work in the background), so communication overlaps the rest of the backward. Buckets start in index
order on every rank (collectives must match across ranks); when the last one has started, the reducer waits for
all of them and writes back each rank's average:

    g_p <- sum over ranks r of (g_p^(r) / world_size)      for every parameter p of the bucket

Parameters the backward will not reach (find_unused_parameters=True) count as ready at the start of the backward
(the first gradient hook, or the output sink of sink.py): what they contribute is their `.grad` at that moment
(zeros when None). Whether a parameter was used is counted per rank since the last averaging (backward passes
under no_sync() included) and summed across ranks: a parameter no rank used keeps its `.grad` untouched (None
after zero_grad()), one that some rank used gets the average on every rank. Without find_unused_parameters every
parameter must receive a gradient, and a backward that leaves one out is reported at the next forward.

gradient_as_bucket_view=True makes each `.grad` a view of its place in the bucket buffer after the first
averaging, so backward accumulates straight into the buffer and no copy is made either way.
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


def reachable_leaves(outputs: List[Any]) -> Set[int]:
    """ids of the leaves whose gradient a backward from `outputs` (tensors, or their grad_fn nodes) can reach
    (an iterative walk of the graph)."""
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None] + [t for t in outputs
                                                                     if not isinstance(t, torch.Tensor)]
    leaves = {id(t) for t in tensors if t.grad_fn is None and t.requires_grad}
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
    """Parameters reduced together: their flat buffer, a view of it per parameter, and how many are still due."""

    def __init__(self, index: int, members: List[int], params: List[torch.Tensor], names: List[str]):
        self.index, self.members, self.names = index, members, [names[i] for i in members]
        self.pending = len(members)
        with plain_torch():
            first = params[members[0]]
            self.buffer = torch.zeros(sum(params[i].numel() for i in members), dtype=first.dtype,
                                      device=first.device)
            sizes = [params[i].numel() for i in members]
            self.views = [flat.view(params[i].shape) for flat, i in zip(self.buffer.split(sizes), members)]
        self.work: Any = None


def _is_view_of(grad: Optional[torch.Tensor], view: torch.Tensor) -> bool:
    return grad is not None and grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


class Reducer:
    """Per-iteration state: which gradients arrived, which buckets have started, which parameters were used."""

    def __init__(self, params: List[torch.Tensor], names: List[str], group: Any, cap_bytes: int,
                 find_unused: bool, gradient_as_bucket_view: bool, static_graph: bool = False):
        self.params, self.names, self.group = params, names, group
        self.find_unused, self.as_view = find_unused, gradient_as_bucket_view
        self.static_graph = static_graph
        self.static_unused: Optional[Set[int]] = None  # static_graph: the first iteration's unused parameters
        self.world_size = dist.get_world_size(group)
        self.buckets = [Bucket(k, members, params, names)
                        for k, members in enumerate(plan_buckets(params, cap_bytes))]
        self.bucket_of = {i: bucket for bucket in self.buckets for i in bucket.members}
        self.used = [False] * len(params)  # this rank accumulated a gradient since the last averaging
        self.armed = False  # a synchronised forward prepared this iteration: its backward reduces
        self.started = False  # this iteration's backward has begun reducing (torch: require_finalize)
        self.finished = False  # this iteration's reduction is done: another gradient now would stay local
        self.ready: List[bool] = [False] * len(params)
        self.unused_at_forward: Set[int] = set()  # parameter indices the forward's outputs do not reach
        self.unused_marked = False
        self.next_bucket = 0

    def check_prior_reduction(self) -> None:
        """Before a forward with grad enabled: a synchronised backward that began must have reached every
        parameter (torch raises here too)."""
        if self.armed and self.started:
            missing = [self.names[i] for i, ready in enumerate(self.ready) if not ready]
            raise RuntimeError(
                "DistributedDataParallel: the previous backward did not reach every parameter before this forward "
                f"({', '.join(missing)} got no gradient), so no gradient of that iteration was averaged across "
                "ranks. If the forward does not use every parameter, pass find_unused_parameters=True (and let "
                "every output of forward take part in the loss); run one backward per forward, or run that forward "
                "under no_sync().")

    def prepare(self, outputs: List[torch.Tensor], sync: bool) -> None:
        """Start an iteration after a forward with grad enabled. With `sync`, its backward reduces (and with
        find_unused_parameters, the parameters `outputs` do not reach will count as ready when it begins).
        Without (no_sync), its gradients stay local."""
        self.finished = False
        for bucket in self.buckets:  # an all-reduce the last iteration started and never waited for (its backward
            if bucket.work is not None:  # reached only unused parameters' buckets): done before the buffers are reused
                bucket.work.wait()
                bucket.work = None
        if not sync:
            self.armed = False
            return
        reached = reachable_leaves(outputs) if self.find_unused else None
        self.unused_at_forward = set() if reached is None else {i for i, p in enumerate(self.params)
                                                                 if id(p) not in reached}
        self.ready = [False] * len(self.params)
        for bucket in self.buckets:
            bucket.pending = len(bucket.members)
        self.next_bucket, self.started, self.unused_marked, self.armed = 0, False, False, True

    def backward_begins(self, reached: Optional[Set[int]]) -> None:
        """The backward of the prepared forward reached its outputs: parameters it will not reach (not in the ids
        `reached`; None: those the forward's outputs do not reach) are ready now, with the `.grad` they have."""
        if not self.armed or self.unused_marked:
            return
        self.unused_marked = True  # (started: only once a parameter's gradient arrives; a backward into the inputs
        # alone, tt.grad(out, x), reaches the sink and no parameter, and the next forward is then a new iteration)
        unused = self.unused_at_forward if reached is None else {i for i, p in enumerate(self.params)
                                                                  if id(p) not in reached}
        if self.static_graph:
            self._check_static(unused)
        for i in sorted(unused):
            self._mark_ready(i)
        self._start_ready_buckets()

    def _check_static(self, unused: Set[int]) -> None:
        """static_graph=True promises the same unused parameters in every iteration: the first one sets them."""
        if self.static_unused is None:
            self.static_unused = unused
        elif unused != self.static_unused:
            changed = sorted(unused ^ self.static_unused)
            raise RuntimeError(
                "DistributedDataParallel(static_graph=True): the training graph changed in this iteration "
                f"({', '.join(self.names[i] for i in changed)} changed between used and unused); static_graph "
                "needs the same parameters used in every iteration: pass static_graph=False and "
                "find_unused_parameters=True")

    def gradient_ready(self, index: int) -> None:
        """A parameter's `.grad` is complete for this backward: count it; start every bucket that can start."""
        self.used[index] = True
        if self.finished:
            raise RuntimeError(
                f"DistributedDataParallel: parameter {self.names[index]} received a gradient after its forward's "
                "gradients were averaged (a second backward through the same outputs, or a separate backward into "
                "the parameters), which would stay unaveraged on this rank. Add every term to one loss and run one "
                "backward per forward, or run the forwards of the extra backward passes under no_sync().")
        if not self.armed:
            return  # a forward under no_sync(): gradients stay local
        if self.find_unused and not self.unused_marked:
            self.backward_begins(None)
        if self.ready[index]:
            raise RuntimeError(
                f"DistributedDataParallel: parameter {self.names[index]} received a gradient twice after one forward "
                "(a second backward through the same outputs, a parameter used outside forward, or one reached only "
                "through a tensor that forward did not return, while find_unused_parameters=True counted it as "
                "unused). Run one backward per forward, or run the forwards of the extra backward passes under "
                "no_sync().")
        if type(self.params[index].grad) is not torch.Tensor:
            raise RuntimeError("DistributedDataParallel: averaging a gradient that is itself a tracer "
                               "(backward(create_graph=True)) is not supported; compute higher-order gradients "
                               "outside the DDP module or under no_sync()")
        self.started = True
        self._mark_ready(index)
        self._start_ready_buckets()

    def _mark_ready(self, index: int) -> None:
        self.ready[index] = True
        self.bucket_of[index].pending -= 1

    def _start_ready_buckets(self) -> None:
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self._start(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets):
            self._finish()

    def _start(self, bucket: Bucket) -> None:
        """Write each gradient / world_size into its place in the buffer (zeros for a parameter without one);
        all-reduce the buffer (a sum)."""
        with plain_torch():
            for i, view in zip(bucket.members, bucket.views):
                p = self.params[i]
                grad = p.grad
                if grad is None:
                    view.zero_()
                elif _is_view_of(grad, view):
                    view.div_(self.world_size)
                else:
                    torch.mul(grad, 1.0 / self.world_size, out=view)
                    if self.as_view:
                        p.grad = view
        bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)

    def _finish(self) -> None:
        """Wait for every bucket; write each average into `.grad` of the parameters some rank used."""
        used = self._used_anywhere()
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.work = None
            with plain_torch():
                for i, view in zip(bucket.members, bucket.views):
                    if not used[i]:
                        continue  # no rank has a gradient for it: .grad stays as it is
                    p = self.params[i]
                    if self.as_view:
                        if not _is_view_of(p.grad, view):
                            p.grad = view
                    elif p.grad is None:
                        p.grad = view.clone()
                    else:
                        p.grad.copy_(view)
        self.used = [False] * len(self.params)
        self.armed, self.finished = False, True

    def _used_anywhere(self) -> List[bool]:
        """Per parameter: did some rank accumulate a gradient into it since the last averaging? (Without
        find_unused_parameters every parameter received one.)"""
        if not self.find_unused:
            return [True] * len(self.params)
        with plain_torch():
            counts = torch.tensor(self.used, dtype=torch.int32)
            dist.all_reduce(counts, group=self.group)
            return [bool(c) for c in counts.tolist()]

    def trace_lines(self, index: int, done: Set[int]) -> List[str]:
        """What the backprop trace prints after parameter `index` accumulates, given the ids of the leaves that have
        accumulated so far (it included): a line for each bucket whose all-reduce this starts."""
        if not self.armed:
            return []
        unused = self.unused_at_forward if self.find_unused else set()
        ready = [self.ready[i] or i in unused or id(p) in done for i, p in enumerate(self.params)]
        before = [self.ready[i] or i in unused or (id(p) in done and i != index) for i, p in enumerate(self.params)]
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
