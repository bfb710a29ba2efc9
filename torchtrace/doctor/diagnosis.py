"""tt.diagnose: run (or take) a forward, run its backward while watching, and say what is wrong and where.

    d = tt.diagnose(fn, *args)   # fn(*args) runs watched: source lines, cuts of the graph, modules that ran
    d = tt.diagnose(loss)        # a graph already built: its backward and the paths to the leaves
    print(d)                     # the first non-finite value first, each finding with what to change

Like `loss.backward()`, it fills `.grad`. Watching costs only while it runs: the observers, the torch
function mode and the module hook are registered for the duration of the call and removed after.
"""
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, leaf_accumulator
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.doctor.depth import depth_findings
from torchtrace.doctor.findings import Diagnosis, Finding
from torchtrace.doctor.nonfinite import forward_cause
from torchtrace.doctor.paths import UNWATCHED, CutWatcher, ModulesRan, no_path_reasons
from torchtrace.doctor.recording import record_pass
from torchtrace.doctor.unrecorded import UnrecordedOrigin
from torchtrace.doctor.unversioned import UnversionedWrites
from torchtrace.doctor.values import all_finite
from torchtrace.doctor.watch import Watch
from torchtrace.inspect.construction import by_construction, looks_zero
from torchtrace.inspect.scope import module_names, module_scope, path_name
from torchtrace.inspect.zeros_by_structure import BIAS_ADVICE, by_structure
from torchtrace.nested import flatten
from torchtrace.precision.underflow import UnderflowWatch


def _names(models: List[torch.nn.Module]) -> Dict[int, str]:
    names: Dict[int, str] = {}
    for model in models:
        names.update(module_names(model))
    return names


def _root_node(loss: Any) -> Any:
    if not getattr(loss, "_tt_requires_grad", False) or loss.numel() != 1:
        raise RuntimeError("tt.diagnose needs a scalar tracer that requires grad (the loss), or a function that "
                           "returns one: make a leaf it depends on require grad (tt.tracer(..., requires_grad=True) or "
                           "tt.port(model))")
    return loss._tt_node if loss._tt_node is not None else leaf_accumulator(loss)


def _scalar(output: Any) -> Any:
    leaves, _ = flatten(output)
    found = [t for t in leaves if isinstance(t, torch.Tensor) and t.numel() == 1]
    if not found:
        raise RuntimeError("tt.diagnose(fn, *args): fn must return the scalar loss (or a tuple starting with it)")
    return found[0]


def diagnose(fn_or_loss: Any, *args: Any, model: Optional[torch.nn.Module] = None, **kwargs: Any) -> Diagnosis:
    """Run fn(*args, **kwargs) and the backward of its scalar result (or the backward of a loss already built),
    watching both; return the findings. `model` names modules and parameters (found from the forward otherwise)."""
    if isinstance(fn_or_loss, torch.Tensor):
        return _diagnose_graph(fn_or_loss, model)
    cuts, ran = CutWatcher(), ModulesRan()
    handle = register_module_forward_pre_hook(ran)
    watch = Watch({})
    try:
        with module_scope(), observing(on_record=watch.on_record), cuts:
            output = fn_or_loss(*args, **kwargs)
    finally:
        handle.remove()
    models = [model] if model is not None else ran.roots()
    watch.names = _names(models)
    loss = _scalar(output)
    arg_leaves = [t for t in flatten(list(args))[0] if getattr(t, "_tt_requires_grad", False) and t._tt_node is None]
    diagnosis = _run_backward(loss, watch, models, arg_leaves, cuts.cut_leaves, ran.ran, forward=True,
                              unrecorded=cuts.unrecorded.origin, unversioned=cuts.unversioned)
    return Diagnosis(diagnosis.findings, diagnosis.checked, list(watch.lines),
                     lambda: record_pass(fn_or_loss, args, kwargs, explore=True, tool="tt.diagnose"))


def _diagnose_graph(loss: torch.Tensor, model: Optional[torch.nn.Module]) -> Diagnosis:
    order = topological_order([_root_node(loss)])
    models = [model] if model is not None else ([next(n.module_path[0] for n in order if n.module_path)]
                                                if any(n.module_path for n in order) else [])
    watch = Watch(_names(models))
    if not all_finite(loss):  # (where the loss is finite, no forward origin is looked for: nothing to read)
        kept_values_read(order, watch)
    return _run_backward(loss, watch, models, [], {}, None, forward=False)


def kept_values_read(order: List[Any], watch: Watch) -> None:
    """The forward's non-finite origins read after the fact from the values the graph kept (each node's result, its
    inputs' results, the leaves): the first op that made a NaN or Inf out of finite inputs, where the forward was not
    watched. Only the tensor inputs are known then, so the cause is worded from them alone."""
    def value(node: Any, nr: int) -> Any:
        if isinstance(node, AccumulateGrad):
            return node.variable
        refs = node.value_refs or ()
        return refs[nr]() if nr < len(refs) and refs[nr] is not None else None

    def cause(rule: type, args: tuple, kwargs: dict, result: Any) -> Tuple[str, str]:
        try:
            return forward_cause(rule, args, kwargs, result)
        except Exception:  # (a cause that reads an argument the graph did not keep: a number, an option)
            return (f"{rule.__name__} made the first non-finite value from finite inputs (read from the values the "
                    "graph kept)", "tt.diagnose(fn, *args) watches the forward and says why")

    for node in sorted((n for n in order if not isinstance(n, AccumulateGrad)), key=lambda n: n.sequence_nr):
        result = value(node, 0)
        if result is None:
            continue
        args = tuple(v for v in (value(e.node, e.output_nr) for e in node.edges) if v is not None)
        watch.recorded += 1
        watch.note_values(node, args, {}, result, cause)


def diagnose_watched(loss: Any, watch: Watch, cuts: CutWatcher, ran: ModulesRan) -> Diagnosis:
    """The backward of `loss`, whose forward ran under `watch`, `cuts` and `ran` (a script run by the CLI)."""
    models = ran.roots()
    watch.names = _names(models)
    return _run_backward(loss, watch, models, [], cuts.cut_leaves, ran.ran, forward=True,
                         unrecorded=cuts.unrecorded.origin, unversioned=cuts.unversioned)


def _run_backward(loss: Any, watch: Watch, models: List[torch.nn.Module], arg_leaves: List[torch.Tensor],
                  cuts: Dict[int, Any], ran: Optional[Dict[int, torch.nn.Module]], forward: bool,
                  unrecorded: Optional[UnrecordedOrigin] = None,
                  unversioned: Optional[UnversionedWrites] = None) -> Diagnosis:
    order = topological_order([_root_node(loss)])
    loss_finite = all_finite(loss)
    underflows = UnderflowWatch()
    written = unversioned.findings(watch.lines, watch.finding) if unversioned else []  # (before the backward)
    with observing(on_backward=watch.on_backward), observing(on_backward=underflows):
        loss.backward()
    findings: List[Finding] = written + underflows.findings(watch)
    params = _parameters(models, arg_leaves)
    grads_finite = all(all_finite(g) for g in watch.leaf_grads.values())
    if not loss_finite or not grads_finite:  # (a NaN of a backward that a later rule's mask absorbed is no finding)
        made = watch.forward_findings(_root_node(loss))
        if watch.inf_from_outside:  # the Inf that NaN was made of entered first: where from
            made = _from_outside(forward, params, unrecorded, watch.names) + made
        findings += made
        if watch.backward_first is not None and loss_finite:
            findings.append(watch.backward_first)
        if not findings:
            findings += _from_outside(forward, params, unrecorded, watch.names)
    findings += watch.custom_rule_findings()
    findings += watch.gated_findings()
    findings += _zero_by_construction(order, watch)
    findings += _zero_by_structure(models, watch, set(by_construction(order)))
    findings += _no_path(order, params, models, cuts, ran, watch.names)
    findings += depth_findings(order, watch.leaf_grads, {id(p): name for name, p in params})
    checked = {"forward": forward, "recorded": watch.recorded, "ran": watch.ran, "params": len(params)}
    return Diagnosis(findings, checked)


def _from_outside(forward: bool, params: List[Tuple[str, torch.Tensor]], unrecorded: Optional[UnrecordedOrigin],
                  names: Dict[int, str]) -> List[Finding]:
    """A NaN or Inf that no recorded op made: a parameter that holds one, an op that recorded nothing (found while
    the forward was watched), or else a value that entered the graph already non-finite."""
    found = []
    for name, p in params:
        if not all_finite(p):
            with plain_torch():
                bad, total = int((~torch.isfinite(p)).sum()), p.numel()
            found.append(Finding("nonfinite", "forward", "", "", name.rpartition(".")[0], "", f"the parameter {name} "
                                 f"holds NaN or Inf itself ({bad} of {total} elements) before this forward ran: an "
                                 "earlier optimizer step, an in-place edit or a loaded checkpoint wrote it",
                                 "find the step that made it (tt.diagnose.training(model, optimizer) flags the first "
                                 "non-finite step) and restore the weights from a finite checkpoint"))
    if unrecorded is not None:
        found.append(Finding("nonfinite", "forward", unrecorded.op, "", path_name(unrecorded.modules, names),
                             unrecorded.line, *unrecorded.cause, code=unrecorded.code))
    if found:
        return found
    where = "no recorded op made it" if forward else "the forward was not watched (tt.diagnose(fn, *args) watches it)"
    return [Finding("nonfinite", "forward", "", "", "", "", f"the loss or a gradient is not finite, and {where}: a "
                    "value that was already NaN or Inf entered the graph (an input, a buffer, a constant)",
                    "check what goes in: torch.isfinite(t).all() for the inputs and the model's buffers")]


def _zero_by_construction(order: List[Any], watch: Watch) -> List[Finding]:
    found = []
    for leaf_id, why in by_construction(order).items():
        reference = watch.leaf_grads.get(id(why.reference)) if why.reference is not None else None
        grad = watch.leaf_grads.get(leaf_id)
        if looks_zero(grad, reference):
            size = float(grad.abs().max().as_subclass(torch.Tensor)) if grad.numel() else 0.0
            found.append(watch.finding(why.user, "zero_by_construction", "backward",
                                       f"the gradient of this layer's bias is {size:.1e}: {why.reason}", why.advice))
    return found


def _zero_by_structure(models: List[torch.nn.Module], watch: Watch, said: Set[int]) -> List[Finding]:
    """The biases zero by construction that the model's modules show (an attention's key bias) and the graph did
    not already (`said`: their ids)."""
    findings = []
    for model in models:
        for key, (name, why, weight) in by_structure(model).items():
            grad, reference = watch.leaf_grads.get(key), watch.leaf_grads.get(id(weight))
            if key not in said and looks_zero(grad, reference):
                size = float(grad.abs().max().as_subclass(torch.Tensor)) if grad.numel() else 0.0
                findings.append(Finding("zero_by_construction", "backward", "", "", name.rpartition(".")[0], "",
                                        f"the gradient of {name} is {size:.1e}: {why}, and its gradient is 0 up to "
                                        "rounding", BIAS_ADVICE))
    return findings


def _parameters(models: List[torch.nn.Module], arg_leaves: List[torch.Tensor]) -> List[Tuple[str, torch.Tensor]]:
    params: List[Tuple[str, torch.Tensor]] = []
    seen = set()
    for model in models:
        for name, p in model.named_parameters():
            if id(p) not in seen and (getattr(p, "_tt_requires_grad", False) or p.requires_grad):
                seen.add(id(p))
                params.append((name, p))
    params += [(f"argument {i}", t) for i, t in enumerate(arg_leaves) if id(t) not in seen]
    return params


def _no_path(order: List[Any], params: List[Tuple[str, torch.Tensor]], models: List[torch.nn.Module],
             cuts: Dict[int, Any], ran: Optional[Dict[int, torch.nn.Module]], names: Dict[int, str]) -> List[Finding]:
    reached = {id(n.variable) for n in order if isinstance(n, AccumulateGrad)}
    module_of = {id(p): (names.get(id(m), type(m).__name__), m)
                 for model in models for m in model.modules() for p in m.parameters(recurse=False)}
    found = []
    for why, line, code, module, group in no_path_reasons(params, reached, cuts, module_of, ran, names):
        shown = ", ".join(group[:6]) + (f" and {len(group) - 6} more" if len(group) > 6 else "")
        advice = ("tt.diagnose(fn, *args) watches the forward and names the line that cut it" if why == UNWATCHED else
                  "call it outside the torch.no_grad() block (or, to freeze it on purpose, requires_grad_(False) on "
                  "its parameters and leave them out of the optimizer)" if "torch.no_grad()" in why else
                  "use the tensor itself where its gradient should flow" if line else
                  "call the module in forward, or remove it (or pass its parameters to no optimizer)")
        found.append(Finding("no_path", "graph", "", "", module, line, f"no gradient reaches {shown}: {why}",
                             advice, code=code))
    return found
