"""python -m torchtrace diagnose script.py: run a training script with the doctor watching its first backward passes.

The script runs as `python script.py` would (its own `__name__ == "__main__"` block, sys.argv). While it runs,
every op records its source line, the calls that cut the graph are noted, and each `loss.backward()` of a scalar
tracer (up to `steps` of them) runs as tt.diagnose(loss): a finding is printed the first time it is seen, with
the backward pass it appeared in. Every optimizer step (up to `steps`) is watched too (doctor/steps.py): the first
step whose update, gradient or loss blew up is named with the learning rate, as soon as it happens. The patch on
`backward` and the watchers are removed when the script ends.
"""
import runpy
import sys
from typing import Any, List, Optional, Set, Tuple

from torch.nn.modules.module import register_module_forward_pre_hook

from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.doctor.diagnosis import diagnose_watched
from torchtrace.doctor.findings import Finding
from torchtrace.doctor.paths import CutWatcher, ModulesRan
from torchtrace.doctor.steps import StepWatch
from torchtrace.doctor.unrecorded import FirstUnrecorded
from torchtrace.doctor.watch import Watch
from torchtrace.inspect.scope import module_scope
from torchtrace.tracer import tracer


class Session:
    """The watchers of one script run, renewed after each diagnosed backward."""

    def __init__(self, steps: int, out: Any) -> None:
        self.steps, self.out = steps, out
        self.diagnosed = 0
        self.busy = False
        self.seen: Set[Tuple[str, str, str, str]] = set()
        self.findings: List[Tuple[int, Finding]] = []
        self.watch, self.cuts, self.ran = Watch({}), CutWatcher(), ModulesRan()
        self.optimizer_steps = StepWatch(steps)

    def on_record(self, *call: Any) -> None:
        if self.diagnosed < self.steps:
            self.watch.on_record(*call)

    def _training(self) -> None:
        """Print the training finding the first time the optimizer steps so far show one."""
        finding = None if self.optimizer_steps.reported else self.optimizer_steps.finding()
        if finding is not None:
            self.optimizer_steps.reported = True
            self.findings.append((self.diagnosed, finding))
            print(f"tt.diagnose, optimizer steps 1-{len(self.optimizer_steps.steps)}: {finding}", file=self.out)

    def backward(self, original: Any) -> Any:
        def backward(loss: Any, gradient: Optional[Any] = None, retain_graph: Optional[bool] = None,
                     create_graph: bool = False, inputs: Optional[Any] = None, show: bool = False) -> None:
            if (self.busy or self.diagnosed >= self.steps or gradient is not None or create_graph or show
                    or inputs is not None or loss.numel() != 1):
                return original(loss, gradient, retain_graph, create_graph, inputs=inputs, show=show)
            self.diagnosed += 1
            with plain_torch():
                self.optimizer_steps.note_loss(float(loss.detach()))
            self._training()
            self.busy = True  # the diagnosis runs this very backward: it must reach the original
            try:
                with self.cuts.paused():
                    diagnosis = diagnose_watched(loss, self.watch, self.cuts, self.ran)
            finally:
                self.busy = False
            for finding in diagnosis.findings:
                key = (finding.kind, finding.rule, finding.module, finding.line)
                if key not in self.seen:
                    self.seen.add(key)
                    blew_up = self.optimizer_steps.blew_up_at
                    if blew_up is not None and finding.kind in ("killed", "nonfinite", "saturated"):
                        finding.message += (f" - after the updates blew up at optimizer step {blew_up} (above): the "
                                             "learning rate is the likely cause")
                    self.findings.append((self.diagnosed, finding))
                    print(f"tt.diagnose, backward {self.diagnosed}: {finding}", file=self.out)
            self.watch, self.cuts.cut_leaves, self.cuts.unrecorded = Watch({}), {}, FirstUnrecorded()
        return backward


def run_script(path: str, argv: List[str], steps: int = 20, out: Any = None) -> Session:
    """Run the script at `path` with `argv`, diagnosing its first `steps` backward passes; the session's findings."""
    session = Session(steps, out or sys.stdout)
    had_own = "backward" in tracer.__dict__
    original = tracer.backward
    handle = register_module_forward_pre_hook(session.ran)
    saved_argv = sys.argv
    sys.argv = [path, *argv]
    tracer.backward = session.backward(original)
    try:
        with module_scope(), observing(on_record=session.on_record), session.cuts, session.optimizer_steps:
            runpy.run_path(path, run_name="__main__")
        session._training()  # a blow-up at the last steps
    finally:
        sys.argv = saved_argv
        handle.remove()
        if had_own:
            tracer.backward = original
        else:
            del tracer.backward
    found = len(session.findings)
    unseen = "" if session.diagnosed else (" (no backward ran on tracers: the script's tensors are plain torch's, "
                                           "which the doctor cannot watch; tt.port(model) and tt.tracer(x) let it)")
    print(f"tt.diagnose: {session.diagnosed} backward passes diagnosed{unseen}, {found} distinct finding"
          f"{'' if found == 1 else 's'}", file=session.out)
    return session
