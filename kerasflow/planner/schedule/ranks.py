"""List-scheduling priorities: task costs per device, upward and downward ranks, the critical path.

Upward rank (HEFT): ``rank_u(t) = w(t) + max over successors c of (comm(t, c) + rank_u(c))``,
the length of the longest path from ``t`` to the end of the step. Downward rank:
``rank_d(t) = max over predecessors p of (rank_d(p) + w(p) + comm(p, t))``, the longest
path from the start to ``t``. ``w`` is a task's cost averaged over the devices it may run
on and ``comm`` a transfer's cost averaged over the cluster's links (Topcuoglu et al.,
IEEE TPDS 2002). Tasks on a critical path have the largest ``rank_u + rank_d``.
"""

from __future__ import annotations

from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import durations
from ..ir.toposort import topological_order
from ..sim.taskgraph import TaskGraph

__all__ = ["TaskCosts", "upward_ranks", "downward_ranks", "critical_path", "topological_tasks",
           "predecessors", "average_link"]


class TaskCosts:
    """The duration of every task on every device, computed once per device class.

    Devices of the same kind and speed (and copy figures) share one list of costs, so a
    homogeneous cluster costs one pass over the tasks.

    Args:
        tg: the expanded step.
        graph: the graph it was expanded from.
        cluster: the devices.
        fixed: per task a device index it must run on, or -1.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-pcie")
        >>> tg = build_task_graph(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> costs = TaskCosts(tg, graph, cluster)
        >>> costs.on(3, 0) == costs.on(3, 2) == costs.average[3]
        True
    """

    def __init__(self, tg: TaskGraph, graph: OpGraph, cluster: Cluster, fixed: list[int] | None = None):
        devices = cluster.devices
        keys = [(d.kind, d.speed, d.memory_bandwidth, d.launch_overhead) for d in devices]
        self.classes = list(dict.fromkeys(keys))
        self.device_class = [self.classes.index(k) for k in keys]
        first_of_class = [devices[keys.index(k)] for k in self.classes]
        self.by_class = [self._costs(tg, graph, device) for device in first_of_class]
        count = len(devices)
        weights = [self.device_class.count(c) / count for c in range(len(self.classes))]
        n = len(tg)
        if len(self.classes) == 1:
            average = list(self.by_class[0])
        else:
            average = [sum(w * costs[t] for w, costs in zip(weights, self.by_class)) for t in range(n)]
        if fixed is not None:
            for t, d in enumerate(fixed):
                if d >= 0:
                    average[t] = self.by_class[self.device_class[d]][t]
        self.average = average

    @staticmethod
    def _costs(tg: TaskGraph, graph: OpGraph, device) -> list[float]:
        kind, speed = device.kind, device.speed
        if tg.shared is not None:  # one task per op, all at the graph's batch
            return durations(graph, kind, speed, tg.size[0] if len(tg) else 1.0)
        ops = graph.ops
        costs = []
        for t, role in enumerate(tg.role):
            if role == "op":
                costs.append(ops[tg.base[t]].duration(kind, tg.size[t], speed))
            elif role in ("split", "concat", "sum"):
                costs.append(device.copy_seconds(tg.size[t], 0.0))  # size: bytes read + written
            else:
                costs.append(tg.duration[t])
        return costs

    def on(self, task: int, device: int) -> float:
        """Seconds ``task`` takes on device index ``device``."""
        return self.by_class[self.device_class[device]][task]


def average_link(cluster: Cluster) -> tuple[float, float]:
    """Mean latency and mean inverse bandwidth over all ordered pairs of distinct devices."""
    n = len(cluster)
    if n < 2:
        return 0.0, 0.0
    pairs = n * (n - 1)
    latency = sum(sum(row) for row in cluster.latency_matrix) / pairs
    inverse = sum(sum(row) for row in cluster.inverse_bandwidth_matrix) / pairs
    return latency, inverse


def predecessors(tg: TaskGraph) -> list[list[tuple[int, float]]]:
    """Per task, ``(producer, bytes)`` for each incoming edge (kept in ``tg.derived``: read only)."""
    preds = tg.derived.get("predecessors")
    if preds is None:
        preds = [[] for _ in range(len(tg))]
        for p, entries in enumerate(tg.outputs):
            for _, nbytes, consumers in entries:
                for c in consumers:
                    preds[c].append((p, nbytes))
        tg.derived["predecessors"] = preds
    return preds


def topological_tasks(tg: TaskGraph) -> list[int]:
    """Task ids with every producer before its consumers (depth-first, ties by task id; kept in
    ``tg.derived``: read only)."""
    order = tg.derived.get("topological")
    if order is None:
        order = tg.derived["topological"] = topological_order(task_successors(tg), tg.npreds)[0]
    return order


def task_successors(tg: TaskGraph) -> list[list[int]]:
    """Per task, its consumers, one entry per edge, in output order."""
    return [[c for _, _, consumers in entries for c in consumers] for entries in tg.outputs]


def upward_ranks(tg: TaskGraph, average: list[float], link: tuple[float, float],
                 topo: list[int] | None = None) -> list[float]:
    """``rank_u`` of every task (see the module docstring)."""
    latency, inverse = link
    topo = topological_tasks(tg) if topo is None else topo
    rank = [0.0] * len(tg)
    outputs = tg.outputs
    for t in reversed(topo):
        best = 0.0
        for _, nbytes, consumers in outputs[t]:
            comm = latency + nbytes * inverse
            for c in consumers:
                value = comm + rank[c]
                if value > best:
                    best = value
        rank[t] = average[t] + best
    return rank


def downward_ranks(tg: TaskGraph, average: list[float], link: tuple[float, float],
                   topo: list[int] | None = None) -> list[float]:
    """``rank_d`` of every task (see the module docstring)."""
    latency, inverse = link
    topo = topological_tasks(tg) if topo is None else topo
    rank = [0.0] * len(tg)
    outputs = tg.outputs
    for t in topo:
        base = rank[t] + average[t]
        for _, nbytes, consumers in outputs[t]:
            value = base + latency + nbytes * inverse
            for c in consumers:
                if value > rank[c]:
                    rank[c] = value
    return rank


def critical_path(tg: TaskGraph, upward: list[float], downward: list[float]) -> list[int]:
    """The tasks of one critical path, from an entry task to an exit task.

    Starts at the entry task of largest upward rank and follows, at each step, the
    successor with the largest ``rank_u + rank_d`` (ties: lowest id).

    Example:
        >>> from kerasflow.planner import Cluster, Op, OpGraph, Plan
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph = OpGraph([Op("a", cost={"X": 1.0}), Op("b", cost={"X": 5.0}), Op("c", cost={"X": 1.0})],
        ...                 [("a", "b", None), ("a", "c", None)])
        >>> from kerasflow.planner import Device
        >>> cluster = Cluster([Device("/D:0", "X", 1)])
        >>> tg = build_task_graph(graph, cluster, Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:0"}))
        >>> up = upward_ranks(tg, [1.0, 5.0, 1.0], (0.0, 0.0)); down = downward_ranks(tg, [1.0, 5.0, 1.0], (0.0, 0.0))
        >>> [tg.names[t] for t in critical_path(tg, up, down)]
        ['a', 'b']
    """
    entries = [t for t in range(len(tg)) if tg.npreds[t] == 0]
    if not entries:
        return []
    t = max(entries, key=lambda e: (upward[e], -e))
    path = [t]
    while True:
        best, best_value = -1, -1.0
        for _, _, consumers in tg.outputs[t]:
            for c in consumers:
                value = upward[c] + downward[c]
                if value > best_value or (value == best_value and c < best):
                    best, best_value = c, value
        if best < 0:
            return path
        path.append(best)
        t = best
