"""Fast lanes: per rule, straight-line recording code generated once from the rule's data (forward.py), Python's
operators on a tracer calling those lanes without torch's __torch_function__ entry (operators.py), and a walk that
calls the rules without the readable walk's per-node questions (walk.py).

The readable path (autograd/dispatch.run_rule and autograd/engine._walk) is the reference: it is what a student
steps through, what every tool that watches calls runs on, and what tt.readable() or TORCHTRACE_READABLE=1 selects
for everything. A lane takes only the common call and hands any other to run_rule unchanged; a differential test
(tests/autograd/test_lanes.py) requires both to give bit-identical values and gradients.
"""
