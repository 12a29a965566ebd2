"""The buffers data parallelism sums gradients in, and the ring schedules of the values a
collective cannot sum.

Dense gradients are fused into buffers of at most ``FUSION_BUFFER_BYTES`` first (``fusion_buffers``),
and each buffer is summed by one collective all-reduce (``strategies.collectives``; the
simulator prices it as the ring algorithm runs: ``2 (D - 1)`` steps of ``1 / D`` of the buffer),
so a step pays the all-reduce's per-step costs per buffer, not per weight.

The runtime builds a ring from TensorFlow ops only for what a collective cannot sum: a value
whose shape is known only when the step runs (``ring_schedule``), and a sparse gradient's rows,
which every replica gathers (``gather_schedule``, which the simulator sends as such).

``D`` devices stand in a ring, in the order the plan lists them; position ``i`` sends only to
position ``i + 1`` (mod ``D``). The gradient is cut into ``D`` chunks. In the ``D - 1`` steps of
the reduce-scatter, position ``i`` sends chunk ``i - s`` (mod ``D``) at step ``s`` and the
receiver adds it to its own; position ``i`` then holds the whole sum of chunk ``i + 1``. In the
``D - 1`` steps of the all-gather, position ``i`` sends chunk ``i + 1 - s`` and the receiver keeps
it. Every device ends with every summed chunk, each summed once (so all copies are equal), and
each link carries ``2 (D - 1)`` chunks: ``2 (D - 1) / D`` of the gradient.

A sparse gradient (an embedding's rows) is not summed but gathered (``gather_schedule``): at
step ``s`` position ``i`` passes on the rows of replica ``i - s``, so after ``D - 1`` steps every
device holds every replica's rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["RingSend", "FUSION_BUFFER_BYTES", "fusion_buffers", "ring_chunks", "ring_schedule", "gather_schedule",
           "gather_transfers"]

# All-reduce libraries fuse gradients into buffers before reducing them (Horovod's tensor
# fusion: 64 MiB; PyTorch DDP's buckets: 25 MiB; tf.distribute's NCCL all-reduce packs the
# gradients), so the ring's per-step latency is paid per buffer, not per gradient tensor.
# Charging it per tensor made data parallelism on a high-latency network (two hosts over
# Ethernet) many times slower than measured systems are; 25 MiB is the smaller common size.
FUSION_BUFFER_BYTES = 25 * 2**20


class RingSend(NamedTuple):
    """One chunk sent from ring position ``src`` to ``dst`` in one step of the all-reduce.

    ``reduce`` is True in the reduce-scatter (the receiver adds the chunk to its own) and
    False in the all-gather (the receiver keeps it).
    """

    step: int
    src: int
    dst: int
    chunk: int
    reduce: bool


def fusion_buffers(sizes: list[float], limit: float = FUSION_BUFFER_BYTES) -> list[list[int]]:
    """The gradients (indices into ``sizes``, bytes each) fused into each buffer: first fit,
    largest first, into buffers of at most ``limit`` bytes (a larger gradient gets one of its
    own). The grouping depends only on the sizes, so the simulator, which knows the bytes of
    each gradient, and the runtime, which knows its variables, fuse alike.

    Example:
        >>> fusion_buffers([10, 60, 30, 50], limit=100)
        [[1, 2, 0], [3]]
    """
    # First fit over a tree of the buffers' free room (each node the most room below it), so a
    # step of 100k gradients finds each one's buffer in log time rather than by a scan.
    leaves = 1
    while leaves < len(sizes):
        leaves *= 2
    room = [-math.inf] * (2 * leaves)
    buffers: list[list[int]] = []
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        size = sizes[index]
        node = 1
        if room[1] >= size:
            while node < leaves:  # down to the leftmost buffer with room for it
                node = 2 * node if room[2 * node] >= size else 2 * node + 1
        else:
            node = leaves + len(buffers)
            buffers.append([])
            room[node] = limit
        buffers[node - leaves].append(index)
        room[node] -= size
        node //= 2
        while node:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return buffers


def ring_chunks(elements: int, parts: int) -> list[int]:
    """The element count of each of the ``parts`` chunks of a gradient: as even as possible,
    the first ones one larger.

    Example:
        >>> ring_chunks(10, 4)
        [3, 3, 2, 2]
    """
    base, extra = divmod(int(elements), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def ring_schedule(parts: int) -> list[RingSend]:
    """Every send of a ring all-reduce over ``parts`` positions, step by step.

    Example:
        >>> [(s.src, s.dst, s.chunk, s.reduce) for s in ring_schedule(2)]
        [(0, 1, 0, True), (1, 0, 1, True), (0, 1, 1, False), (1, 0, 0, False)]
    """
    sends = []
    for step in range(parts - 1):
        sends.extend(RingSend(step, i, (i + 1) % parts, (i - step) % parts, True) for i in range(parts))
    for step in range(parts - 1):
        sends.extend(RingSend(parts - 1 + step, i, (i + 1) % parts, (i + 1 - step) % parts, False)
                     for i in range(parts))
    return sends


def gather_schedule(parts: int) -> list[RingSend]:
    """Every send of a ring all-gather over ``parts`` positions; ``chunk`` is the replica whose
    rows are passed on.

    Example:
        >>> [(s.step, s.src, s.dst, s.chunk) for s in gather_schedule(3)][:4]
        [(0, 0, 1, 0), (0, 1, 2, 1), (0, 2, 0, 2), (1, 0, 1, 2)]
    """
    return [RingSend(step, i, (i + 1) % parts, (i - step) % parts, False)
            for step in range(parts - 1) for i in range(parts)]


def gather_transfers(devices: list[str], piece_bytes: float) -> list[tuple[str, str, float]]:
    """The ``(src device, dst device, bytes)`` of every piece a ring all-gather of one piece of
    ``piece_bytes`` per device sends.

    Example:
        >>> gather_transfers(["/CPU:0", "/CPU:1"], 96.0)
        [('/CPU:0', '/CPU:1', 96.0), ('/CPU:1', '/CPU:0', 96.0)]
    """
    return [(devices[s.src], devices[s.dst], float(piece_bytes)) for s in gather_schedule(len(devices))]
