"""Gradient rules: indexing ops (placeholder until written)."""
