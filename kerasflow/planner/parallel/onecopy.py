"""Data parallelism on one copy of the weights: each device runs its share of the batch as a wave.

Classic data parallelism (``baselines.data_parallel``) keeps a copy of every weight on every
device and all-reduces the gradients. This plan keeps one copy, on the device a single-device
plan would use: the batch runs as one wave per device, launched together (no offset); wave
``w``'s stage map sends the whole model to device ``w``, which reads the weights across the
link, and each wave's gradients travel to the weights' device, where they are summed and the
update runs once. It is a plan of the one-replica runtime (placement, waves), so
``FastTStrategy`` runs it inside ``fit`` as simulated; it changes the math of a model with
ops that couple the samples of a batch (BatchNormalization) as any waves do, so the planner
tries it only where it tries waves.
"""

from __future__ import annotations

from ..errors import InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.plan import Plan
from .ticktock import with_waves

__all__ = ["one_copy_data_parallel"]


def one_copy_data_parallel(graph: OpGraph, cluster: Cluster, devices: list[str] | None = None,
                           batch: int | None = None, unless_slower_than: float | None = None) -> Plan | None:
    """One wave per device over the whole model, the weights on the first device (see the module).

    Args:
        graph, cluster: what it is for.
        devices: the devices to run waves on (default: all; the first holds the weights).
        batch: the batch (default: the graph's); each device takes an equal share.
        unless_slower_than: as for ``ticktock.with_waves``: None, unsimulated, when the busiest
            device or the longest chain of ops alone works longer.

    Raises:
        InvalidPlanError: fewer than two devices, or a device the cluster does not have.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> plan = one_copy_data_parallel(synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie"))
        >>> plan.waves.count, plan.waves.device(1, "/GPU:0"), plan.algorithm
        (2, '/GPU:1', 'one_copy_data_parallel')
    """
    devices = list(devices or cluster.device_names)
    unknown = [d for d in devices if d not in cluster.device_names]
    if len(devices) < 2 or unknown:
        raise InvalidPlanError(f"one_copy_data_parallel needs two or more of the cluster's devices "
                               f"({cluster.device_names}). Received: devices={devices}")
    home = devices[0]
    base = Plan(placement={op.name: home for op in graph.ops}, batch_size=batch)  # waves get their own order
    # Wave w's map rotates the devices by w (a stage map is a permutation): what the
    # single-device plan runs on the first device, wave w runs on device w.
    stage_maps = tuple({devices[i]: devices[(i + w) % len(devices)] for i in range(len(devices))} if w else {}
                       for w in range(len(devices)))
    return with_waves(base, graph, cluster, count=len(devices), offset="none", stage_maps=stage_maps,
                      batch=batch, algorithm="one_copy_data_parallel", unless_slower_than=unless_slower_than)
