"""In-place ops and views, as torch: x.op_(...) rebinds x to a new node, and a view follows its base.

An in-place op is recorded out of place on a copy of x's old value, then written into x, whose node becomes
the new one (`record_inplace`). A view remembers its base tracer (`remember_base`); when the base changed in
place since, the view's value is ViewOfBase(base) (`catch_up`); an in-place op on a view writes into its base
(WriteIntoView). The recording itself is dispatch.run_rule, passed in as `record`.
"""
from typing import Any, Callable, Optional

import torch

from torchtrace.autograd.arguments import wants_gradient
from torchtrace.autograd.function import INPLACE_FLAG
from torchtrace.autograd.node import Node, link_output
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.views import ViewOfBase, WriteIntoView, base_root, geometry
from torchtrace.naming import callable_name

_grad_enabled = torch.is_grad_enabled
Record = Callable[..., Any]  # dispatch.run_rule(tracer_type, rule, func, args, kwargs): records one call


def remember_base(view: torch.Tensor, args: tuple) -> None:
    """A view result remembers the tracer argument whose memory it shares: its base (`_tt_base`). A view of the op's
    own internal result (einsum's permuted bmm output), whose memory no argument shares, is no view to the user: it
    owns that memory, so in-place changes of it (and of its slices) are recorded as of any result."""
    with plain_torch():
        root = base_root(view)
        bases = [a._tt_base if a._tt_view else a for a in args
                 if isinstance(a, torch.Tensor) and hasattr(a, "_tt_view") and base_root(a) is root]
        view._tt_view = bool(bases) or any(  # False: a view of its own result (no argument shares its memory)
            base_root(t) is root for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))
            if isinstance(t, torch.Tensor))
    view._tt_base = bases[0] if bases else None


# a piece (Tensor._tt_piece) made while nothing it came from required a gradient: torch's words for it
UNRECORDED_PIECE = "A view was created in no_grad mode"
_SEVERAL_VIEWS = ("This view is the output of a function that returns multiple views. Such functions do not allow the "
                  "output views to be modified inplace. You should replace the inplace operation by an out-of-place "
                  "one.")


def mark_piece(view: torch.Tensor, rule: type, nr: int, args: tuple) -> None:
    """torch's CreationMeta.MULTI_OUTPUT_NODE: output nr of a rule returning several views of one input (split, chunk,
    unbind), or a view of such a piece, is a piece: one backward serves all the pieces, which a write into one would
    bypass, so it may not be changed in place, nor used with grad mode on after its base changed in place (checked in
    record_inplace and catch_up). Called for each recorded view; pieces that record nothing are marked by run_rule
    (UNRECORDED_PIECE: torch refuses their in-place change only where that change records a gradient)."""
    if not (rule.several_views or any(getattr(a, "_tt_piece", "") for a in args)):
        return  # (the common case, decided first: this runs for every recorded view)
    with plain_torch():
        if rule.several_views or any(getattr(a, "_tt_piece", "") and a._tt_view and base_root(a) is base_root(view)
                                     for a in args if isinstance(a, torch.Tensor)):
            view._tt_piece = f"Output {nr} of {rule.__name__}"


def catch_up(view: torch.Tensor, tracer_type: type, record: Record, always: bool = False) -> None:
    """If the base of `view` changed in place after the view was taken, the view is now ViewOfBase(base)
    (`always`: before an op writes into the view, which then reads its value from the base, as torch). A piece that
    requires grad (mark_piece) has no such new value: torch's error."""
    with plain_torch():
        version, base = view._version, view._tt_base
        if (version == view._tt_version and not always) or not _grad_enabled():
            return
        if view._tt_piece not in ("", UNRECORDED_PIECE) and view._tt_requires_grad:
            raise RuntimeError(f"{view._tt_piece} is a view and its base or another view of its base has been "
                               f"modified inplace. {_SEVERAL_VIEWS}")
        if view._tt_node is None and view._tt_requires_grad and base is not None and not base._tt_requires_grad:
            view._tt_version = version  # a leaf view of a tensor without gradient (requires_grad_() on it) stays a
            return  # leaf, its values read from the memory it shares, as torch's
        if base is None or base.dtype != view.dtype:
            if view._tt_requires_grad:
                raise RuntimeError("A view was changed in place through its base (or another view), and torchtrace "
                                   "does not know that base tracer, so the view's gradient would be wrong. Take the "
                                   "view after the in-place op, or use out-of-place ops.")
            view._tt_version = version
            return
        old_node, old_nr = view._tt_node, view._tt_nr
        fresh = record(tracer_type, ViewOfBase, None, (base, geometry(view, base)), {})
        view._tt_node, view._tt_nr, view._tt_requires_grad = fresh._tt_node, 0, fresh._tt_requires_grad
        view._tt_version = version
    if view._tt_node is not None:
        _move_retained(old_node, old_nr, view)


def refuse_no_grad_view(target: Any) -> None:
    """A view taken while grad mode was off (no_grad, inference_mode) of a tensor that requires grad may not be
    changed in place with grad mode on, as torch refuses it: which value should the base's graph record?"""
    base = getattr(target, "_tt_base", None)
    if getattr(target, "_tt_no_grad_view", False) and _grad_enabled() and base is not None and base._tt_requires_grad:
        raise RuntimeError("A view was created in no_grad mode and is being modified inplace with grad mode enabled. "
                           "Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
                           "your code by moving both the view and the inplace either both inside the no_grad block "
                           "(if you don't want the inplace to be tracked) or both outside (if you want the inplace "
                           "to be tracked).")


def inplace_requested(position: int, args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("inplace") if "inplace" in kwargs else len(args) > position and args[position])


def record_inplace_flag(tracer_type: type, rule: type, func: Callable, args: tuple, kwargs: dict,
                        record: Record) -> Any:
    """F.relu(x, inplace=True): x changes, so record it like x.relu_() (out of place, then written into x)."""
    identity = getattr(rule, "is_identity", None)
    if identity is not None and identity(*args, **kwargs):  # eval-mode dropout: torch hands x back untouched
        return args[0]
    refuse_no_grad_view(args[0])
    if not (_grad_enabled() and (wants_gradient(args) or wants_gradient(kwargs))):
        with plain_torch():
            func(*args, **kwargs)
        return args[0]
    position = INPLACE_FLAG[func]
    rule = getattr(rule, "inplace_rule", rule)  # a rule whose in-place form differs (it reads the result)
    if "inplace" in kwargs:
        kwargs = {**kwargs, "inplace": False}
    else:
        args = (*args[:position], False, *args[position + 1:])
    target = args[0]
    return record_inplace(tracer_type, target, f"{callable_name(func)}(inplace=True)",
                          lambda before: record(tracer_type, rule, func, (before, *args[1:]), kwargs),
                          lambda result: torch.Tensor.copy_(target, result), record)


# in-place ops that change only a tensor's shape or strides (its metadata): on a view they write nothing into the base
RESHAPING = frozenset({"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_", "squeeze_", "as_strided_"})


def record_inplace(tracer_type: type, target: Any, name: str, compute: Callable, mutate: Callable,
                   record: Record, reshapes: bool = False) -> torch.Tensor:
    """x.op_(...) = rebind x to op(x_before, ...): the graph gains a node, then `mutate` changes x's data (or, where
    it `reshapes` x, only its shape or strides: a view then stays a view of its base, whose data is untouched)."""
    if not isinstance(target, tracer_type):
        target = _plain_destination(target, tracer_type, name)
    if target._tt_custom_view:
        raise RuntimeError(f"{target._tt_custom_view} is a view and is being modified inplace. This view was created "
                           "inside a custom Function (or because an input was returned as-is) and the autograd logic "
                           "to handle view+inplace would override the custom backward associated with the custom "
                           "Function, leading to incorrect gradients. This behavior is forbidden. You can fix this by "
                           "cloning the output of the custom Function.")
    if target._tt_piece:  # a piece (mark_piece), in torch's words
        lead = target._tt_piece if target._tt_piece == UNRECORDED_PIECE else f"{target._tt_piece} is a view"
        grad_mode = " with grad mode enabled" if target._tt_piece == UNRECORDED_PIECE else ""
        raise RuntimeError(f"{lead} and is being modified inplace{grad_mode}. {_SEVERAL_VIEWS}")
    if target._tt_requires_grad and target._tt_node is None:
        raise RuntimeError(f"{name}: a leaf tracer that requires grad is used in an in-place operation. Do it "
                           "under tt.no_grad() (as optimizers do), or use the out-of-place form.")
    if target._tt_view and not reshapes and not name.endswith(_ORDER_FREE) and overlapping(target):
        raise _shared_elements(name, target)
    # a view up to date with its base is read by the op's other arguments through its own node (its hooks), as torch
    if reshapes and target._tt_view:
        catch_up(target, tracer_type, record)  # (a view whose base changed since: its value from the base first)
    as_read = (target._tt_node, target._tt_nr) if target._tt_view and target._version == target._tt_version else None
    base = _written_base(target, name, tracer_type, record) if target._tt_view and not reshapes else None
    old_node, old_nr = target._tt_node, target._tt_nr
    with plain_torch():
        before = target.clone()
        before = link_output(before, old_node, old_nr, tracer_type) if old_node else before.as_subclass(tracer_type)
    if as_read:  # (v.add_(v): only the written v goes through the base, torch's CopySlices)
        target._tt_node, target._tt_nr = as_read
    result = compute(before)
    target._tt_node, target._tt_nr = old_node, old_nr
    if base is not None:  # the base's new value: its old one with the view's elements replaced by the result
        with plain_torch():
            where = geometry(target, base)
        base_after = record(tracer_type, WriteIntoView, None, (base, result, where), {})
    with plain_torch():
        mutate(result)
        changed, after = (base, base_after) if base is not None else (target, result)
        previous = changed._tt_node, changed._tt_nr
        if after._tt_node is not None:
            changed._tt_node, changed._tt_nr, changed._tt_requires_grad = after._tt_node, after._tt_nr, True
        changed._tt_version = changed._version
        _saved_as_written(result, target, base)
    _move_retained(*previous, changed)
    if base is not None and old_node is not None and old_nr in (old_node.retained or {}):
        catch_up(target, tracer_type, record)  # a retained view: .grad is now that of its new value, a view of the base
    return target


def _saved_as_written(result: torch.Tensor, target: torch.Tensor, base: Optional[torch.Tensor]) -> None:
    """A rule that saved its result (tanh_, exp_, sigmoid_: their backward reads it) keeps the tensor the op wrote
    instead (a plain alias, its version counter shared, under plain_torch), as torch's saves the result itself: a
    later in-place change of it is refused at backward, a write through .data is read there. (Not for a view: its
    base is what was written.)"""
    node = result._tt_node
    if base is None and node is not None and node.saved_outputs and node.ctx._packed is None:
        ctx, kept = node.ctx, [i for i, nr in node.saved_outputs if nr == result._tt_nr]
        ctx._saved = tuple(torch.Tensor.detach(target) if i in kept else s for i, s in enumerate(ctx._saved))
        ctx._versions = [target._version if i in kept else v for i, v in enumerate(ctx._versions)]


def overlapping(t: torch.Tensor) -> bool:
    """Do two elements of t share one memory location (an expand, unfold or as_strided view)? torch answers 0 (no),
    1 (yes) or 2 (too hard to say); then: dims sorted by stride, each stride past the reach of the smaller ones means
    no; else the positions themselves are counted."""
    with plain_torch():
        answer = torch._debug_has_internal_overlap(t)
        if answer != 2:
            return answer == 1
        reach = 0
        for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
            if stride <= reach:
                positions = torch.arange(1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
                return positions.as_strided(t.shape, t.stride()).unique().numel() < t.numel()
            reach += (size - 1) * stride
        return False


# in-place ops that write one number into every element: on a view whose elements share memory, order does not matter
_ORDER_FREE = ("fill_", "zero_")


def _shared_elements(name: str, view: torch.Tensor) -> RuntimeError:
    with plain_torch():
        shape, strides = tuple(view.shape), view.stride()
    return RuntimeError(f"{name} writes into a view of shape {shape} and strides {strides} whose elements share memory "
                        "(an expand, unfold or as_strided view): torch writes such elements one after another, so the "
                        "result depends on that order, and torchtrace cannot follow its gradient. Write into a copy "
                        "(v = v.clone()), or use the out-of-place form (x.unfold(0, 2, 1).relu()).")


def write_into_part(target: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """target[index] = value where target's elements share memory (e = b.expand(3); e[0] = v): written into the part
    target[index] alone, as torch writes it, when that part is a view whose elements do not share memory."""
    part = target[index]  # through the tracer's dispatch: recorded, a view of the same base for basic indexing
    if not part._tt_view or isinstance(value, torch.Tensor) and overlapping(part):
        raise _shared_elements("torch.Tensor.__setitem__", target)
    if isinstance(value, torch.Tensor):
        part.copy_(value)
    else:  # one number into every element: the same whatever the order
        part.fill_(value)
    return target


def _plain_destination(target: Any, tracer_type: type, name: str) -> torch.Tensor:
    """A plain tensor written with a value that needs a gradient (out = torch.zeros(n); out[i] = h) joins the graph,
    as in torch: it becomes a tracer itself (its class changes: the caller's object is the tracer). Only while no
    other tensor shares its memory: a view of it, or the tensor it is a view of, would read the new values without
    their gradient."""
    with plain_torch():  # (the storage's users: the tensor, and the storage object this read makes)
        why = ("is a subclass of torch.Tensor, whose class torchtrace cannot change" if type(target) is not torch.Tensor
               else "requires grad in torch autograd (a leaf of torch's graph)" if target.requires_grad
               else "was made under torch.inference_mode (it has no version counter)" if target.is_inference()
               else "shares its memory with another tensor (a view of it, or the tensor it is a view of), which would "
               "read the new values without their gradient: make it a tracer before taking views of it"
               if target._is_view() or torch._C._storage_Use_Count(target.untyped_storage()._cdata) > 2 else "")
    if why:
        raise RuntimeError(f"{name} would write a tracer that requires grad into a plain tensor that {why}. Make the "
                           "destination a tracer (tt.zeros(...)), or build the result out of place (torch.stack / "
                           "torch.cat).")
    target.__class__, target._tt_version = tracer_type, target._version
    return target


def _written_base(view: torch.Tensor, name: str, tracer_type: type, record: Record) -> torch.Tensor:
    """The base tracer an in-place op on `view` writes into (the view itself follows it at its next use)."""
    base = view._tt_base
    if base is None:
        raise RuntimeError(f"{name} changes a view in place, but torchtrace does not know the tensor it is a view "
                           "of, so that tensor's gradient would be wrong. Write y[i] = y[i] + v instead of y[i] += v, "
                           "or use the out-of-place form.")
    if base._tt_requires_grad and base._tt_node is None:
        raise RuntimeError(f"{name}: a view of a leaf tracer that requires grad is used in an in-place operation. "
                           "Do it under tt.no_grad() (as optimizers do), or use the out-of-place form.")
    catch_up(view, tracer_type, record, always=True)
    return base


def _move_retained(old_node: Optional[Node], nr: int, target: torch.Tensor) -> None:
    """retain_grad() followed by an in-place op: .grad is then the gradient of the new value (as torch)."""
    ref = (old_node.retained or {}).get(nr) if old_node is not None else None
    if ref is not None and ref() is target:
        del old_node.retained[nr]
        new_node = target._tt_node
        new_node.retained = {**(new_node.retained or {}), target._tt_nr: ref}
