"""A graph keeps what each op produced, up to a per-thread byte budget, and never more than its values: no node, no
other graph, no growth over a training loop; the player shows what the op produced, never memory changed later."""
import gc
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from helpers import keep_values_budget

import torchtrace as tt
from torchtrace.autograd.kept_values import Kept
from torchtrace.inspect.explore.budget import held_bytes


def values_of(ex):
    return {n.label: n.value for n in ex.nodes}


def micrograd_in_a_function():
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    return d * f


def test_a_value_built_inside_a_function_is_kept():
    ex = tt.explore(micrograd_in_a_function())  # e = a * b: no variable holds it once the function returned
    ta, tb, tc, tf = (torch.tensor(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    te = ta * tb
    td = te + tc
    (td * tf).backward()
    shown = sorted(float(n.value) for n in ex.nodes if n.kind == "op")
    assert shown == sorted([te.item(), td.item()])  # the output is "Mul → L"-less here: kind "output"
    assert ex.notice == "" and all(n.value_note == "" for n in ex.nodes)
    after = {s.name: float(s.after) for s in ex.steps if s.kind == "accumulate"}
    assert sorted(after.values()) == sorted(t.grad.item() for t in (ta, tb, tc, tf))


def test_a_kept_value_is_an_alias_that_holds_no_node():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = x * 3
    node = y.grad_fn
    (ref,) = node.value_refs
    assert isinstance(ref, Kept) and ref() is not y and torch.equal(ref(), y)
    assert type(ref()) is torch.Tensor  # a plain alias: it holds the memory, not the graph
    del y
    assert torch.equal(node.value_refs[0](), torch.tensor([3.0, 6.0]))
    p, q = x.split([1, 1])
    assert [r().tolist() for r in p.grad_fn.value_refs] == [[1.0], [2.0]]


def test_beyond_the_budget_values_are_held_weakly():
    start = held_bytes()
    with keep_values_budget(start + 3 * 400):  # three 100-float results
        x = tt.tracer(torch.ones(100), requires_grad=True)
        ys = [x * 2]
        for _ in range(5):
            ys.append(ys[-1] * 2)
        refs = [y.grad_fn.value_refs[0] for y in ys]
        assert [isinstance(r, Kept) for r in refs] == [True] * 3 + [False] * 3
        assert held_bytes() == start + 3 * 400
        weak = refs[3:]
        assert all(isinstance(r, weakref.ref) and r() is y for r, y in zip(weak, ys[3:]))
        del ys, refs
        assert all(r() is None for r in weak)
    assert held_bytes() == start


def test_a_freed_graph_gives_its_bytes_back_without_the_cycle_collector():
    start = held_bytes()
    gc.disable()
    try:
        out = micrograd_in_a_function()
        node = weakref.ref(out.grad_fn)
        assert held_bytes() > start
        del out
        assert node() is None and held_bytes() == start  # freed by reference counting: no cycle through a value
    finally:
        gc.enable()


def test_a_training_loop_holds_no_more_than_one_graphs_values():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = tt.tracer(torch.randn(32, 8)), torch.randn(32, 1)
    start, seen = held_bytes(), []
    for _ in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        seen.append(held_bytes() - start)
        loss.backward()
        optimizer.step()
    del loss
    assert held_bytes() == start and len(set(seen)) == 1 and seen[0] > 0


def test_each_thread_counts_its_own_bytes():
    got = []

    def build():
        with keep_values_budget(tt.explore.keep_values()):
            y = tt.tracer(torch.ones(10), requires_grad=True) * 2
            got.append((held_bytes(), isinstance(y.grad_fn.value_refs[0], Kept)))

    start = held_bytes()
    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert got == [(40, True)] and held_bytes() == start


@pytest.mark.parametrize("budget, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                           ("abc", TypeError), (float("inf"), TypeError)])
def test_keep_values_refuses_a_budget_that_is_no_number_of_bytes(budget, error):
    before = tt.explore.keep_values()
    with pytest.raises(error, match="tt.explore.keep_values: the budget"):
        tt.explore.keep_values(budget)
    assert tt.explore.keep_values() == before


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "weak"])
def test_a_value_changed_under_no_grad_shows_both_versions(kept):
    with keep_values_budget(tt.explore.keep_values() if kept else 0):
        x = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        s = y.sum()
        with torch.no_grad():
            y.mul_(10)
        ex = tt.explore(s)
    shown = {n.label: n for n in ex.nodes}
    assert shown["Sum → s"].value == "12"
    mul = shown["Mul → y"]
    assert mul.value == ""  # never [20, 40, 60] as the op's result
    assert "changed in place after this op (version 0 → 1): it holds [20, 40, 60] now" in mul.value_note
    torch.testing.assert_close(x.grad, torch.tensor([2.0, 2.0, 2.0]))


def test_the_function_form_shows_what_the_op_produced_before_the_change():
    def f(x):
        y = x * 2
        s = y.sum()
        with torch.no_grad():
            y.mul_(10)
        return s

    ex = tt.explore(f, torch.tensor([1.0, 2.0, 3.0]))
    (mul,) = [n for n in ex.nodes if n.label.startswith("Mul")]
    assert mul.value == "[2, 4, 6]" and "it holds [20, 40, 60] now; shown: what the op produced" in mul.value_note


def test_a_view_whose_base_changed_is_not_shown_as_its_ops_result():
    x = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    v = y[:2]
    s = (v + 1).sum()  # Add saves nothing: the change is allowed, as in torch
    with torch.no_grad():
        y.add_(1)
    ex = tt.explore(s)
    (view,) = [n for n in ex.nodes if n.label.endswith("→ v")]
    assert view.value == "" and "it holds [3, 5] now" in view.value_note
    tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    tv = (tx * 2)[:2]
    (tv + 1).sum().backward()
    torch.testing.assert_close(x.grad, tx.grad)


def small_model():
    torch.manual_seed(0)
    return tt.port(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))), \
        tt.randn(8, 4), torch.arange(8) % 3


def test_the_players_the_project_makes_keep_every_value_whatever_the_budget():
    model, x, y = small_model()
    loss = lambda: torch.nn.functional.cross_entropy(model(x), y)  # noqa: E731
    with keep_values_budget(0):
        players = {"explore(fn)": tt.explore(lambda x: torch.nn.functional.cross_entropy(model(x), y), x),
                   "diagnose": tt.diagnose(loss).explore()}
        both = tt.diff(loss, loss, titles=("a", "b")).explore()
        players.update({"diff a": both.a, "diff b": both.b})
        assert held_bytes() > 0  # they count against the budget while they live
    for what, ex in players.items():
        assert all(n.value for n in ex.nodes), (what, [n.label for n in ex.nodes if not n.value])
        assert ex.notice == ""


def test_the_output_changed_in_place_after_its_op_is_marked_in_the_player_and_the_drawing():
    """(x*x).sum() is 14; multiplied by 10 under no_grad afterwards it holds 140, which no op produced: the player
    marks the output node as changed (as any other), and the drawing shows no data for it or for a named result
    changed so, while an unchanged result keeps its value."""
    x = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
    loss = (x * x).sum()
    with tt.no_grad():
        loss.mul_(10)
    root = tt.explore(loss).nodes[0]
    assert root.value == "" and "changed in place after this op (version 0 → 1)" in root.value_note
    a, b, c, f = (tt.tracer([v], requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    L = d * f
    with tt.no_grad():
        e.mul_(100)
        L.add_(1000)
    source = tt.draw(L, values=True).source
    assert "Mul → e (1)\"" in source and "Mul → L (1)\"" in source and "Add → d (1) | data [4]" in source
    assert "-600" not in source and "992" not in source and "their result changed in place after the op" in source


def test_the_first_backward_in_a_process_notes_a_tiny_graphs_gradients_for_the_drawing():
    """micrograd's example in a fresh interpreter: tt.draw after the very first backward shows every gradient (the
    notes were taken only once a drawing tool had been imported)."""
    code = ("import torchtrace as tt\n"
            "a, b, c, f = (tt.tracer([v], requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))\n"
            "e = a * b; d = e + c; L = d * f; L.backward()\n"
            "print(tt.draw(L, values=True).source)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for label in ("Mul → L (1) | data [-8] | grad [1]", "Add → d (1) | data [4] | grad [-2]",
                  "Mul → e (1) | data [-6] | grad [-2]"):
        assert label in out
