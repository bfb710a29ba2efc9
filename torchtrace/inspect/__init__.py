"""Walks over the recorded graph: the text trace (more views arrive with the inspect issue)."""
