"""to_code: readable source (rules' math, module names, parameter names) that runs with only torch imported."""
import copy
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import Cube

import torchtrace as tt
from torchtrace.autograd.function import RULES


def _model(activation: type = tt.nn.Tanh) -> torch.nn.Module:
    torch.manual_seed(0)
    return tt.nn.Sequential(tt.nn.Linear(2, 4), activation(), tt.nn.Linear(4, 1))


def test_labels_names_and_rule_math():
    code = tt.trace(_model(), torch.randn(3, 2)).to_code()
    tanh_doc = RULES[torch.tanh].__doc__.strip().splitlines()[0]
    linear_rule = RULES[torch.nn.functional.linear]
    assert f"# {RULES[torch.tanh].__name__}: {tanh_doc}" in code  # every backward block: the rule and its math
    assert f"# {linear_rule.__name__}  [0: Linear]" in code  # forward blocks: the module they ran in
    assert 'params["0.weight"]' in code and 'params["2.bias"]' in code
    assert "def forward(input, params):" in code and "def backward(params, saved, grad0):" in code
    names = re.findall(r"^    (\w+) = ", code, flags=re.MULTILINE)
    assert names and all(re.fullmatch(r"[tg]\d{1,2}|h_\d|d_\d_(weight|bias)", n) for n in names), names
    assert "h_0 = torch.nn.functional.linear(" in code and "d_0_weight = " in code  # names from the model
    assert code == tt.trace(_model(), torch.randn(3, 2)).to_code()  # stable names


def test_a_changed_rule_changes_the_code():
    class CubeAgain(Cube):
        """y = x^3 -> dy/dx = 3 x^2, written with pow"""

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.pow(x, 2) * 3

    first = tt.compile(lambda x: Cube.apply(x).sum(), (tt.randn(3, requires_grad=True),)).code
    second = tt.compile(lambda x: CubeAgain.apply(x).sum(), (tt.randn(3, requires_grad=True),)).code
    assert "# Cube: y = x^3 -> dy/dx = 3 x^2" in first and "torch.pow" not in first
    assert "torch.pow(x, 2)" in second


RUNNER = textwrap.dedent("""
    import sys
    import torch
    namespace = {}
    exec(open(sys.argv[1]).read(), namespace)
    data = torch.load(sys.argv[2])
    outputs, saved = namespace["forward"](data["x"], data["params"])
    grads = namespace["backward"](data["params"], saved, torch.ones_like(outputs[0]))
    assert not any(name.startswith("torchtrace") for name in sys.modules)
    torch.save({"loss": outputs[0], "grads": grads}, sys.argv[3])
""")


@pytest.mark.parametrize("activation", [tt.nn.Tanh, tt.nn.ReLU])  # ReLU's backward calls torch.ops.aten
def test_the_code_runs_in_a_subprocess_with_only_torch(tmp_path, activation):
    model = _model(activation)
    x = torch.randn(5, 2)
    code = tt.compile(lambda inputs: (model(inputs) ** 2).mean(), (x,)).code
    (tmp_path / "step.py").write_text(code)
    (tmp_path / "run.py").write_text(RUNNER)
    params = {name: p.detach().as_subclass(torch.Tensor) for name, p in model.named_parameters()}
    torch.save({"x": x, "params": params}, tmp_path / "in.pt")
    subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "step.py"), str(tmp_path / "in.pt"),
                    str(tmp_path / "out.pt")], check=True, cwd=tmp_path)
    result = torch.load(tmp_path / "out.pt")
    loss = (model(x) ** 2).mean()
    loss.backward()
    torch.testing.assert_close(result["loss"], loss.detach().as_subclass(torch.Tensor))
    expected = [None, *(p.grad for p in model.parameters())]  # x needs no gradient
    assert result["grads"][0] is None
    for got, want in zip(result["grads"][1:], expected[1:]):
        torch.testing.assert_close(got, want)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_the_code_passes_ruff(tmp_path):
    from test_port import GPT

    model = tt.port(GPT(vocab=16, d=16, heads=2, length=8, layers=1))
    tokens = torch.randint(0, 16, (2, 8))
    code = tt.compile(lambda t: model(t).logsumexp(-1).mean(), (tokens,)).code
    path = tmp_path / "gpt_step.py"
    path.write_text(code)
    result = subprocess.run(["ruff", "check", "--line-length", "120", "--select", "E,F,W,I", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_the_teaching_form_reads_as_the_chain_rule_and_gives_the_fast_forms_numbers():
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(4, 8), tt.nn.ReLU(), tt.nn.Linear(8, 8), tt.nn.Tanh(), tt.nn.Linear(8, 1))
    x, target = torch.randn(16, 4), torch.randn(16, 1)

    def step(x, target):
        return torch.nn.functional.mse_loss(model(x), target) * 0.5

    teaching = tt.trace(step, x, target).to_code()
    fast = tt.compile(step, (x, target)).code
    body = teaching.split("def forward")[1]
    assert "del " not in body and "torch.ops.aten" not in body and "_(" not in body  # no frees, kernels, in place
    assert "torch.where(h_1 <= 0, 0.0, " in body and "d_0_weight = " in body  # ReLU's rule as math, model names
    assert "del " in fast and "torch.ops.aten.threshold_backward" in fast  # the fast form keeps both
    params = {name: p.detach().as_subclass(torch.Tensor) for name, p in model.named_parameters()}
    results = []
    for code in (teaching, fast):
        namespace: dict = {}
        exec(code, namespace)
        outputs, saved = namespace["forward"](x, target, params, (0.5,))  # `* 0.5`: a number of the call
        results.append([*outputs, *(g for g in namespace["backward"](params, saved, torch.ones(())) if g is not None)])
    assert len(results[0]) == len(results[1]) == 7  # the loss and six parameter gradients
    assert "(1 - h_3 * h_3)" in body and "torch.ops.aten.tanh_backward" in fast  # Tanh's the same way
    for a, b in zip(*results):  # (tanh_backward rounds g (1 - y^2) once, with a fused multiply-add: the last bit)
        torch.testing.assert_close(a, b, rtol=2e-7, atol=1e-9)


def test_the_compiler_package_imports_at_the_top_of_its_modules():
    import ast
    import pathlib

    import torchtrace.compiler as package

    late = []
    for path in pathlib.Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                late += [f"{path.name}:{inner.lineno}" for inner in ast.walk(node)
                         if isinstance(inner, (ast.Import, ast.ImportFrom))]
    assert not late, f"imports inside functions (an import cycle worked around): {late}"


SCALE = tt.tracer(torch.tensor([2.0, -1.0, 0.5]), requires_grad=True)


def test_a_tensor_read_from_a_closure_or_a_global_keeps_its_python_name():
    weight = tt.tracer(torch.tensor([0.5, 1.5, -2.0]), requires_grad=True)

    def fn(x):
        return (x * weight * SCALE).tanh().sum()

    x = tt.tracer(torch.tensor([1.0, 2.0, 3.0]), requires_grad=True)
    for code in (tt.trace(fn, x).to_code(), tt.compile(fn, (x,)).code):
        assert "t1 = torch.mul(x, weight)" in code and "torch.mul(t1, SCALE)" in code
        assert code.count('weight = params["weight"]') == 2 and code.count('SCALE = params["SCALE"]') == 2
        assert "# gradients of: x, weight, SCALE" in code and "d_weight = " in code and "d_SCALE = " in code
    compiled = tt.compile(fn, (x,))
    compiled(x).backward()
    got = [plain(t.grad).clone() for t in (x, weight, SCALE)]
    for t in (x, weight, SCALE):
        t.grad = None
    fn(x).backward()
    for g, t in zip(got, (x, weight, SCALE)):
        torch.testing.assert_close(g, plain(t.grad), rtol=0, atol=0)


def plain(t):
    return t.detach().as_subclass(torch.Tensor)


def _run_both_forms(fn, *inputs):
    """The teaching and the fast form of fn's code, each run on `inputs`: [outputs..., gradients...]."""
    compiled = tt.compile(fn, tuple(tt.as_tracer(t, requires_grad=True) for t in inputs))
    results = []
    for code in (compiled.to_code(), compiled.code):
        namespace: dict = {}
        exec(code, namespace)
        outputs, saved = namespace["forward"](*inputs, {})
        seeds = [torch.ones_like(o) for o in outputs]
        results.append([*outputs, *namespace["backward"]({}, saved, *seeds)])
    return compiled.code, results


@pytest.mark.parametrize("case", ["chain", "broadcast", "view_then_scale", "shared_operand"])
def test_the_fast_form_writing_into_dying_gradients_gives_torchs_gradients(case):
    """Both forms, run with the arguments in the function's own order (the generated forward takes them so), give
    torch autograd's gradients; gradient buffers written in place never change a value still to be read."""
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*s, dtype=torch.float64, generator=g) for s in ((5, 4), (5, 4), (4,)))
    fns = {
        "chain": lambda x, w, b: ((((x * w) * w + b) * x) / (w * w + 1)).sum(),
        "broadcast": lambda x, w, b: ((x * b) * (w - b) / (b * b + 1)).sum(),
        "view_then_scale": lambda x, w, b: (((x * w).t() * 3).t() * (x * w) * w + b).sum(),
        "shared_operand": lambda x, w, b: (((x * w) * (x * w)) * w - w * b).sum(),
    }
    fn = fns[case]
    code, (teaching, fast) = _run_both_forms(fn, x, w, b)
    assert "_(" in code  # some gradient buffer is reused in place
    refs = [t.clone().requires_grad_() for t in (x, w, b)]
    fn(*refs).backward()
    for a, c in zip(teaching, fast):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-15)
    for got, ref in zip(fast[1:], refs):
        torch.testing.assert_close(got, ref.grad, rtol=1e-12, atol=1e-12)
    numeric = torch.autograd.gradcheck  # finite differences of the function itself, the same reference
    assert numeric(lambda *t: fn(*t), [r.detach().clone().requires_grad_() for r in refs])


def test_a_tensor_argument_the_path_does_not_read_stays_in_the_generated_signature():
    """Both forms take the function's own arguments, in order, and backward gives one gradient per argument (None
    for the one never read), then the parameters'; the numbers are torch autograd's and finite differences'."""
    from references import finite_differences

    g = torch.Generator().manual_seed(5)
    x, unused, y, w = (torch.randn(*s, dtype=torch.float64, generator=g) for s in ((2, 4), (5,), (2, 3), (3, 4)))
    w_ = tt.as_tracer(w.clone(), requires_grad=True)

    def fn(x, unused, y):
        return ((x @ w_.t()).tanh() * y).sum()

    compiled = tt.compile(fn, tuple(tt.as_tracer(t.clone(), requires_grad=True) for t in (x, unused, y)))
    refs = [t.clone().requires_grad_() for t in (x, unused, y, w)]
    ((refs[0] @ refs[3].t()).tanh() * refs[2]).sum().backward()
    numeric = finite_differences(lambda: ((x @ w.t()).tanh() * y).sum(), [x, y, w])
    for code in (compiled.to_code(), compiled.code):
        assert "def forward(x, unused, y, params):" in code
        namespace: dict = {}
        exec(code, namespace)
        outputs, saved = namespace["forward"](x, unused, y, {"w_": w})
        grads = namespace["backward"]({"w_": w}, saved, torch.ones(()))
        assert len(grads) == 4 and grads[1] is None
        torch.testing.assert_close(outputs[0], ((x @ w.t()).tanh() * y).sum())
        for got, ref, fd in zip((grads[0], grads[2], grads[3]), (refs[0], refs[2], refs[3]), numeric):
            torch.testing.assert_close(got, ref.grad)
            torch.testing.assert_close(got, fd, rtol=1e-5, atol=1e-6)


def test_the_numbers_of_a_call_are_arguments_of_its_code_never_literals():
    """Plain numbers are read anew on every call, so the code takes them (`numbers`): run with a later call's numbers
    (other values than the recording call's), both forms give that call's loss and torch autograd's and finite
    differences' gradients."""
    from references import finite_differences

    g = torch.Generator().manual_seed(7)
    x, w = (torch.randn(3, dtype=torch.float64, generator=g) for _ in range(2))
    w_ = tt.as_tracer(w.clone(), requires_grad=True)

    def fn(x, s, slope):
        return (torch.nn.functional.leaky_relu(torch.tanh(x * w_) * s, slope) * (1 - s)).sum()

    compiled = tt.compile(fn, (x, 0.3, 0.1))
    compiled(x, 0.5, 0.2).backward()  # records the path with s = 0.5, slope = 0.2
    s, slope = 2.0, 0.3
    reference = lambda w: (torch.nn.functional.leaky_relu(torch.tanh(x * w) * s, slope) * (1 - s)).sum()  # noqa: E731
    ref_w = w.clone().requires_grad_()
    reference(ref_w).backward()
    numeric = finite_differences(lambda: reference(w), [w])[0]
    for code in (compiled.to_code(), compiled.code):
        assert "def forward(x, params, numbers):" in code and "0.5" not in code.split("(f0, f1, f2) = numbers")[1]
        namespace: dict = {}
        exec(code, namespace)
        outputs, saved = namespace["forward"](x, {"w_": w}, (s, slope, 1 - s))
        grads = namespace["backward"]({"w_": w}, saved, torch.ones((), dtype=torch.float64))
        torch.testing.assert_close(outputs[0], reference(w))
        torch.testing.assert_close(grads[-1], ref_w.grad)
        torch.testing.assert_close(grads[-1], numeric, rtol=1e-5, atol=1e-6)


def test_a_tensor_the_call_makes_itself_is_described_where_the_code_reads_it():
    """nn.LSTM makes its zero initial state inside forward: the code reads it as a leaf with no name and says what it
    is, so a reader can pass it (zeros here); then the output is the model's."""
    torch.manual_seed(0)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 4, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    model = tt.port(Wrapped())
    x = torch.randn(2, 5, 3)
    code = tt.trace(model, tt.tracer(x, requires_grad=True)).to_code()
    assert "# a (2, 4) float32 tensor the call made or found itself (not an argument or parameter): pass its value" \
        in code
    leaves = sorted(set(re.findall(r'params\["(leaf\d+)"\]', code)))
    params = {name: p.detach().as_subclass(torch.Tensor) for name, p in model.named_parameters()}
    params.update({name: torch.zeros(2, 4) for name in leaves})
    namespace: dict = {}
    exec(code, namespace)
    outputs, _ = namespace["forward"](x, params)
    torch.testing.assert_close(outputs[0], model(x).detach().as_subclass(torch.Tensor))


def test_a_number_a_rule_branches_on_is_an_argument_the_code_refuses_to_change():
    """pow's rule branches on its exponent, so the code is written for the recording call's exponent: the code takes
    it as a number too (never a silent literal), gives torch autograd's and finite differences' gradient for that
    value, and refuses any other by name, although the compiled call itself replays the path with it."""
    from references import finite_differences

    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    fn = lambda x, p: (x.abs() + 0.1).pow(p).sum()  # noqa: E731
    x_ = tt.as_tracer(x.clone(), requires_grad=True)
    compiled = tt.compile(fn, (x_, 2.5))
    compiled(x_, 2.5)
    later = compiled(x_, 0.5)  # the same path, another exponent: the compiled call follows it
    later.backward()
    ref = x.clone().requires_grad_()
    fn(ref, 0.5).backward()
    torch.testing.assert_close(x_.grad, ref.grad)
    ref.grad = None
    fn(ref, 2.5).backward()
    numeric = finite_differences(lambda: fn(x, 2.5), [x])[0]
    for code in (compiled.code, compiled.to_code()):
        namespace: dict = {}
        exec(code, namespace)
        (out,), saved = namespace["forward"](x, {}, (0.1, 2.5))
        (grad,) = namespace["backward"]({}, saved, torch.ones((), dtype=torch.float64))
        torch.testing.assert_close(out, fn(x, 2.5))
        torch.testing.assert_close(grad, ref.grad)
        torch.testing.assert_close(grad, numeric, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match=r"f1 is 0\.5: this code holds for 2\.5 only"):
            namespace["forward"](x, {}, (0.1, 0.5))


def test_rules_whose_torch_function_checks_its_numbers_in_python_give_code():
    """F.hardtanh compares its bounds and F.batch_norm its eps in Python before the kernel: their numbers are the
    code's arguments all the same, and the code gives torch autograd's and finite differences' gradients (and
    batch norm's running statistics)."""
    from references import finite_differences

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, dtype=torch.float64, generator=g)
    norm = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.uniform_(-1, 1, generator=g)
    ported = tt.port(copy.deepcopy(norm))

    def fn(x):
        return (torch.nn.functional.hardtanh(x, -0.5, 0.75) * 2).sum() + ported(x).pow(2).sum()

    def reference(x, module):
        return (torch.nn.functional.hardtanh(x, -0.5, 0.75) * 2).sum() + module(x).pow(2).sum()

    x_ = tt.as_tracer(x.clone(), requires_grad=True)
    compiled = tt.compile(fn, (x_,))
    params = {name: t.detach().clone().as_subclass(torch.Tensor) for name, t in ported.state_dict().items()
              if name != "num_batches_tracked"}
    compiled(x_).backward()
    ref, ref_norm = x.clone().requires_grad_(), copy.deepcopy(norm)
    reference(ref, ref_norm).backward()
    numeric = finite_differences(lambda: reference(x, copy.deepcopy(norm)), [x])[0]
    code = compiled.code
    assert "numbers" in code
    namespace: dict = {}
    exec(code, namespace)
    (out,), saved = namespace["forward"](x, params, (-0.5, 0.75, 0.1, 1e-05))
    grads = namespace["backward"](params, saved, torch.ones((), dtype=torch.float64))
    torch.testing.assert_close(out, reference(x, copy.deepcopy(norm)))
    torch.testing.assert_close(grads[0], ref.grad)
    torch.testing.assert_close(grads[0], numeric, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params["running_mean"], ref_norm.running_mean)
    assert "hardtanh" in compiled.to_code()
