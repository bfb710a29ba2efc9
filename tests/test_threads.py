"""Two threads using torchtrace at once: each gets torch autograd's answer, and no thread sees another's state."""
import threading

import torch

import torchtrace as tt


def run_threads(*targets):
    """Run each target in its own thread; re-raise the first exception a thread raised."""
    errors = []

    def guarded(target):
        try:
            target()
        except BaseException as e:  # noqa: BLE001  (handed back to the test)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def train(model, optimizer, x, y, steps, barrier=None):
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if barrier is not None:
            barrier.wait()  # the two threads step in lockstep, so their ops interleave


def test_two_models_train_at_once_each_equal_to_torch():
    data = [(torch.randn(32, 5, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)) for _ in range(2)]
    expected = []
    for seed, (x, y) in enumerate(data):
        model = mlp(seed)
        train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y, 60)
        expected.append([p.detach() for p in model.parameters()])
    models = [tt.port(mlp(seed)) for seed in range(2)]
    barrier = threading.Barrier(2)
    run_threads(*[
        (lambda m=m, x=x, y=y: train(m, tt.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), tt.tracer(x), y, 60,
                                     barrier))
        for m, (x, y) in zip(models, data)])
    for model, want in zip(models, expected):
        for p, q in zip(model.parameters(), want):
            torch.testing.assert_close(p.detach().as_subclass(torch.Tensor), q)


def second_derivative_torch(x):
    x = x.clone().requires_grad_()
    (g,) = torch.autograd.grad((x.exp() * x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad((g * g).sum(), x)
    return h


def test_create_graph_in_one_thread_while_another_runs_plain_backward():
    """Thread A's create_graph backward is paused (by a hook) while thread B runs a whole plain backward."""
    a_paused, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    x0 = torch.randn(4, dtype=torch.float64)
    result = {}

    def thread_a():
        x = tt.tracer(x0, requires_grad=True)
        mid = x.exp()  # exp saves its output: its backward must re-link it to the graph under create_graph

        def pause(g):
            a_paused.set()
            assert b_inside.wait(30)

        mid.register_hook(pause)
        (g,) = tt.grad((mid * x).sum(), x, create_graph=True)
        a_done.set()
        result["h"] = tt.grad((g * g).sum(), x)[0]

    def thread_b():
        assert a_paused.wait(30)
        w = tt.tracer(torch.randn(4, dtype=torch.float64), requires_grad=True)
        mid = w.exp()

        def hold(g):
            b_inside.set()
            assert a_done.wait(30)

        mid.register_hook(hold)
        (mid * w).sum().backward()

    run_threads(thread_a, thread_b)
    torch.testing.assert_close(result["h"].as_subclass(torch.Tensor), second_derivative_torch(x0))


def test_detect_anomaly_in_one_thread_does_not_raise_in_another():
    entered, finished = threading.Event(), threading.Event()

    def thread_a():
        with tt.detect_anomaly():
            entered.set()
            assert finished.wait(30)

    def thread_b():
        assert entered.wait(30)
        try:
            x = tt.tracer(torch.tensor([-1.0, 4.0]), requires_grad=True)
            x.sqrt().sum().backward()  # NaN forward and backward: only an error under detect_anomaly
            assert torch.isnan(x.grad[0])
        finally:
            finished.set()

    run_threads(thread_a, thread_b)


def test_no_grad_in_one_thread_does_not_stop_recording_in_another():
    entered, finished = threading.Event(), threading.Event()

    def thread_a():
        with tt.no_grad():
            entered.set()
            assert finished.wait(30)

    def thread_b():
        assert entered.wait(30)
        try:
            x = tt.tracer(torch.ones(3), requires_grad=True)
            assert (x * 2).grad_fn is not None
        finally:
            finished.set()

    run_threads(thread_a, thread_b)
