"""Baseline plans every planner is judged against.

- ``default_placement``: what TensorFlow runs without a plan: everything on the first device, in
  data-flow order (on a CPU host, up to its inter-op threads at once: ``SharedCompute``).
- ``single_device``: everything on the fastest device, in one order.
- ``data_parallel``: every device runs the whole step on 1/D of the batch; gradients are
  ring-all-reduced (``2(D-1)/D`` x gradient bytes over the slowest link), weights
  replicated; BatchNormalization's statistics the whole batch's (one device's math) or, with
  ``synchronized=False``, each replica's own (``MirroredStrategy``'s math).
- ``layerwise_model_parallel``: layers in topological order cut into contiguous stages
  balanced by cost, one stage per device.
"""

from __future__ import annotations

import math

from ..errors import InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.plan import DataParallel, Plan
from ..sim.predict import with_prediction

__all__ = ["DEFAULT_PLACEMENT", "default_placement", "best_other_than_the_default", "single_device", "data_parallel", "layerwise_model_parallel",
           "fastest_device"]


def fastest_device(graph: OpGraph, cluster: Cluster, batch: float | None = None) -> str:
    """The device that runs the whole step fastest on its own (first on ties)."""
    batch = batch or graph.batch_size
    best, best_time = None, math.inf
    for device in cluster.devices:
        time = graph.total_work(device.kind, batch) / device.speed
        if time < best_time:
            best, best_time = device.name, time
    return best


# The default placement's name as a candidate and a plan's algorithm, written and read as this one name.
DEFAULT_PLACEMENT = "default_placement"


def default_placement(graph: OpGraph, cluster: Cluster, batch: int | None = None) -> Plan:
    """The default placement as a candidate: every op on the cluster's first device, no order.

    On devices of their own it runs one op at a time, as ``single_device`` on that device; on a
    CPU host (``SharedCompute``) its ops run side by side on the host's threads, sharing its
    cores, which is what keeps it ahead of most plans over logical CPUs.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph = synthetic.chain_mlp(layers=2)
        >>> default = default_placement(graph, Cluster.preset("logical-cpus:2"))
        >>> default.devices(), default.algorithm, default.order
        (['/CPU:0'], 'default_placement', {})
    """
    device = cluster.device_names[0]
    plan = Plan(placement={op.name: device for op in graph.ops}, batch_size=batch, algorithm=DEFAULT_PLACEMENT)
    return with_prediction(plan, graph, cluster, batch)


def best_other_than_the_default(plan: Plan) -> tuple[str, float] | None:
    """The candidate predicted fastest among ``plan.candidates`` but the default placement, and its
    predicted step (None when there is none).

    Example:
        >>> best_other_than_the_default(Plan(candidates={"default_placement": 1.0, "heft": 0.9, "cpop": 1.2}))
        ('heft', 0.9)
    """
    others = {name: seconds for name, seconds in plan.candidates.items() if name != DEFAULT_PLACEMENT}
    if not others:
        return None
    best = min(others, key=others.get)
    return best, others[best]


def single_device(graph: OpGraph, cluster: Cluster, device: str | None = None,
                  batch: int | None = None) -> Plan:
    """Every op on one device (default: the fastest), in topological order.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> plan = single_device(synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie"))
        >>> plan.devices(), plan.algorithm
        (['/GPU:0'], 'single_device')
    """
    device = device or fastest_device(graph, cluster, batch)
    cluster.device(device)
    plan = Plan(placement={op.name: device for op in graph.ops},
                order={device: graph.topological_order()}, batch_size=batch, algorithm="single_device")
    return with_prediction(plan, graph, cluster, batch)


def data_parallel(graph: OpGraph, cluster: Cluster, devices: list[str] | None = None,
                  batch: int | None = None, synchronized: bool = True) -> Plan:
    """Data parallelism over ``devices`` (default: all), with a ring all-reduce.

    Args:
        synchronized: replicas normalize with the whole batch's statistics (True: one device's
            math); False: each with its own share's, as ``MirroredStrategy`` does (algorithm
            ``data_parallel_replica_statistics``; for a graph without such layers the two are
            the same plan).

    Example:
        >>> from kerasflow.planner import synthetic
        >>> plan = data_parallel(synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-pcie"))
        >>> len(plan.data_parallel.devices)
        4
    """
    devices = list(devices or cluster.device_names)
    for device in devices:
        cluster.device(device)
    plan = Plan(data_parallel=DataParallel(tuple(devices), synchronized=synchronized), batch_size=batch,
                algorithm="data_parallel" if synchronized else "data_parallel_replica_statistics")
    return with_prediction(plan, graph, cluster, batch)


def layerwise_model_parallel(graph: OpGraph, cluster: Cluster, devices: list[str] | None = None,
                             batch: int | None = None) -> Plan:
    """Contiguous layer stages, one per device, balanced by cost.

    Layers are ordered by their first op in topological order; the cut minimises the
    most expensive stage (exact linear partition). Ops without a layer follow the layer
    of a neighbour; a colocation group follows its first member.

    Raises:
        InvalidPlanError: the graph has no layers to partition.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> plan = layerwise_model_parallel(synthetic.chain_mlp(layers=4), Cluster.preset("2xK80-pcie"))
        >>> plan.devices()
        ['/GPU:0', '/GPU:1']
    """
    devices = list(devices or cluster.device_names)
    kinds = {cluster.device(d).kind for d in devices}
    batch_value = batch or graph.batch_size
    topo = graph.topological_order()
    layer_cost: dict[str, float] = {}
    for name in topo:
        op = graph.op(name)
        if op.layer is not None:
            cost = min(op.duration(kind, batch_value) for kind in kinds)
            layer_cost[op.layer] = layer_cost.get(op.layer, 0.0) + cost
    if not layer_cost:
        raise InvalidPlanError(
            f"graph {graph.name!r} has no ops with a layer, so it cannot be cut into layer stages; "
            "profile it from a Keras model or use another planner.")
    layers = list(layer_cost)
    stages = _linear_partition([layer_cost[l] for l in layers], min(len(devices), len(layers)))
    device_of_layer = {}
    for stage, (lo, hi) in enumerate(stages):
        for layer in layers[lo:hi]:
            device_of_layer[layer] = devices[stage]
    placement = _place_by_layer(graph, topo, device_of_layer, devices[0])
    plan = Plan(placement=placement, batch_size=batch, algorithm="layerwise_model_parallel")
    return with_prediction(plan, graph, cluster, batch)


def _linear_partition(costs: list[float], parts: int) -> list[tuple[int, int]]:
    """Cuts ``costs`` into at most ``parts`` contiguous ranges minimising the largest sum.

    Binary search on the largest stage with a greedy fill: exact (to float precision)
    and O(n log) so it handles graphs of 100k ops.
    """
    def stages(cap: float) -> list[tuple[int, int]] | None:
        ranges, lo, total = [], 0, 0.0
        for i, c in enumerate(costs):
            if total + c > cap and i > lo:
                ranges.append((lo, i))
                lo, total = i, 0.0
            total += c
        ranges.append((lo, len(costs)))
        return ranges if len(ranges) <= parts else None

    low, high = max(costs, default=0.0), math.fsum(costs)
    for _ in range(100):
        if high - low <= 1e-12 * max(high, 1e-30):
            break
        middle = (low + high) / 2
        if stages(middle) is None:
            low = middle
        else:
            high = middle
    return stages(high)


def _place_by_layer(graph: OpGraph, topo: list[str], device_of_layer: dict[str, str], default: str) -> dict[str, str]:
    placement: dict[str, str] = {}
    # Forward pass: an op without a layer joins its first placed producer...
    for name in topo:
        op = graph.op(name)
        if op.layer in device_of_layer:
            placement[name] = device_of_layer[op.layer]
        else:
            preds = [placement[p] for p in graph.predecessors(name) if p in placement]
            placement[name] = preds[0] if preds else None  # type: ignore[assignment]
    # ...and a source without a layer (the input) joins its first consumer.
    for name in reversed(topo):
        if placement[name] is None:
            succs = [placement[s] for s in graph.successors(name) if placement.get(s)]
            placement[name] = succs[0] if succs else default
    group_device: dict[str, str] = {}
    for name in topo:
        group = graph.op(name).colocation
        if group is not None:
            placement[name] = group_device.setdefault(group, placement[name])
    return placement
