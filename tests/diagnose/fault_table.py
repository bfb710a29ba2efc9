"""The seeded-fault table of the docs: each fault on each model, what tt.diagnose (or tt.diff, or the training
doctor) says, and what torch.autograd.detect_anomaly says about the same fault on the same model in plain torch.

    python tests/diagnose/fault_table.py      # prints the Markdown table (docs/diagnose.md holds its output)
"""
import math
import sys
import warnings
from pathlib import Path
from typing import Callable, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doctor_models import batch, build, loss_fn  # noqa: E402

import torchtrace as tt  # noqa: E402

DEAD = {"mlp": "fc2", "cnn": "conv2", "gpt": "fc"}
WHOLE_MESSAGE = ("standardised input with a blank row (no eps)", ".data cut",
                 "dead ReLU stem (later layer dead as a consequence)", "a parameter holds NaN")  # said in full
FAULTS: List[Tuple[str, str]] = (
    [("log(0) in a hand-written cross entropy", kind) for kind in ("mlp", "cnn", "gpt", "bert", "gpt2")]
    + [("sqrt of a negative", kind) for kind in ("mlp", "cnn")]
    + [("-inf attention mask on a full row", kind) for kind in ("gpt", "bert", "gpt2")]
    + [("dead ReLU layer (bias -100)", kind) for kind in ("mlp", "cnn", "gpt")]
    + [("saturated tanh pooler (weights x50)", "bert")]
    + [("detached branch", kind) for kind in ("mlp", "cnn", "gpt", "bert", "gpt2")]
    + [("planted wrong rule", kind) for kind in ("mlp", "cnn", "gpt", "gpt2")]
    + [("lr x 1e3 (Adam lr=1)", kind) for kind in ("mlp", "cnn", "gpt", "bert", "gpt2")]
    + [(fault, "mlp") for fault in WHOLE_MESSAGE])


def _setup(fault: str, kind: str, port: bool):
    model = build(kind, port=port)
    hand_written = fault.startswith("log(0)")
    left_padded = fault.startswith("-inf")
    if fault.startswith("sqrt"):
        model.fault = "sqrt"
    elif left_padded and kind != "gpt":
        model.fault = "-inf mask"
    elif fault.startswith("detached"):
        model.fault = "detach"
    elif fault.startswith("planted"):
        model.fault = "wrong rule"
    elif fault.startswith("standardised"):
        model.fault = "standardise"
    elif fault == ".data cut":
        model.fault = "data"
    with torch.no_grad():
        if fault.startswith("dead ReLU stem"):
            model.fc1.bias.fill_(-100.0)
            model.fc2.bias.copy_(-model.fc2.bias.abs())
        if fault.startswith("a parameter holds NaN"):
            model.fc2.weight[0, 0] = float("nan")
        if fault.startswith("dead"):
            model.get_submodule(DEAD[kind]).bias.fill_(-100.0)
        if fault.startswith("saturated"):
            model.pooler.weight.mul_(50.0)
    inputs, target = batch(kind, left_padded=left_padded)
    if fault.startswith("standardised"):
        inputs[0][3] = 0.0  # a blank example
    return model, lambda: loss_fn(model, kind, inputs, target, hand_written=hand_written)


def _train(model, loss: Callable, steps: int = 4):
    optimizer = (tt.optim.Adam if isinstance(next(model.parameters()), tt.tracer) else torch.optim.Adam)(
        model.parameters(), lr=1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    return value


def ours(fault: str, kind: str) -> str:
    model, loss = _setup(fault, kind, port=True)
    if fault.startswith("planted"):
        def run(planted):
            def run_loss():
                model.fault = planted
                return loss()
            return run_loss

        return f"tt.diff: first divergence {tt.diff(run('wrong rule'), run(None)).first}"
    if fault.startswith("lr"):
        with tt.diagnose.training(model, tt.optim.Adam(model.parameters(), lr=1.0)) as doc:
            optimizer = doc.optimizer
            for _ in range(4):
                optimizer.zero_grad()
                loss().backward()
                optimizer.step()
        flagged = sorted({f.module for f in doc.findings if "large updates" in f.message})
        return f"training doctor: large updates (median update/weight > 0.1) in {len(flagged)} layers, e.g. " \
               f"{', '.join(flagged[:3])}"
    alarms = tt.diagnose(loss).alarms
    said = []
    for finding in alarms[:2] if fault.startswith("dead ReLU stem") else alarms[:1]:
        where = " ".join(p for p in (finding.rule, f"in {finding.module}" if finding.module else "",
                                     f"at {finding.line}" if finding.line else "") if p)
        message = finding.message if (fault, kind) in FAULTS[-len(WHOLE_MESSAGE):] else finding.message.split(" (")[0]
        said.append(f"[{finding.kind}, {finding.phase}] {where}: {message}".replace("|", "\\|"))
    return " / ".join(said)


def anomaly_mode(fault: str, kind: str) -> str:
    model, loss = _setup(fault, kind, port=False)
    if fault.startswith("planted"):
        model.fault = None  # plain torch has no hand-written rule to plant; its own ReLU / tanh run
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly():
                if fault.startswith("lr"):
                    value = _train(model, loss)
                else:
                    value = loss()
                    value.backward()
    except RuntimeError as error:
        return f"RuntimeError: {str(error).splitlines()[0]}".replace("|", "\\|")
    loss = float(value.detach())
    if fault.startswith("lr"):  # a diverging run's loss after its steps differs by machine (in the 3rd digit too)
        return f"no error (a {'finite' if math.isfinite(loss) else 'non-finite'} loss after the 4 steps)"
    return f"no error (loss {loss:.3g})"


def markdown() -> str:
    lines = ["| fault | model | tt.diagnose says | torch.autograd.detect_anomaly says |", "|---|---|---|---|"]
    for fault, kind in FAULTS:
        lines.append(f"| {fault} | {kind} | {ours(fault, kind)} | {anomaly_mode(fault, kind)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
