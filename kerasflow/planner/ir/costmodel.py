"""Static op costs from FLOPs and bytes: a roofline with a per-kernel launch overhead.

Used to plan for hardware you do not have (a laptop planning for an 8-GPU server) and by
the synthetic graphs. The roofline is applied separately to the batch-independent part
and to the per-sample part of an op, so the estimate stays an ``Affine`` of the batch.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import InvalidGraphError
from .graph import Affine, OpGraph
from .hardware import DEVICE_SPECS, DeviceSpec

__all__ = ["COMPUTE_EFFICIENCY", "MEMORY_EFFICIENCY", "METADATA_OP_TYPES", "roofline", "estimate_costs"]

# Fractions of peak that well-tuned kernels reach in practice (cuDNN/cuBLAS GEMMs and
# convolutions reach 50-70 % of FP32 peak; streaming kernels 70-80 % of memory bandwidth).
COMPUTE_EFFICIENCY = 0.6
MEMORY_EFFICIENCY = 0.75

# Op types that launch no kernel: TensorFlow's executor answers them on the host or forwards
# the input buffer (constants, shapes, reshapes, identities, variable reads), so they cost
# no device time. Counting a launch for each would add ~5 us per op, tens of ms per step on
# graphs such as Inception-V3 where a third of the ops are of these types.
METADATA_OP_TYPES = frozenset({
    "BroadcastGradientArgs", "Const", "ExpandDims", "Identity", "IdentityN", "NoOp", "Placeholder",
    "Rank", "ReadVariableOp", "Reshape", "Shape", "ShapeN", "Size", "Squeeze", "StopGradient", "VarHandleOp",
})


def roofline(flops: Affine, bytes_accessed: Affine, spec: DeviceSpec) -> Affine:
    """Seconds for an op on ``spec``: launch + max(compute time, memory time), per part.

    Example:
        >>> cost = roofline(Affine(0, 2e9), Affine(0, 1e6), DEVICE_SPECS["V100"])
        >>> round(cost.per_sample * 1e3, 3)  # ms per sample: compute bound
        0.212
    """
    compute = spec.peak_flops * COMPUTE_EFFICIENCY
    memory = spec.memory_bandwidth * MEMORY_EFFICIENCY
    fixed = spec.launch_overhead + max(flops.fixed / compute, bytes_accessed.fixed / memory)
    per_sample = max(flops.per_sample / compute, bytes_accessed.per_sample / memory)
    return Affine(fixed, per_sample)


def estimate_costs(graph: OpGraph, kinds: str | Iterable[str]) -> OpGraph:
    """A copy of ``graph`` whose ops carry roofline costs for ``kinds`` (others kept).

    Ops of ``METADATA_OP_TYPES`` (constants, shapes, reshapes, identities) cost nothing:
    they launch no kernel.

    Args:
        graph: ops with ``flops`` and ``bytes_accessed`` filled in.
        kinds: a device kind or several, each a key of ``DEVICE_SPECS``.

    Raises:
        InvalidGraphError: an unknown kind.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph = estimate_costs(synthetic.chain_mlp(layers=2), "H200")
        >>> "H200" in graph.device_kinds()
        True
    """
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for kind in kinds:
        if kind not in DEVICE_SPECS:
            raise InvalidGraphError(
                f"No datasheet figures for device kind {kind!r}; known kinds: {sorted(DEVICE_SPECS)}. "
                "Add a DeviceSpec to kerasflow.planner.hardware.DEVICE_SPECS or profile on the device.")
    import dataclasses

    ops = []
    for op in graph.ops:
        cost = dict(op.cost)
        for kind in kinds:
            if op.type in METADATA_OP_TYPES:
                cost[kind] = Affine(0.0, 0.0)
            else:
                cost[kind] = roofline(op.flops, op.bytes_accessed, DEVICE_SPECS[kind])
        ops.append(dataclasses.replace(op, cost=cost))
    return OpGraph(ops, graph.edges, batch_size=graph.batch_size, name=graph.name,
                   metadata={**graph.metadata, "static_costs": sorted(set(kinds))})
