"""The exercise checkers of the lesson "Mixed precision" (`import precision_checkers` in a notebook of this folder).

Each prints `right`, `not done yet`, or `wrong` with a hint. The numbers they compare with come from torch
itself (torch.finfo, a torch.amp.GradScaler run, tt.precision's float16 run beside the float32 one), never from a
formula written here; a wrong answer is compared with what each common mistake would give, and the hint names the
idea behind the first one that explains it, never the code to write.
"""
import math
import numbers
from typing import Any, Callable, List, Optional, Sequence

import torch

import torchtrace as tt


def _wrong(hint: str) -> None:
    print(f"wrong\nhint: {hint}")


def _near(got: float, value: float, rel_tol: float = 2e-3) -> bool:
    return math.isclose(got, value, rel_tol=rel_tol)


def _number(answer: Any) -> Optional[float]:
    if answer is None:
        print("not done yet: set the variable to your answer")
        return None
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if not isinstance(answer, numbers.Real) or isinstance(answer, bool):
        print(f"wrong\nhint: give a number (a float), not {type(answer).__name__}")
        return None
    return float(answer)


def _check_number(answer: Any, truth: float, mistakes: Sequence[tuple], general: str, rel_tol: float) -> None:
    got = _number(answer)
    if got is None:
        return
    if _near(got, truth, rel_tol):
        print("right")
        return
    _wrong(next((hint for value, hint, *tol in mistakes if _near(got, value, tol[0] if tol else rel_tol)), general))


def largest_float16(answer: Any) -> None:
    """The largest finite float16: all exponent bits but the reserved all-ones pattern, all mantissa bits set."""
    _check_number(answer, torch.finfo(torch.float16).max, [
        (2.0 ** 16, "with every mantissa bit set the significand is 1.1111111111 in binary, just below 2, not 2"),
        (2.0 ** 15, "the significand adds its 10 fraction bits to the leading 1: the largest is almost twice the "
                    "largest power of two"),
        (torch.finfo(torch.float32).max, "that is float32's largest (an 8-bit exponent and 23 mantissa bits); "
                                         "float16 has a 5-bit exponent and 10 mantissa bits", 1e-4),
        (torch.finfo(torch.bfloat16).max, "that is bfloat16's largest (an 8-bit exponent, as float32's); float16 has "
                                          "a 5-bit exponent", 2e-2),  # 3.4e38 too (float32's is 0.4% above)
        (2.0 ** 16 - 1, "float16 keeps 11 significant bits, so numbers near 2**16 are 32 apart: 65535 is not one of "
                        "them"),
    ], "count the bits: 5 of exponent (bias 15, the all-ones pattern kept for inf and NaN) and 10 of mantissa",
        rel_tol=1e-6)  # exact: its neighbours 65472 and 65536 (inf) are other answers


def smallest_subnormal_float16(answer: Any) -> None:
    """The smallest positive float16: a subnormal with only its last mantissa bit set."""
    _check_number(answer, float(torch.tensor(1, dtype=torch.int16).view(torch.float16)), [
        (torch.finfo(torch.float16).tiny, "that is the smallest *normal* float16; below it the subnormals go on, "
                                          "giving up one significant bit at each halving"),
        (torch.finfo(torch.float16).eps, "that is the resolution at 1 (the gap between 1 and the next float16), not "
                                         "the smallest number"),
        (2.0 ** -25, "the smallest normal is 2**-14 and a subnormal can halve it as many times as there are mantissa "
                     "bits: count 10, not 11"),
        (float(torch.tensor(1, dtype=torch.int16).view(torch.bfloat16)), "that is bfloat16's smallest subnormal: "
                                                                          "float16's exponent is much shorter"),
    ], "the smallest normal is 2**(1 - bias); the subnormals below it use the mantissa bits for the rest",
        rel_tol=2e-2)  # 6e-8 is fine


def first_underflow(answer: Any, loss_fn: Callable, x: torch.Tensor) -> None:
    """The module whose rule is the first, in backward order, to send a float16 gradient that underflowed."""
    if answer is None:
        print("not done yet: set first_layer to a module's name")
        return
    report = tt.precision(loss_fn, x, dtype=torch.float16)
    backward = [row for row in report.rows if row.phase == "backward"]
    names = list(dict.fromkeys(row.module for row in backward if row.module))
    if not isinstance(answer, str):
        _wrong(f"give the module's name as a string, as tt.precision prints it (one of {names})")
        return
    first = report.first_underflow
    if first is not None and answer == first.module:
        print("right")
        return
    if answer not in names:
        _wrong(f"give the module's name as tt.precision prints it in its rows (one of {names})")
        return
    row = next(r for r in backward if r.module == answer)
    if first is not None and backward.index(row) > backward.index(first):
        _wrong("this layer receives gradients that are already zero: find where the zeros start, the first rule in "
               "backward order whose float16 gradient is 0 where float32's is not")
    else:
        _wrong("this layer's float16 gradients are all there; the layer you are after comes later in the backward, "
               "where a small incoming gradient meets small weights and the product falls below 6e-8")


def _scales(steps: int, overflow: Sequence[int], init: float, interval: int, backoff: float = 0.5,
            reset_on_skip: bool = True, grow_every_step: bool = False, after_update: bool = False) -> List[float]:
    """A mistaken account of GradScaler: the scales it would give under one misunderstanding."""
    scale, good, used = init, 0, []
    for step in range(steps):
        if not after_update:
            used.append(scale)
        if step in overflow:
            scale *= backoff
            good = 0 if reset_on_skip else good + 1
        else:
            good += 1
            if grow_every_step or good == interval:
                scale, good = scale * 2, 0
        if after_update:
            used.append(scale)
    return used


def _torch_scales(steps: int, overflow: Sequence[int], init: float, interval: int) -> List[float]:
    """The scale each step used, from torch.amp.GradScaler itself (a gradient made inf at the overflowing steps)."""
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=interval)
    used = []
    for step in range(steps):
        optimizer.zero_grad()
        used.append(scaler.get_scale())
        scaled = scaler.scale(weight.sum() * (math.inf if step in overflow else 1.0))
        scaled.backward()
        scaler.step(optimizer)
        scaler.update()
    return used


def _reals(answer: Any) -> Optional[List[float]]:
    """The numbers of a list or tuple (of numbers, numpy numbers or 0-d tensors), or of a 1-d tensor or array; None
    for anything else (bools included)."""
    if getattr(answer, "ndim", None) == 1 and hasattr(answer, "tolist"):
        answer = answer.tolist()
    if not isinstance(answer, (list, tuple)):
        return None
    values = [a.item() if getattr(a, "ndim", None) == 0 and hasattr(a, "item") else a for a in answer]
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return None
    return [float(v) for v in values]


def scale_trajectory(answer: Any, steps: int, overflow: Sequence[int], init: float, interval: int) -> None:
    """The scale each step's backward used, as a list of `steps` numbers."""
    if answer is None:
        print("not done yet: set scales to your list")
        return
    answer = _reals(answer)
    if answer is None:
        _wrong(f"give a list of {steps} numbers, the scale of each step")
        return
    if len(answer) != steps:
        _wrong(f"give one scale per step: {steps} numbers, not {len(answer)}")
        return
    truth = _torch_scales(steps, overflow, init, interval)
    same = lambda xs: all(_near(float(a), b) for a, b in zip(answer, xs))  # noqa: E731
    if same(truth):
        print("right")
        return
    mistakes = [
        (dict(backoff=1.0), "a step whose gradients hold an inf is skipped *and* the scale is multiplied by "
                            "backoff_factor (0.5): it would overflow again otherwise"),
        (dict(reset_on_skip=False), "growth_interval counts consecutive steps without an inf: a skipped step starts "
                                    "the count again from zero"),
        (dict(grow_every_step=True), "the scale does not grow after every good step: only after growth_interval of "
                                     "them in a row"),
        (dict(after_update=True), "list the scale each step's backward used, the one before scaler.update() "
                                  "changes it"),
    ]
    _wrong(next((hint for changed, hint in mistakes if same(_scales(steps, overflow, init, interval, **changed))),
                "walk through the steps one by one: a good step adds one to the count of good steps in a row, and at "
                "growth_interval the scale doubles; an inf halves it and skips the step"))


def needs_scaling(answer: Any, model: Callable, x: torch.Tensor) -> None:
    """Which dtype loses gradients to underflow on this model without a loss scale: "float16" or "bfloat16"."""
    if answer is None:
        print("not done yet: set needs_scale to a dtype")
        return
    lost = {dtype: tt.precision(model, x, dtype=dtype).gradient_underflow > 0
            for dtype in (torch.float16, torch.bfloat16)}
    truth = [dtype for dtype, under in lost.items() if under]
    if answer in truth or (isinstance(answer, str) and answer in [str(d).replace("torch.", "") for d in truth]):
        print("right")
    elif isinstance(answer, (torch.dtype, str)) and str(answer).replace("torch.", "") == "bfloat16":
        _wrong("bfloat16 keeps float32's 8-bit exponent: its smallest numbers are as small as float32's, so a gradient "
               "of 1e-9 survives; it pays with fewer mantissa bits (resolution), not with range")
    elif isinstance(answer, (torch.dtype, str)) and str(answer).replace("torch.", "") == "float32":
        _wrong("float32 is the reference the low dtypes are measured against: nothing underflows there that is not "
               "below 1e-38")
    else:
        _wrong('give the dtype, torch.float16 or torch.bfloat16 (or its name, "float16")')
