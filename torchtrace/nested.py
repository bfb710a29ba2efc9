"""Nested containers of tensors (tuples, lists, named tuples, dicts), as functions take and return them: their
leaves in order, and the same containers rebuilt around new leaves."""
from typing import Any, Callable, List, Tuple


def flatten(tree: Any) -> Tuple[List[Any], Callable[[List[Any]], Any]]:
    """Leaves of nested tuples / lists / named tuples / dicts, and a function that rebuilds the tree (the same
    container types) from new leaves."""
    if isinstance(tree, (list, tuple)):
        parts = [flatten(item) for item in tree]
        sizes = [len(leaves) for leaves, _ in parts]

        def rebuild_sequence(leaves: List[Any]) -> Any:
            items, start = [], 0
            for (_, rebuild), size in zip(parts, sizes):
                items.append(rebuild(leaves[start:start + size]))
                start += size
            return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)  # (torch.return_types too)

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild_sequence
    if isinstance(tree, dict):
        keys = list(tree)
        leaves, rebuild_values = flatten([tree[k] for k in keys])

        def rebuild_dict(new: List[Any]) -> Any:
            rebuilt = tree.copy()  # the same kind of dict (OrderedDict, defaultdict)
            rebuilt.update(zip(keys, rebuild_values(new)))
            return rebuilt

        return leaves, rebuild_dict
    return [tree], lambda new: new[0]
