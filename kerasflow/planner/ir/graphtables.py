"""Per-graph tables the planner's modules read again and again, built once and memoised.

A graph never changes, so what depends only on it (and on a batch size or a device class) is
computed on first use and kept in the graph's structure cache: which ops are batch ops and
which are folded into constants, its colocation groups (and those of a variable), the task
tables of a plan without copies, and op durations per device class.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import InvalidGraphError
from .graph import OpGraph

__all__ = ["BATCH_PHASES", "WEIGHT_READING_LOOPS", "STATISTICS_LAYERS", "BatchStatistics", "batch_ops",
           "batch_statistics", "shardable_ops", "folded_ops", "variable_groups", "weight_bound_layers",
           "colocation_groups", "static_tables", "durations", "LOSS_GROUP", "split_groups", "is_loss_op", "group_ops",
           "gradient_sums", "gradient_sum_readers", "layer_readers", "FUSED_GROUP", "fused_ops", "REFUSED_BATCHES",
           "refused_batch_sizes", "TEMPORARY_MEMORY", "temporary_bytes", "host_ops", "batch_inputs", "host_held_ops"]

BATCH_PHASES = ("forward", "backward")

# Loops that take a variable's handle and read it inside (a recurrent layer's time loop, and
# its gradient): they compute on the batch, so they are copied per shard, wave and replica
# like any batch op; a copy away from the variable computes with the weights read for it
# and sent to its device (the runtime's ``weights_read_here``).
WEIGHT_READING_LOOPS = frozenset({"While", "StatelessWhile"})


# The pseudo-layer of the compiled loss: its ops (and their gradients) sit outside every layer,
# under Keras 3's ``compile_loss`` name scope, and are split along the batch as one layer. No
# Keras layer can be named so (a TensorFlow name scope cannot start with "<").
LOSS_GROUP = "<loss>"
# The colocation groups of chains TensorFlow runs as one kernel (a convolution with its bias and
# activation, a filter's gradient with its bias' gradient, a tree of additions or of products:
# the profile's ``capture._fusion_groups``), each named ``FUSED_GROUP/<its first op>``; no plan
# puts their ops apart, and the applier orders no other op between them.
FUSED_GROUP = "kerasflow:fused"
_LOSS_SCOPE = "compile_loss/"
_GRADIENT_PREFIX = "gradient_tape/"


def split_groups(graph: OpGraph) -> list[str | None]:
    """Per op, the layer whose split copies it: its own layer; ``LOSS_GROUP`` for an op of the
    compiled loss (or of its gradient) outside every layer; for a sum of a tensor's gradients
    outside every layer, the layer whose backward pass alone reads it (``gradient_sums``); else None.

    Example:
        >>> from kerasflow.planner import Op
        >>> graph = OpGraph([Op("dense/MatMul", layer="dense"), Op("compile_loss/mean/Sum"),
        ...                  Op("gradient_tape/compile_loss/mean/Tile"), Op("AddN")], [])
        >>> split_groups(graph)
        ['dense', '<loss>', '<loss>', None]
    """
    structure = graph._structure
    cached = structure.cache.get("split_groups")
    if cached is None:
        cached = [op.layer if op.layer is not None else LOSS_GROUP if is_loss_op(op.name) else None
                  for op in graph.ops]
        for i in _gradient_sum_candidates(graph):
            readers = {cached[c] for k, consumers in structure.outputs[i] if k >= 0 for c in consumers}
            if len(readers) == 1:
                cached[i] = readers.pop()
        structure.cache["split_groups"] = cached
    return cached


def _is_tape_sum(op) -> bool:
    """Whether ``op`` sums a tensor's gradients as the tape does: an ``AddN`` named outside every
    scope, in the backward pass (the profiler gives it a layer when all it sums is the layer's)."""
    return op.type == "AddN" and op.phase == "backward" and "/" not in op.name


def _gradient_sum_candidates(graph: OpGraph) -> list[int]:
    """The tape's sums of a tensor's gradients (``_is_tape_sum``) outside every layer."""
    return [i for i, op in enumerate(graph.ops) if op.layer is None and _is_tape_sum(op)]


def gradient_sums(graph: OpGraph) -> list[int]:
    """The tape's sums of a tensor's gradients that belong to a layer (``split_groups``): the
    layer that made the tensor, whose backward pass alone reads the sum (the ``AddN`` of a
    residual connection's two gradients).

    When the layer is split, the runtime sums the gradients shard by shard where a layer reading
    the tensor took its shards directly (a split layer with the same shards), and sums the whole
    gradient of the joined tensor otherwise (``planchecks.resolve_plan`` decides which).

    Example:
        >>> from kerasflow.planner import Op
        >>> def backward(name, layer=None, type=""):
        ...     return Op(name, type=type, layer=layer, phase="backward", output_bytes=[4])
        >>> graph = OpGraph([backward("gradient_tape/a/MatMul", "a"), backward("gradient_tape/b/MatMul", "b"),
        ...                  backward("AddN", type="AddN"), backward("gradient_tape/stem/MatMul", "stem")],
        ...                 [("gradient_tape/a/MatMul", "AddN", 0), ("gradient_tape/b/MatMul", "AddN", 0),
        ...                  ("AddN", "gradient_tape/stem/MatMul", 0)])
        >>> gradient_sums(graph), split_groups(graph)[2]
        ([2], 'stem')
    """
    groups = split_groups(graph)
    return [i for i in _gradient_sum_candidates(graph) if groups[i] is not None]


def gradient_sum_readers(graph: OpGraph) -> dict[str, frozenset[str]]:
    """Each of the tape's sums of gradients that belong to a layer (``gradient_sums``, and those the
    profiler put in the layer that made all they sum), by name -> the names of the ops that read
    it: what the runtime knows a traced sum by, since TensorFlow numbers the sums by position
    and a split layer's shards add some.

    Example:
        >>> from kerasflow.planner import Op
        >>> backward = lambda name, layer=None: Op(name, type="AddN" if layer is None else "",
        ...                                         layer=layer, phase="backward", output_bytes=[4])
        >>> graph = OpGraph([backward("gradient_tape/a/x", "a"), backward("AddN"), backward("gradient_tape/b/x", "b")],
        ...                 [("gradient_tape/a/x", "AddN", 0), ("AddN", "gradient_tape/b/x", 0)])
        >>> gradient_sum_readers(graph)
        {'AddN': frozenset({'gradient_tape/b/x'})}
    """
    outputs, ops, groups = graph._structure.outputs, graph.ops, split_groups(graph)
    return {op.name: frozenset(ops[c].name for k, consumers in outputs[i] if k >= 0 for c in consumers)
            for i, op in enumerate(ops) if _is_tape_sum(op) and groups[i] is not None}


def layer_readers(graph: OpGraph) -> dict[str, frozenset[str]]:
    """Each split group (``split_groups``) -> the other groups whose forward ops read its forward
    ops' outputs: the layers that take a layer's output.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> sorted(layer_readers(synthetic.chain_mlp(layers=2))["dense_0"])
        ['dense_1']
    """
    structure = graph._structure
    cached = structure.cache.get("layer_readers")
    if cached is None:
        groups, ops = split_groups(graph), graph.ops
        readers: dict[str, set[str]] = {}
        for p, outputs in enumerate(structure.outputs):
            if groups[p] is None or ops[p].phase != "forward":
                continue
            for k, consumers in outputs:
                for c in consumers:
                    if k >= 0 and groups[c] not in (None, groups[p]) and ops[c].phase == "forward":
                        readers.setdefault(groups[p], set()).add(groups[c])
        cached = structure.cache["layer_readers"] = {g: frozenset(r) for g, r in readers.items()}
    return cached


def is_loss_op(name: str) -> bool:
    """Whether an op outside every layer named ``name`` computes the compiled loss or its gradient.

    Example:
        >>> is_loss_op("gradient_tape/compile_loss/mse/sub"), is_loss_op("compile_metrics/Mean")
        (True, False)
    """
    return name.removeprefix(_GRADIENT_PREFIX).startswith(_LOSS_SCOPE)


def group_ops(graph: OpGraph) -> dict[str, list[int]]:
    """Each split group (``split_groups``) -> the indices of its ops, in op order.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> group_ops(synthetic.chain_mlp(layers=1))["loss"]
        [4]
    """
    groups: dict[str, list[int]] = {}
    for i, group in enumerate(split_groups(graph)):
        if group is not None:
            groups.setdefault(group, []).append(i)
    return groups


def batch_ops(graph: OpGraph) -> list[bool]:
    """Which ops run once per sample slice (copied per wave, shard and replica).

    Forward and backward ops are, except those colocated with a variable (reads of the
    weights): they run once and send the weights to every copy. A loop that reads its
    variables inside (``WEIGHT_READING_LOOPS``) is a batch op all the same.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph = synthetic.chain_mlp(layers=1)
        >>> [op.name for op, copied in zip(graph.ops, batch_ops(graph)) if copied][:2]
        ['dense_0/MatMul', 'loss/SoftmaxCrossEntropy']
    """
    cached = graph._structure.cache.get("batch_ops")
    if cached is None:
        anchored = variable_groups(graph)
        cached = [
            op.phase in BATCH_PHASES and not op.persistent_bytes
            and (op.colocation not in anchored or op.type in WEIGHT_READING_LOOPS)
            for op in graph.ops
        ]
        graph._structure.cache["batch_ops"] = cached
    return cached


# Op types with state or side effects: TensorFlow's graph optimizer never folds them.
_NEVER_FOLDED = ("Random", "Variable", "Resource", "Assign", "Iterator", "Placeholder", "Py", "While", "If",
                 "Case", "PartitionedCall", "Stateful", "TensorList", "TensorArray", "Stack", "Queue", "Print",
                 "Assert", "Save", "Restore", "Lookup", "Table", "Collective", "Send", "Recv", "Seed")


STATISTICS_LAYERS = "synchronized_layers"  # the profile's metadata key: layers with whole-batch statistics


# The profile's metadata key: batch sizes the model refused while it was profiled (a model built for
# one batch size, whose layers reshape with it), so that no plan hands a device another batch.
REFUSED_BATCHES = "refused_batch_sizes"


def refused_batch_sizes(graph: OpGraph) -> tuple[int, ...]:
    """The batch sizes the model refused while it was profiled (``metadata["refused_batch_sizes"]``),
    smallest first; empty when it took every size tried or the graph does not say.

    Raises:
        InvalidGraphError: the metadata holds something other than a list of positive counts.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph = synthetic.chain_mlp(layers=1)
        >>> refused_batch_sizes(graph), refused_batch_sizes(OpGraph(graph.ops, graph.edges,
        ...                                                          metadata={"refused_batch_sizes": [25]}))
        ((), (25,))
    """
    sizes = graph.metadata.get(REFUSED_BATCHES) or []
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                              for s in sizes):
        raise InvalidGraphError(f"The profile's metadata[{REFUSED_BATCHES!r}] must be a list of batch sizes (positive "
                                f"whole numbers) the model refused. Received: {sizes!r:.80}. Fix or remove it.")
    return tuple(sorted(sizes))


# The profile's metadata key: the step's temporary memory, which no op's tensors show (a GPU's
# kernel workspaces): its measured peak beyond the modelled one. Every device keeps it free.
TEMPORARY_MEMORY = "temporary_bytes"


def temporary_bytes(graph: OpGraph) -> float:
    """The step's temporary memory in bytes (``metadata["temporary_bytes"]``; 0 when absent).

    Raises:
        InvalidGraphError: the metadata holds something other than a non-negative number.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> temporary_bytes(synthetic.chain_mlp(layers=1))
        0.0
    """
    value = graph.metadata.get(TEMPORARY_MEMORY, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidGraphError(f"The profile's metadata[{TEMPORARY_MEMORY!r}] must be a non-negative number of bytes. "
                                f"Received: {value!r:.80}. Fix or remove it.")
    return float(value)


class BatchStatistics(NamedTuple):
    """The ops of the layers whose statistics span the batch (BatchNormalization in training),
    which data-parallel replicas, or the shards of a split layer, can compute together: the
    profile lists them in ``metadata["synchronized_layers"]``.

    Attributes:
        layer_ops: every op of those layers (by index).
        reductions: those that reduce the batch (a batch op reading a value that grows with
            the batch, none of its outputs growing with it): forward, each layer's sum and sum
            of squared deviations; backward, the two sums of the gradient over the batch.
        updates: the batch ops of those layers that only update their moving statistics (each
            op's readers are updates or such ops): a split layer's shards share one statistic,
            so one shard, the first, updates it.
    """

    layer_ops: frozenset
    reductions: frozenset
    updates: frozenset = frozenset()


def batch_statistics(graph: OpGraph) -> BatchStatistics:
    """The ops of the graph's layers with whole-batch statistics (see ``BatchStatistics``).

    Raises:
        InvalidGraphError: ``metadata["synchronized_layers"]`` is not a list of names.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> batch_statistics(synthetic.chain_mlp(layers=2)).layer_ops
        frozenset()
    """
    layers = graph.metadata.get(STATISTICS_LAYERS) or []
    if not isinstance(layers, list) or not all(isinstance(name, str) for name in layers):
        raise InvalidGraphError(f"The profile's metadata[{STATISTICS_LAYERS!r}] must be a list of layer names (the "
                                f"BatchNormalization layers kerasflow's profiler found). Received: "
                                f"{STATISTICS_LAYERS}={layers!r}. Fix or remove it.")
    ops, structure = graph.ops, graph._structure
    key = ("batch_statistics", tuple(sorted(layers)))  # the metadata is the graph's, the cache its structure's
    if key in structure.cache:
        return structure.cache[key]
    layers = set(layers)
    copied = batch_ops(graph)
    layer_ops = frozenset(i for i, op in enumerate(ops) if op.layer in layers)
    reads_the_batch = set()
    for p, outputs in enumerate(structure.outputs):
        for k, consumers in outputs:
            if k >= 0 and ops[p].output_bytes[k].scales_with_batch:
                reads_the_batch.update(c for c in consumers if c in layer_ops)
    reductions = frozenset(
        i for i in reads_the_batch
        if copied[i] and ops[i].output_bytes and not any(b.scales_with_batch for b in ops[i].output_bytes))
    updates: set[int] = set()
    for i in reversed(structure.topo):
        readers = [c for k, consumers in structure.outputs[i] for c in consumers]
        if (i in layer_ops and copied[i] and ops[i].phase == "forward" and readers
                and all(ops[c].phase == "update" or c in updates for c in readers)):
            updates.add(i)
    structure.cache[key] = BatchStatistics(layer_ops, reductions, frozenset(updates))
    return structure.cache[key]


def shardable_ops(graph: OpGraph) -> list[bool]:
    """Per op, whether its batch can be cut into shards that compute what it computes: its
    samples are independent (``Op.splittable``), or it is an op of a layer whose statistics the
    shards compute together (``batch_statistics``: their sums added and the total sent back).

    Example:
        >>> from kerasflow.planner import Op
        >>> mean = Op("norm/moments/mean", type="Mean", layer="norm", phase="forward", output_bytes=[4])
        >>> graph = OpGraph([mean], [])
        >>> shardable_ops(graph), shardable_ops(OpGraph([mean], [], metadata={"synchronized_layers": ["norm"]}))
        ([False], [True])
    """
    together = batch_statistics(graph).layer_ops
    return [op.splittable or i in together for i, op in enumerate(graph.ops)]


def folded_ops(graph: OpGraph) -> list[bool]:
    """Which ops TensorFlow's graph optimizer computes before the step runs (constant folding):
    constants, and ops without state that read only such values (the loss's gradient seed,
    broadcast to the batch). A chain of them becomes one constant where its last op is placed:
    nothing passes between them, and its value is sent to the ops that read it as any other.

    Example:
        >>> from kerasflow.planner import Op
        >>> out = {"output_bytes": [4]}
        >>> graph = OpGraph([Op("one", "Const", **out), Op("batch", "Placeholder", **out), Op("tiled", "Tile", **out),
        ...                  Op("scaled", "Mul")], [("one", "tiled", 0), ("batch", "scaled", 0), ("tiled", "scaled", 0)])
        >>> folded_ops(graph)
        [True, False, True, False]
    """
    structure = graph._structure
    cached = structure.cache.get("folded")
    if cached is None:
        sources: list[list[int]] = [[] for _ in graph.ops]
        for i, outputs in enumerate(structure.outputs):
            for k, consumers in outputs:
                if k >= 0:  # data, not control
                    for c in consumers:
                        sources[c].append(i)
        cached = [False] * len(graph.ops)
        for i in structure.topo:
            op = graph.ops[i]
            cached[i] = op.type == "Const" or bool(
                sources[i] and not op.persistent_bytes and op.colocation is None
                and not any(word in op.type for word in _NEVER_FOLDED)
                and all(cached[source] for source in sources[i]))
        structure.cache["folded"] = cached
    return cached


def weight_bound_layers(graph: OpGraph) -> set[str]:
    """Layers with a batch op colocated with a variable (a loop that reads its weights inside):
    where a copy of such a layer runs away from its variables, the weights are read for it.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> weight_bound_layers(synthetic.chain_mlp(layers=1))
        set()
    """
    anchored = variable_groups(graph)
    return {op.layer for op, copied in zip(graph.ops, batch_ops(graph))
            if copied and op.layer is not None and op.colocation in anchored}


def variable_groups(graph: OpGraph) -> frozenset[str]:
    """The colocation groups that hold a variable (an op with persistent bytes): the variable,
    its reads and its updates, as opposed to groups of host work such as string ops.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> sorted(variable_groups(synthetic.chain_mlp(layers=1)))
        ['dense_0/kernel']
    """
    cached = graph._structure.cache.get("variable_groups")
    if cached is None:
        cached = frozenset(op.colocation for op in graph.ops if op.persistent_bytes and op.colocation)
        graph._structure.cache["variable_groups"] = cached
    return cached


def fused_ops(graph: OpGraph) -> frozenset[str]:
    """The ops of every fused chain (``FUSED_GROUP``): ones a plan's order leaves out.

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> fused = FUSED_GROUP + "/mm"
        >>> graph = OpGraph([Op("mm", "MatMul", colocation=fused), Op("bias", "BiasAdd", colocation=fused),
        ...                  Op("out", "Identity")], [("mm", "bias", None), ("bias", "out", None)])
        >>> sorted(fused_ops(graph))
        ['bias', 'mm']
    """
    cached = graph._structure.cache.get("fused")
    if cached is None:
        cached = frozenset(op.name for op in graph.ops if (op.colocation or "").startswith(FUSED_GROUP + "/"))
        graph._structure.cache["fused"] = cached
    return cached


def host_ops(graph: OpGraph) -> frozenset[int]:
    """The indices of the ops only a host can run (``Op.host_only``).

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> from kerasflow.planner.ir.graph import HOST_GROUP
        >>> host_ops(OpGraph([Op("dense/MatMul"), Op("lookup/Find", colocation=HOST_GROUP + "/lookup")], []))
        frozenset({1})
    """
    cached = graph._structure.cache.get("host_ops")
    if cached is None:
        cached = graph._structure.cache["host_ops"] = frozenset(i for i, op in enumerate(graph.ops) if op.host_only)
    return cached


def batch_inputs(graph: OpGraph) -> frozenset[int]:
    """The indices of the step's batch inputs: placeholders whose outputs grow with the batch
    (the rows the input pipeline hands the step), as opposed to a variable's handle.

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> batch_inputs(OpGraph([Op("x", "Placeholder", output_bytes=[(0, 256)]),
        ...                       Op("handle", "Placeholder", output_bytes=[8])], []))
        frozenset({0})
    """
    cached = graph._structure.cache.get("batch_inputs")
    if cached is None:
        cached = graph._structure.cache["batch_inputs"] = frozenset(
            i for i, op in enumerate(graph.ops)
            if op.type == "Placeholder" and any(b.scales_with_batch for b in op.output_bytes))
    return cached


def host_held_ops(graph: OpGraph) -> frozenset[int]:
    """The indices of the ops a cluster's host (``Cluster.host``) holds: those only it can run
    (``host_ops``) and the batch inputs (``batch_inputs``), which the input pipeline hands the
    step on the host's CPU.

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> from kerasflow.planner.ir.graph import HOST_GROUP
        >>> sorted(host_held_ops(OpGraph([Op("x", "Placeholder", output_bytes=[(0, 256)]), Op("dense/MatMul"),
        ...                               Op("lookup/Find", colocation=HOST_GROUP + "/lookup")], [])))
        [0, 2]
    """
    cached = graph._structure.cache.get("host_held")
    if cached is None:
        cached = graph._structure.cache["host_held"] = host_ops(graph) | batch_inputs(graph)
    return cached


def colocation_groups(graph: OpGraph) -> list[tuple[str, list[int]]]:
    """(group, op indices) for every colocation group of more than one op."""
    cached = graph._structure.cache.get("colocation")
    if cached is None:
        groups: dict[str, list[int]] = {}
        for i, op in enumerate(graph.ops):
            if op.colocation is not None:
                groups.setdefault(op.colocation, []).append(i)
        cached = [(g, m) for g, m in groups.items() if len(m) > 1]
        graph._structure.cache["colocation"] = cached
    return cached


def static_tables(graph: OpGraph, batch: float) -> dict:
    """The task tables of a plan without copies (one task per op) at ``batch``, but for the
    devices and durations: shared by every such plan of the graph (never mutated)."""
    key = ("static", batch)
    cached = graph._structure.cache.get(key)
    if cached is not None:
        return cached
    ops = graph.ops
    s = graph._structure
    n = len(ops)
    out_sizes = [tuple(b.fixed + b.per_sample * batch for b in op.output_bytes) for op in ops]
    folded = folded_ops(graph)
    outputs = []
    for i in range(n):
        entries = []
        for k, consumers in s.outputs[i]:
            inside = [c for c in consumers if folded[i] and folded[c]]  # folded away together
            read = [c for c in consumers if not (folded[i] and folded[c])]
            entries += [(k, out_sizes[i][k] if k >= 0 else 0.0, read)] if read else []
            entries += [(k, 0.0, inside)] if inside else []
        outputs.append(entries)
    rank = [0] * n
    for position, i in enumerate(s.topo):
        rank[i] = position
    minus = [-1] * n
    table = {
        "names": [op.name for op in ops],
        "base": list(range(n)),
        "role": ["op"] * n,
        "outputs": outputs,
        "out_sizes": out_sizes,
        "temp": [op.temp_bytes.fixed + op.temp_bytes.per_sample * batch for op in ops],
        "persistent": [float(op.persistent_bytes) for op in ops],
        "npreds": [len(p) for p in s.preds],
        "wave": minus, "replica": minus, "shard": minus,
        "priority": rank,
        "size": [float(batch)] * n,
        "memory_tables": None,
        "derived": {},
    }
    graph._structure.cache[key] = table
    return table


def durations(graph: OpGraph, kind: str, speed: float, batch: float) -> list[float]:
    """Every op's seconds on a device of ``kind`` and ``speed`` at ``batch``."""
    key = ("durations", kind, speed, batch)
    cached = graph._structure.cache.get(key)
    if cached is None:
        cached = [op.duration(kind, batch, speed) for op in graph.ops]
        graph._structure.cache[key] = cached
    return cached
