"""The one topological sort: Kahn's algorithm over integer nodes, deterministic.

The graph's op order, the task graph's order, the check that a plan's per-device orders respect
the data flow, and the TensorFlow applier's cycle check all use it. (The simulator and the list
scheduler also release tasks as their inputs complete, but by time and priority: they schedule,
they do not sort.)
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["topological_order"]


def topological_order(successors: Sequence[Sequence[int]],
                      indegree: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Nodes ``0..n-1`` with each before its successors, and the nodes a cycle leaves stuck.

    The order is depth-first among ready nodes: the lowest-numbered ready node first, and after
    a node, its newly ready successors in the order they are listed. The same input always gives
    the same order.

    Args:
        successors: per node, the nodes that depend on it (a node may be listed more than once:
            each listing is one edge).
        indegree: per node, its number of incoming edges, when the caller has it already
            (else counted from ``successors``).

    Returns:
        ``(order, stuck)``: every node that can be ordered, then the nodes on or behind a cycle
        (empty when there is none), in index order.

    Example:
        >>> topological_order([[2], [2], []])
        ([0, 1, 2], [])
        >>> topological_order([[1], [0], []])
        ([2], [0, 1])
    """
    if indegree is None:
        missing = [0] * len(successors)
        for targets in successors:
            for j in targets:
                missing[j] += 1
    else:
        missing = list(indegree)
    stack = [i for i in range(len(successors) - 1, -1, -1) if missing[i] == 0]
    order = []
    while stack:
        i = stack.pop()
        order.append(i)
        for j in reversed(successors[i]):
            missing[j] -= 1
            if missing[j] == 0:
                stack.append(j)
    stuck = [i for i, m in enumerate(missing) if m > 0] if len(order) < len(successors) else []
    return order, stuck
