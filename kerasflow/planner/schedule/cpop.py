"""CPOP list scheduling: critical path on one device, the rest by earliest finish time.

Priority is upward + downward rank; the tasks of the critical path all go to the device
that runs the path fastest, the others to the device where they finish earliest
(Topcuoglu, Hariri and Wu, IEEE TPDS 2002). FastT's placement starts from this idea.
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
from .ranks import (
    TaskCosts, average_link, critical_path, downward_ranks, topological_tasks, upward_ranks,
)

__all__ = ["cpop"]


def cpop(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
         splits: Mapping[str, Sequence[Shard]] | None = None, memory_limit: float | None = None,
         memory_headroom: float = DEFAULT_MEMORY_HEADROOM, affinity: str = "op",
         unless_slower_than: float | None = None) -> Plan | None:
    """Plans ``graph`` on ``cluster`` with CPOP (insertion-based, memory-limited).

    Arguments, result and errors as for ``heft``; the algorithm is ``"cpop"``.

    Example:
        >>> from kerasflow.planner import synthetic, Cluster
        >>> plan = cpop(synthetic.inception_like(blocks=1), Cluster.preset("4xV100-nvlink"))
        >>> plan.algorithm
        'cpop'
    """
    batch = batch_size or graph.batch_size
    tg, fixed = scheduling_tasks(graph, cluster, splits, batch)
    costs = TaskCosts(tg, graph, cluster, fixed)
    link = average_link(cluster)
    topo = topological_tasks(tg)
    upward = upward_ranks(tg, costs.average, link, topo)
    downward = downward_ranks(tg, costs.average, link, topo)
    path = critical_path(tg, upward, downward)
    path_device = min(range(len(cluster)), key=lambda d: (sum(costs.on(t, d) for t in path), d))
    preferred = {t: path_device for t in path if fixed[t] < 0}
    priority = [u + d for u, d in zip(upward, downward)]
    schedule = list_schedule(tg, graph, cluster, priority, costs=costs, fixed=fixed, preferred=preferred,
                             budgets=memory_budgets(cluster, memory_limit, memory_headroom, temporary_bytes(graph)),
                             affinity=affinity)
    return plan_from_schedule(tg, graph, cluster, schedule, splits=splits, batch=batch,
                              algorithm="cpop" if affinity == "op" else "cpop-layers",
                              unless_slower_than=unless_slower_than)
