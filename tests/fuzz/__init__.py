"""Differential fuzzer: random small programs on tracers vs torch autograd: no silent gradients.

python -m tests.fuzz --long [--minutes N] [--seed S] [--known-bugs]
"""
