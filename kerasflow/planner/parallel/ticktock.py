"""Tick-Tock waves (Wavelet, MLSys 2021) and GPipe-style pipelines.

A training step's memory peaks at the end of the forward pass and falls during the
backward pass. Wavelet runs the step as two waves (micro-batches): the tock wave starts
its forward pass when the tick wave has finished its forward pass, so one wave's peak
meets the other's valley. In model parallelism the tock wave runs the stages in the
reverse device order, filling the devices plain model parallelism leaves idle.

Unlike the paper's asynchronous waves, kerasflow sums both waves' gradients before one
optimizer update: a step with waves computes exactly what the whole batch would (except
in layers that couple the samples of a batch, such as BatchNormalization in training,
whose statistics then come from each micro-batch; ``batch_coupled_ops`` finds them).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import batch_ops, batch_statistics
from ..ir.plan import Plan, Waves
from ..sim.planchecks import attach_orders
from ..sim.predict import with_result
from ..sim.simulator import simulate_tasks, step_overhead
from ..sim.taskgraph import build_task_graph, busiest_device_seconds, longest_chain_seconds
from . import baselines

__all__ = ["batch_coupled_ops", "replica_coupled_ops", "with_waves", "slower_than", "tick_tock_data_parallel",
           "tick_tock_model_parallel", "pipeline"]


def batch_coupled_ops(graph: OpGraph) -> list[str]:
    """Forward and backward ops that cannot be split along the batch (their math changes
    when the batch is cut into waves or shards), e.g. BatchNormalization in training.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> batch_coupled_ops(synthetic.chain_mlp(layers=2))
        []
    """
    return [op.name for op, copied in zip(graph.ops, batch_ops(graph)) if copied and not op.splittable]


def replica_coupled_ops(graph: OpGraph) -> list[str]:
    """The batch-coupled ops whose math data-parallel replicas change: those outside the layers
    whose statistics the replicas compute together (``graphtables.batch_statistics``:
    BatchNormalization), e.g. a random layer's, or an unknown layer's.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> replica_coupled_ops(synthetic.chain_mlp(layers=2))
        []
    """
    shared = batch_statistics(graph).layer_ops
    index = graph._structure.index
    return [name for name in batch_coupled_ops(graph) if index[name] not in shared]


def with_waves(plan: Plan, graph: OpGraph, cluster: Cluster, *, count: int = 2, offset: str = "forward",
               stage_maps: tuple = (), batch: int | None = None, algorithm: str | None = None,
               unless_slower_than: float | None = None) -> Plan | None:
    """``plan`` run as ``count`` waves, with each device's order taken from the simulation.

    Args:
        plan: a placement plan (its order is replaced) or a data-parallel plan.
        graph, cluster: what it is for.
        count: the number of waves (micro-batches).
        offset: ``"forward"`` (Tick-Tock) or ``"none"`` (a pipeline).
        stage_maps: per wave, a device -> device map (the tock wave's reversed stages).
        batch: the batch (default: the plan's, then the graph's).
        algorithm: the name to record (default: the plan's, suffixed ``+waves``).
        unless_slower_than: seconds: return None, unsimulated, when the plan's busiest device
            alone works longer, or its longest chain of ops does (``slower_than``); or once its
            simulation's clock passes them (``simulate_tasks``' deadline: stopped there).

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> waved = with_waves(baselines.single_device(graph, cluster), graph, cluster)
        >>> waved.waves.count, waved.algorithm
        (2, 'single_device+waves')
        >>> with_waves(baselines.single_device(graph, cluster), graph, cluster, unless_slower_than=1e-9) is None
        True
    """
    batch = batch or plan.batch_size or graph.batch_size
    waved = dataclasses.replace(plan, order={}, waves=Waves(count, offset, tuple(stage_maps)), batch_size=batch,
                                algorithm=algorithm or f"{plan.algorithm}+waves", candidates={})
    if unless_slower_than is not None and slower_than(graph, cluster, waved, batch, unless_slower_than):
        return None
    deadline = math.inf if unless_slower_than is None else unless_slower_than
    tasks = build_task_graph(graph, cluster, waved, batch)
    result = simulate_tasks(graph, cluster, tasks, deadline=deadline)
    if result is not None and waved.data_parallel is None:
        # The order each device ran in by priority; run again in it where that could change the timeline.
        waved = dataclasses.replace(waved, order=result.start_order())
        if not result.start_order_replays:
            attach_orders(tasks, cluster, waved, causal=True)
            result = simulate_tasks(graph, cluster, tasks, deadline=deadline)
    return None if result is None else with_result(waved, graph, cluster, batch, result)


def slower_than(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float, seconds: float) -> bool:
    """Whether no simulation of ``plan`` can end within ``seconds``: its busiest device alone
    works longer (``taskgraph.busiest_device_seconds``) or its longest chain of ops does
    (``taskgraph.longest_chain_seconds``), plus the profile's step overhead. Never on shared
    compute, where a device's work is no bound.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> plan = baselines.single_device(graph, cluster)
        >>> slower_than(graph, cluster, plan, 64, 1e-9), slower_than(graph, cluster, plan, 64, 1.0)
        (True, False)
    """
    if cluster.shared:
        return False
    overhead = step_overhead(graph)
    return (busiest_device_seconds(graph, cluster, plan, batch) + overhead > seconds
            or longest_chain_seconds(graph, cluster, plan, batch) + overhead > seconds)


def tick_tock_data_parallel(graph: OpGraph, cluster: Cluster, devices: list[str] | None = None,
                            batch: int | None = None, base: Plan | None = None,
                            unless_slower_than: float | None = None) -> Plan | None:
    """Data parallelism where every device runs both waves of its shard (one all-reduce per step).

    ``base`` reuses a data-parallel plan already made for these devices; ``unless_slower_than``
    as for ``with_waves``.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> plan = tick_tock_data_parallel(synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-pcie"))
        >>> plan.waves.count, len(plan.data_parallel.devices)
        (2, 4)
    """
    base = base or baselines.data_parallel(graph, cluster, devices, batch)
    return with_waves(base, graph, cluster, batch=batch, algorithm="tick_tock_data_parallel",
                      unless_slower_than=unless_slower_than)


def _stages(graph: OpGraph, cluster: Cluster, stages: int | None, batch: int | None,
            base: Plan | None = None) -> tuple[Plan, list[str]]:
    count = stages or len(cluster)
    if not 1 <= count <= len(cluster):
        raise InvalidPlanError(f"stages must be between 1 and {len(cluster)} (the devices); received {stages!r}.")
    devices = cluster.device_names[:count]
    plan = base or baselines.layerwise_model_parallel(graph, cluster, devices, batch)
    used = set(plan.placement.values())
    return plan, [d for d in devices if d in used]


def tick_tock_model_parallel(graph: OpGraph, cluster: Cluster, stages: int | None = None,
                             batch: int | None = None, base: Plan | None = None,
                             unless_slower_than: float | None = None) -> Plan | None:
    """Layer-wise model parallelism in Tick-Tock: stage i runs on device i in the tick wave and
    on device S-1-i in the tock wave.

    Each stage's weights stay on the tick device; the tock copy reads them across the link
    and its gradient is summed with the tick's before the one update. ``unless_slower_than``
    as for ``with_waves``.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> plan = tick_tock_model_parallel(synthetic.chain_mlp(layers=4), Cluster.preset("2xK80-pcie"))
        >>> dict(plan.waves.stage_maps[1])
        {'/GPU:0': '/GPU:1', '/GPU:1': '/GPU:0'}
    """
    base, order = _stages(graph, cluster, stages, batch, base)
    reverse = {device: order[len(order) - 1 - i] for i, device in enumerate(order)}
    return with_waves(base, graph, cluster, stage_maps=({}, reverse), batch=batch,
                      algorithm="tick_tock_model_parallel", unless_slower_than=unless_slower_than)


def pipeline(graph: OpGraph, cluster: Cluster, micro_batches: int = 2, stages: int | None = None,
             batch: int | None = None) -> Plan:
    """A GPipe-style pipeline: layer-wise stages, the batch as ``micro_batches`` micro-batches
    launched together, every forward pass before the backward passes, one update.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> pipeline(synthetic.chain_mlp(layers=4), Cluster.preset("2xK80-pcie"), 4).algorithm
        'gpipe-4'
    """
    base, _ = _stages(graph, cluster, stages, batch)
    return with_waves(base, graph, cluster, count=micro_batches, offset="none", batch=batch,
                      algorithm=f"gpipe-{micro_batches}")
