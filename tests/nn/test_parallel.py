"""tt.nn.parallel.DistributedDataParallel: two gloo processes on 127.0.0.1 (ddp_worker.py) against torch autograd on
the full batch in this process, and finite differences for the full-batch gradient."""
import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest
import torch
from ddp_torch_cases import CASES
from ddp_worker import BUCKET_CAP_MB, data, make_model, shard

import torchtrace as tt
from torchtrace.nn.parallel import DistributedDataParallel
from torchtrace.nn.parallel.reducer import plan_buckets, reachable_leaves

WORLD = 2
ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list:
    """Run the worker on 2 ranks; each returns what it observed."""
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    port = str(free_port())
    worker = str(pathlib.Path(__file__).with_name("ddp_worker.py"))
    procs = [subprocess.Popen([sys.executable, worker, str(rank), str(WORLD), port, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(WORLD)]
    try:
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


def torch_twin(params: dict) -> torch.nn.Module:
    """The worker's MLP in plain torch (torch autograd), with the given parameter values."""
    twin = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 3)).double()
    twin.load_state_dict(params)
    return twin


def full_batch_grads(twin: torch.nn.Module, *seeds: int) -> dict:
    twin.zero_grad()
    for seed in seeds:
        x, y = data(seed)
        torch.nn.functional.mse_loss(twin(x), y).backward()
    return {name: p.grad.clone() for name, p in twin.named_parameters()}


def assert_same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-10, atol=1e-12, msg=name)


def test_parameters_are_broadcast_from_rank_0(ranks):
    rank0_init = {name: p.detach().as_subclass(torch.Tensor) for name, p in make_model(seed=100).named_parameters()}
    for result in ranks:
        assert_same(result["initial"], rank0_init)


def test_each_rank_gets_the_full_batch_gradient_of_torch_autograd(ranks):
    twin = torch_twin(ranks[0]["initial"])
    expected = full_batch_grads(twin, 1)
    for result in ranks:
        assert_same(result["grads"], expected)
    x, y = data(1)
    params = tuple(p.detach().clone().requires_grad_(True) for p in twin.parameters())
    names = [name for name, _ in twin.named_parameters()]

    def loss(*values):
        return torch.nn.functional.mse_loss(torch.func.functional_call(twin, dict(zip(names, values)), (x,)), y)

    assert torch.autograd.gradcheck(loss, params)  # torch's full-batch gradient against finite differences


def test_no_sync_keeps_gradients_local_and_the_next_backward_averages_their_sum(ranks):
    twin = torch_twin(ranks[0]["initial"])
    for rank, result in enumerate(ranks):
        twin.zero_grad()
        x, y = shard(data(2), rank, WORLD)
        torch.nn.functional.mse_loss(twin(x), y).backward()
        assert_same(result["local_grads"], {name: p.grad for name, p in twin.named_parameters()})
        assert_same(result["accumulated_grads"], full_batch_grads(twin, 2, 3))


def test_training_keeps_ranks_equal_to_single_process_torch(ranks):
    twin = torch_twin(ranks[0]["initial"])
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = data(10 + step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(twin(x), y).backward()
        optimizer.step()
    for result in ranks:
        assert_same(result["trained"], {name: p.detach() for name, p in twin.named_parameters()})


def test_a_parameter_one_rank_uses_averages_with_zeros_and_one_no_rank_uses_keeps_no_grad(ranks):
    p = {name: v.clone().requires_grad_(True) for name, v in ranks[0]["branch_initial"].items()}
    losses = []
    for rank in range(WORLD):
        x, y = shard(data(4), rank, WORLD)
        out = x @ p["body.weight"].T + p["body.bias"]
        if rank == 1:
            out = out + x @ p["extra.weight"].T + p["extra.bias"]
        losses.append(torch.nn.functional.mse_loss(out, y))
    (sum(losses) / WORLD).backward()
    for result in ranks:
        grads = result["branch_grads"]
        assert grads["unused.weight"] is None and grads["unused.bias"] is None
        assert_same({k: v for k, v in grads.items() if not k.startswith("unused")},
                    {k: v.grad for k, v in p.items() if not k.startswith("unused")})


def test_a_gradient_accumulated_on_one_rank_is_averaged_on_every_rank_even_if_the_last_forward_skips_it(ranks):
    p = {name: v.clone().requires_grad_(True) for name, v in ranks[0]["branch_initial"].items()}
    total = 0
    for rank in range(WORLD):
        x, y = shard(data(4), rank, WORLD)
        plain = x @ p["body.weight"].T + p["body.bias"]
        with_extra = plain + x @ p["extra.weight"].T + p["extra.bias"] if rank == 1 else plain
        total = total + torch.nn.functional.mse_loss(with_extra, y) + torch.nn.functional.mse_loss(plain, y)
    (total / WORLD).backward()
    for result in ranks:
        grads = result["branch_accumulated_grads"]
        assert grads["unused.weight"] is None and grads["unused.bias"] is None
        assert_same({k: v for k, v in grads.items() if not k.startswith("unused")},
                    {k: v.grad for k, v in p.items() if not k.startswith("unused")})


def test_buffers_are_broadcast_from_rank_0_at_the_forward_after_a_synchronised_one(ranks):
    assert not torch.equal(ranks[0]["norm_before"][0], ranks[1]["norm_before"][0])  # the ranks' statistics differed
    for result in ranks:
        for after, rank0 in zip(result["norm_after"], ranks[0]["norm_before"]):
            assert torch.equal(after.as_subclass(torch.Tensor), rank0.as_subclass(torch.Tensor))


def test_the_backprop_trace_shows_each_bucket_all_reduce_where_it_starts(ranks):
    lines = ranks[0]["trace"].splitlines()
    buckets = ranks[0]["buckets"]
    assert buckets == [["4.bias", "4.weight", "2.bias"], ["2.weight"], ["0.bias"], ["0.weight"]]  # reverse order
    starts = [i for i, line in enumerate(lines) if "all-reduce bucket" in line]
    assert len(starts) == len(buckets)
    for k, (i, names) in enumerate(zip(starts, buckets)):
        assert f"bucket {k} [{', '.join(names)}]" in lines[i] and f"mean over {WORLD} ranks" in lines[i]
    layer = {text: lines.index(f"↘︎ {text}") for text in ("Linear layer (8 X 6)", "Linear layer (5 X 8)")}
    assert layer["Linear layer (8 X 6)"] < starts[0] < starts[1] < layer["Linear layer (5 X 8)"]  # bucket 0: 2.bias
    assert layer["Linear layer (5 X 8)"] < starts[2] < starts[3] == len(lines) - 2  # then only "Input"


@pytest.mark.parametrize("key, message", [
    ("second_backward", "received a gradient after its forward's gradients were averaged"),
    ("after_partial_backward", r"did not reach every parameter .*\(second.weight, second.bias got no gradient\)"),
    ("plain_parameters", "needs tracer parameters, but weight, bias are plain torch tensors"),
    ("refused_option", r"does not support mixed_precision= \(communicating gradients in another dtype\)"),
    ("static_graph_changed", r"static_graph=True\): the training graph changed .*extra.weight, extra.bias"),
])
def test_misuse_raises_instead_of_leaving_gradients_unaveraged(ranks, key, message):
    for result in ranks:
        assert result[key], f"{key}: nothing was raised"
        assert re.search(message, result[key]), result[key]


def test_refuses_without_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(tt.nn.Linear(2, 2))


def test_buckets_go_in_reverse_order_under_the_cap_and_split_by_dtype():
    params = [torch.zeros(4), torch.zeros(10), torch.zeros(2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
              torch.zeros(1, dtype=torch.float64)]
    assert plan_buckets(params, cap_bytes=40) == [[4, 3], [2], [1], [0]]
    assert plan_buckets(params, cap_bytes=10**6) == [[4, 3, 2], [1, 0]]
    assert BUCKET_CAP_MB * 2**20 == 300


def test_reachable_leaves_follow_the_graph():
    a, b, unused = (tt.tracer(torch.ones(2), requires_grad=True) for _ in range(3))
    out = (a * 2).sum() + b.exp().sum()
    assert reachable_leaves([out]) == {id(a), id(b)}
    assert reachable_leaves([a, tt.tracer(torch.ones(1))]) == {id(a)}


def test_the_docs_page_shows_the_trace_this_run_printed(ranks):
    page = (ROOT / "docs" / "ddp.md").read_text(encoding="utf-8")
    shown = re.search(r"```text\n(BackProp:.*?)```", page, re.S).group(1)
    assert shown == ranks[0]["trace"]


def _same_observations(torch_run, ours, where: str) -> None:
    """Everything a case observed under torch's DDP equals what it observed under ours (an error on both or on
    neither)."""
    if isinstance(torch_run, dict):
        assert torch_run.keys() == ours.keys(), where
        for key in torch_run:
            _same_observations(torch_run[key], ours[key], f"{where}/{key}")
    elif isinstance(torch_run, str):
        assert bool(torch_run) == bool(ours), f"{where}: torch raised {torch_run!r}, ours {ours!r}"
    elif torch_run is None or ours is None:
        assert torch_run is None and ours is None, f"{where}: torch {torch_run}, ours {ours}"
    else:
        torch.testing.assert_close(ours, torch_run, rtol=1e-10, atol=1e-12, msg=where)


@pytest.mark.parametrize("case", [case.__name__ for case in CASES])
def test_each_case_matches_torchs_distributed_data_parallel(ranks, case):
    for rank, result in enumerate(ranks):
        runs = result["torch_cases"][case]
        assert "crashed" not in runs["torch"], runs["torch"]
        assert "crashed" not in runs["ours"], runs["ours"]
        _same_observations(runs["torch"], runs["ours"], f"rank {rank}: {case}")


def test_the_cases_observe_what_they_are_about(ranks):
    """The comparisons above are not vacuous: unused parameters keep None, buffers differ across ranks where torch
    does not copy them, the error is raised, and gradients are bucket views."""
    for rank, result in enumerate(ranks):
        cases = {case: runs["ours"] for case, runs in result["torch_cases"].items()}
        zeroed = cases["unused_head_after_zero_grad"]
        assert zeroed["grads1"]["head.weight"] is None and zeroed["grads0"]["head.weight"] is not None
        assert cases["partial_outputs"]["grads1"]["second.weight"] is None
        assert "find_unused_parameters=True" in cases["unused_head_without_find_unused"]["error"]
        assert cases["gradient_as_bucket_view"]["is_view1"] and cases["gradient_as_bucket_view"]["kept2"]
        assert cases["structured_outputs"]["dataclassTrue"]["unused.weight"] is None
        synced = cases["buffers_at_construction"]
        assert synced["forward False, broadcast False"].eq(0).all() and synced["default"].eq(0).all()
        assert synced["broadcast False"].eq(rank).all()
    means = [result["torch_cases"]["batchnorm_accumulation"]["ours"]["values0"]["1.running_mean"]
             for result in ranks]
    assert not torch.equal(means[0], means[1])  # the forward after no_sync() copied nothing
