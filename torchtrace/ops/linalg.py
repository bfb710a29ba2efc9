"""Gradient rules: linalg ops (placeholder until written)."""
