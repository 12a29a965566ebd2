"""HEFT list scheduling: upward-rank priorities, earliest-finish-time device choice.

Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 2002 — the scheduler FastT builds on.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import temporary_bytes
from ..ir.plan import Plan, Shard
from .listschedule import (
    DEFAULT_MEMORY_HEADROOM, list_schedule, memory_budgets, plan_from_schedule, scheduling_tasks,
)
from .ranks import TaskCosts, average_link, topological_tasks, upward_ranks

__all__ = ["heft"]


def heft(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
         splits: Mapping[str, Sequence[Shard]] | None = None, memory_limit: float | None = None,
         memory_headroom: float = DEFAULT_MEMORY_HEADROOM, affinity: str = "op",
         unless_slower_than: float | None = None) -> Plan | None:
    """Plans ``graph`` on ``cluster`` with HEFT (insertion-based, memory-limited).

    Args:
        graph: the step.
        cluster: the devices.
        batch_size: the batch to plan for (default: the graph's).
        splits: layers to run as shards (their shards stay on the given devices).
        memory_limit: a cap in bytes for every device.
        memory_headroom: the fraction of memory left free.
        affinity: ``"op"`` or ``"layer"`` (keep each layer's ops on one device); see
            ``list_schedule``.
        unless_slower_than: seconds: return None once the plan's simulation passes them (a
            plan that must beat another is not simulated to the end).

    Returns:
        A simulated ``Plan`` (placement, order, predicted figures), algorithm ``"heft"``
        (``"heft-layers"`` with layer affinity); None past ``unless_slower_than``.

    Raises:
        InsufficientMemoryError: some op fits no device.

    Example:
        >>> from kerasflow.planner import synthetic, Cluster
        >>> plan = heft(synthetic.inception_like(blocks=1), Cluster.preset("4xV100-nvlink"))
        >>> plan.algorithm, plan.predicted_step_time > 0
        ('heft', True)
    """
    batch = batch_size or graph.batch_size
    tg, fixed = scheduling_tasks(graph, cluster, splits, batch)
    costs = TaskCosts(tg, graph, cluster, fixed)
    upward = upward_ranks(tg, costs.average, average_link(cluster), topological_tasks(tg))
    schedule = list_schedule(tg, graph, cluster, upward, costs=costs, fixed=fixed,
                             budgets=memory_budgets(cluster, memory_limit, memory_headroom, temporary_bytes(graph)),
                             affinity=affinity)
    return plan_from_schedule(tg, graph, cluster, schedule, splits=splits, batch=batch,
                              algorithm="heft" if affinity == "op" else "heft-layers",
                              unless_slower_than=unless_slower_than)
