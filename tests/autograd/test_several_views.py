"""The pieces of split, chunk and unbind (several views returned by one op), as torch: no in-place change of a piece
(or of a view of one) that records a gradient, and no use of a piece with grad mode on after its base changed in
place; every other program with pieces runs with torch's gradients."""
import pytest
import torch

import torchtrace as tt
from tests.helpers import check_op


def _data(requires_grad: bool = True) -> torch.Tensor:
    return (torch.arange(12.0, dtype=torch.float64).reshape(4, 3) + 1).requires_grad_(requires_grad)


def _as_torch_or_tracer(t: torch.Tensor, ours: bool) -> torch.Tensor:
    return tt.tracer(t.detach(), requires_grad=t.requires_grad) if ours else t.detach().clone().requires_grad_(
        t.requires_grad)


def _no_grad(fn):
    with torch.no_grad():
        return fn()


# program(x, w) -> anything; x (4, 3) requires grad unless the name says otherwise, w (2, 3) requires grad
REFUSED = {
    "split piece, in place": lambda x, w: (x * 1).split(2)[0].mul_(2),
    "chunk piece, in place": lambda x, w: (x * 1).chunk(2, dim=1)[1].add_(1),
    "split_with_sizes piece": lambda x, w: torch.split(x * 1, [1, 3])[1].mul_(2),
    "unbind row, in place": lambda x, w: (x * 1).unbind(0)[2].zero_(),
    "rows of iteration": lambda x, w: [row.add_(1) for row in x * 1],
    "copy_ into a column": lambda x, w: (x * 1).unbind(1)[0].copy_(torch.zeros(4, dtype=torch.float64)),
    "a view of a piece": lambda x, w: (x * 1).split(2)[0][0].mul_(2),
    "setitem on a piece": lambda x, w: (x * 1).split(2)[0].__setitem__(0, 5.0),
    "piece of a leaf": lambda x, w: x.split(2)[0].mul_(2),
    "relu(inplace=True) of a piece": lambda x, w: torch.nn.functional.relu((x * 1).split(2)[1], inplace=True),
    "no-grad piece, grad operand (x without grad)": lambda x, w: (x * 1).split(2)[0].mul_(w),
    "base changed, piece used": lambda x, w: (lambda y, p: (y.mul_(2), p[0].sum()))(*(lambda y: (y, y.split(2)))(
        x * 1)),
    "base changed, piece's grad_fn read": lambda x, w: (lambda y, p: (y.mul_(2), p[1].grad_fn))(
        *(lambda y: (y, y.split(2)))(x * 1)),
    "piece changed under no_grad, used": lambda x, w: (lambda p: (_no_grad(lambda: p[0].mul_(2)), p[0].sum()))(
        (x * 1).split(2)),
    "sibling changed under no_grad, other used": lambda x, w: (lambda p: (_no_grad(lambda: p[0].mul_(2)),
                                                                          p[1].sum()))((x * 1).split(2)),
}


def _raised(program, x: torch.Tensor, w: torch.Tensor, ours: bool) -> str:
    with pytest.raises(RuntimeError) as raised:
        program(_as_torch_or_tracer(x, ours), _as_torch_or_tracer(w, ours))
    return str(raised.value)


@pytest.mark.parametrize("name", REFUSED)
def test_refused_as_torch_refuses_it(name):
    x = _data(requires_grad="x without grad" not in name)
    w = torch.full((2, 3), 2.0, dtype=torch.float64, requires_grad=True)
    theirs, ours = _raised(REFUSED[name], x, w, False), _raised(REFUSED[name], x, w, True)
    # the same words, up to the op named ("Output 1 of Chunk" where torch's chunk is its Split; GetItem for Select)
    assert ours.split(" is a view", 1)[-1] == theirs.split(" is a view", 1)[-1]
    assert ours.split(" of ")[0] == theirs.split(" of ")[0]
    assert "returns multiple views" in ours


ALLOWED = {
    # tensor_split and hsplit slice one piece at a time: ordinary views, changed in place as torch allows
    "tensor_split piece, in place": lambda x: (lambda y: (y.tensor_split(2)[0].mul_(3), (y * y).sum())[1])(x * 1),
    "hsplit piece, in place": lambda x: (lambda y: (y.T.hsplit(2)[1].mul_(3), (y * y).sum())[1])(x * 1),
    # not views: unsafe_split's pieces are the caller's to change
    "unsafe_split piece, in place": lambda x: (lambda p: (p[0].mul_(3), (p[0] * p[1]).sum())[1])(
        torch.unsafe_split(x * 1, 2)),
    "the base changed, pieces unused": lambda x: (lambda y: (y.split(2), y.mul_(3), (y * y).sum())[2])(x * 1),
    "pieces read, not changed": lambda x: sum((p * p).sum() * (i + 1) for i, p in enumerate((x * 1).unbind(1))),
    "a piece's clone changed": lambda x: (lambda c: (c.mul_(2), (c * c).sum())[1])((x * 1).chunk(2)[1].clone()),
}


@pytest.mark.parametrize("name", ALLOWED)
def test_allowed_programs_have_torchs_gradients(name):
    check_op(ALLOWED[name], _data(requires_grad=False))


def test_pieces_change_in_place_when_nothing_records_a_gradient():
    """torch lets a piece change in place when no gradient is recorded: nothing requires grad, or grad mode is off."""
    for make in (lambda: (tt.tracer(_data(False)) * 1, None),
                 lambda: (tt.tracer(_data(False), requires_grad=True) * 1, torch.no_grad())):
        y, mode = make()
        pieces = y.split(2)
        if mode is None:
            pieces[0].mul_(2)
        else:
            with mode:
                pieces[0].mul_(2)
        assert torch.equal(y[:2].as_subclass(torch.Tensor), 2 * _data(False)[:2])


def test_a_pieces_detached_alias_changes_in_place_as_torch():
    """detach() makes a view outside the graph: changing it in place is allowed (torch's gradient then reads the new
    values, which finite differences of the program do not: torch's rule for .detach(), compared with torch alone)."""
    check_op(lambda x: (lambda y: (y.split(2)[0].detach().mul_(2), (y * y).sum())[1])(x * 1), _data(False),
             gradcheck=False)


def test_pieces_a_compiled_call_returns_are_refused_as_eagers_on_every_call():
    """tt.compile replays split on later calls: its pieces are pieces there too (changed in place, or used after the
    base changed), with eager's words, on the recording call and on every replayed one."""
    def pieces(x):
        y = x * 2
        return y, y.split(2)

    step = tt.compile(pieces, (_data(False),))
    for call in range(3):
        for change in ("piece", "base"):
            y, parts = step(tt.tracer(_data(False) + call, requires_grad=True))
            with pytest.raises(RuntimeError) as raised:
                if change == "piece":
                    parts[1].mul_(2)
                else:
                    y.mul_(2)
                    parts[0].sum()
            nr, words = (1, "is being modified inplace") if change == "piece" else (0, "its base or another view")
            assert str(raised.value).startswith(f"Output {nr} of Split is a view and {words}")
    assert step.replayed >= 4
