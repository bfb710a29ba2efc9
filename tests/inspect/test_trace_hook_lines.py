"""The backprop trace prints what a leaf's post-accumulate-grad hooks announce (`trace_lines`), right where that
leaf's gradient is complete: how DistributedDataParallel shows its bucket all-reduces."""
import contextlib
import io

import torchtrace as tt


class Announces:
    def __init__(self, name: str):
        self.name, self.seen = name, []

    def __call__(self, leaf) -> None:
        pass

    def trace_lines(self, accumulated: set) -> list:
        self.seen.append(set(accumulated))
        return [f"{self.name} is complete"]


def printed(y) -> list:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        y.backward(show=True)
    return out.getvalue().splitlines()


def position(lines: list, text: str) -> int:
    """The index of the one line that ends with `text` (lines of a DAG trace start with their number)."""
    (index,) = [i for i, line in enumerate(lines) if line.endswith(text)]
    return index


def test_the_announcement_follows_the_op_that_completes_the_leaf():
    w, b = tt.tracer([1.0, 2.0], requires_grad=True), tt.tracer([0.5, 0.1], requires_grad=True)
    hook_w, hook_b = Announces("w"), Announces("b")
    w.register_post_accumulate_grad_hook(hook_w)
    b.register_post_accumulate_grad_hook(hook_b)
    lines = printed((w * 3.0 + b).tanh().sum())
    assert lines[0] == "BackProp:" and lines[-1] == "↘︎ Input"
    tanh, add, mul = (position(lines, op) for op in ("Tanh()", "Add()  ⇉ sends to [3], [5]", "Mul()"))
    assert tanh < add < position(lines, "b is complete") < mul < position(lines, "w is complete")
    # the leaves accumulated so far, whenever the trace asks (it may lay the lines out twice)
    assert hook_b.seen and all(seen == {id(b)} for seen in hook_b.seen)
    assert hook_w.seen and all(seen == {id(b), id(w)} for seen in hook_w.seen)


def test_a_dag_numbers_the_announcement_like_every_other_line():
    a, b = tt.tracer([1.0, 2.0], requires_grad=True), tt.tracer([3.0, 4.0], requires_grad=True)
    a.register_post_accumulate_grad_hook(Announces("a"))
    lines = printed((a * b + a).sum())
    numbered = [line for line in lines[1:-1] if line.startswith("↘︎ [")]
    assert numbered == lines[1:-1]  # every line of a DAG trace is numbered, the announcement too
    assert lines[-2].endswith("a is complete")  # after a's two gradients are summed into its .grad:
    assert "-> .grad  ⊕ sums 2 gradients" in lines[-3]
