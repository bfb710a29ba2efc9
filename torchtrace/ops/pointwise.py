"""Gradient rules: pointwise ops (placeholder until written)."""
