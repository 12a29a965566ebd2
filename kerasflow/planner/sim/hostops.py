"""``on_host``: a plan with what a cluster's host holds on that host, where TensorFlow runs it.

A string op or a lookup table's op has no GPU kernel: placed on a GPU, TensorFlow's soft
placement runs it on the CPU of that GPU's machine, and its output crosses to the GPU. The
step's batch is there too: the input pipeline hands it to the step on the host's CPU, and each
device that reads it receives its rows over the host's link, at the start of the step (kerasflow
does not copy the next step's rows ahead: docs/strategy.md). A plan made for a cluster of
accelerators (``Cluster.host`` set) says so itself: those ops (``graphtables.host_held_ops``) are
placed on the host, out of every device's order (the host runs them as they become ready), and
the simulator runs them there, their transfers over ``Cluster.host_link`` priced as any other.
"""

from __future__ import annotations

import dataclasses

from ..ir.cluster import Cluster
from ..ir.graph import Op, OpGraph
from ..ir.graphtables import host_held_ops
from ..ir.plan import Plan
from .tasknames import parse_copy_name

__all__ = ["on_host", "host_seconds"]


def on_host(plan: Plan, graph: OpGraph, cluster: Cluster) -> Plan:
    """``plan`` with the ops ``cluster.host`` holds (``host_held_ops``: host-only ops, batch inputs)
    placed there (``plan`` itself where nothing moves: no host, no such op, or each already there).

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> from kerasflow.planner.ir.graph import HOST_GROUP
        >>> graph = OpGraph([Op("x", "Placeholder", output_bytes=[(0, 64)]),
        ...                  Op("lookup", colocation=HOST_GROUP + "/lookup", output_bytes=[(0, 64)]), Op("dense")],
        ...                 [("x", "lookup", 0), ("lookup", "dense", 0)])
        >>> plan = Plan(placement={"x": "/GPU:1", "lookup": "/GPU:1", "dense": "/GPU:1"},
        ...             order={"/GPU:1": ["x", "lookup", "dense"]})
        >>> pinned = on_host(plan, graph, Cluster.preset("2xK80-pcie"))
        >>> pinned.placement["x"], pinned.placement["lookup"], pinned.order
        ('/CPU:0', '/CPU:0', {'/GPU:1': ('dense',)})
    """
    indices = host_held_ops(graph) if cluster.host is not None else ()
    if not indices:
        return plan
    host, names = cluster.host.name, {graph.ops[i].name for i in indices}
    placement = {name: host if name in names else device for name, device in plan.placement.items()}
    order = {device: tuple(task for task in tasks if parse_copy_name(task)[0] not in names)
             for device, tasks in plan.order.items()}
    if placement == plan.placement and order == plan.order:
        return plan
    return dataclasses.replace(plan, placement=placement, order={d: tasks for d, tasks in order.items() if tasks})


def host_seconds(op: Op, devices_kind: str, batch: float) -> float:
    """Seconds host-only ``op`` takes on the host at ``batch``: its cost on a CPU where the profile
    has one, else its cost for the devices' kind (a GPU's profile times it where it ran: on the host).

    Example:
        >>> round(host_seconds(Op("lookup", cost={"H100": (1e-5, 1e-7)}), "H100", 100), 9)
        2e-05
    """
    return op.duration("CPU" if "CPU" in op.cost else devices_kind, batch)
