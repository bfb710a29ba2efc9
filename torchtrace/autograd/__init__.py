"""The engine: Function and its registry, the dispatcher, backward, grad mode."""
