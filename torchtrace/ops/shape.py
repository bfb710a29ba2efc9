"""Gradient rules: shape ops (placeholder until written)."""
