"""A plan with what the simulator predicts for it: step time, peak memory, provenance."""

from __future__ import annotations

import dataclasses
import math

from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.plan import Plan
from .hostops import on_host
from .simulator import SimulationResult, simulate

__all__ = ["with_prediction", "with_result"]


def with_prediction(plan: Plan, graph: OpGraph, cluster: Cluster, batch: int | None = None, *,
                    unless_slower_than: float | None = None) -> Plan | None:
    """``plan`` with its predicted step time, peak memory and provenance filled in by the simulator
    (and its host-only ops on the cluster's host, ``hostops.on_host``); None once the simulation
    passes ``unless_slower_than`` seconds (``simulator.simulate_tasks``' deadline: a plan that
    must beat another is not run to the end).

    Example:
        >>> from kerasflow.planner import single_device, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> with_prediction(single_device(graph, cluster), graph, cluster).predicted_step_time > 0
        True
        >>> with_prediction(single_device(graph, cluster), graph, cluster, unless_slower_than=1e-9) is None
        True
    """
    batch = batch or plan.batch_size or graph.batch_size
    plan = on_host(plan, graph, cluster)  # as it runs: host-only ops on the host, said in the plan
    deadline = math.inf if unless_slower_than is None else unless_slower_than
    result = simulate(graph, cluster, plan, batch=batch, deadline=deadline)
    return None if result is None else with_result(plan, graph, cluster, batch, result)


def with_result(plan: Plan, graph: OpGraph, cluster: Cluster, batch: int, result: SimulationResult) -> Plan:
    """``plan`` with its predicted step time and peak memory from ``result``, a simulation of it
    at ``batch`` (``with_prediction`` without the simulation), and its provenance.

    Example:
        >>> from kerasflow.planner import single_device, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> one = single_device(graph, cluster)
        >>> batch = graph.batch_size
        >>> with_result(one, graph, cluster, batch, simulate(graph, cluster, one, batch=batch)) == with_prediction(
        ...     one, graph, cluster, batch)
        True
    """
    return dataclasses.replace(
        plan, batch_size=batch, predicted_step_time=result.makespan,
        predicted_peak_memory=dict(result.peak_memory), graph_fingerprint=graph.fingerprint(),
        cluster=cluster.name)
