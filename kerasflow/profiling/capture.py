"""Traces a model's training step at a fixed batch and reads its structure.

The step is traced as ``model.train_step`` inside a fresh ``tf.function`` whose inputs have
a fixed batch size, so every tensor shape (and so every edge's bytes) is static. While
tracing, each layer's ``call`` is wrapped to record which ops it creates: that gives every
forward op its layer exactly. Backward ops (``gradient_tape/<forward scope>/...``) take the
layer of the forward scope they differentiate; update ops take the layer of the variable
they write. Captured variables become colocation groups with their reads and writes, and
an optimizer slot joins its variable's group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.ir.graph import HOST_GROUP
from kerasflow.planner.ir.graphtables import FUSED_GROUP, WEIGHT_READING_LOOPS, is_loss_op
from kerasflow.profiling.splittable import is_splittable, losses_combine_by_share

__all__ = ["CapturedStep", "CapturedOp", "capture_step", "batch_spec", "last_op_id"]

# Where Keras puts the loss computation: Keras 3 "compile_loss/...", tf-keras "loss/...".
_LOSS_SCOPES = ("compile_loss/", "loss/")

# Between the variables' paths in the name of a group of several variables that one op reads.
JOINED = "|"


# What Grappler's remapper and arithmetic optimizer and oneDNN's rewrites run as one kernel on
# CPUs and GPUs: a convolution or matmul with its bias and activation, a normalization with a
# residual Add and its activation, a tree of additions (one AddN), and a filter's gradient with
# its bias' gradient (one kernel reads the output gradient once for both). Also kept whole: a
# chain of products, which the arithmetic optimizer's MinimizeBroadcasts stage reorders (scalars
# first) only where all of it is on one device.
_FUSION_HEADS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2"})
_FUSED_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Selu", "Softplus",
                                "Gelu"})
_ADDITIONS = frozenset({"Add", "AddV2"})
# Each op Grappler regroups with a sole reader of these types, on one device: the additions of a
# tree (AddOpsRewrite, MinimizeBroadcasts), the factors of a product (MinimizeBroadcasts).
_REGROUPED_WITH = {"Add": _ADDITIONS, "AddV2": _ADDITIONS, "Mul": frozenset({"Mul"})}
_FILTER_GRADIENTS = frozenset({"Conv2DBackpropFilter", "Conv3DBackpropFilterV2",
                               "DepthwiseConv2dNativeBackpropFilter", "MatMul"})


@dataclasses.dataclass
class CapturedOp:
    """One op of the traced step, as plain data."""

    name: str
    type: str
    inputs: list[tuple[str, int]]
    control_inputs: list[str]
    output_bytes: list[float]
    output_shapes: list[tuple]
    layer: str | None = None
    phase: str = "other"
    colocation: str | None = None
    persistent_bytes: int = 0
    batch_axis: int | None = None
    flops: float = 0.0
    bytes_accessed: float = 0.0


@dataclasses.dataclass
class CapturedStep:
    """The traced step: its ops in graph order, and the function to run it."""

    ops: list[CapturedOp]
    function: Any
    batch_size: int
    synchronized_layers: list[str]  # layers whose statistics data-parallel replicas compute together

    def by_name(self) -> dict[str, CapturedOp]:
        return {op.name: op for op in self.ops}


def batch_spec(batch: Any) -> Any:
    """``tf.TensorSpec``s with the batch's exact shapes (the batch size fixed)."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), batch)


def _bytes(tensor: tf.Tensor) -> float:
    shape = tensor.shape
    if tensor.dtype == tf.resource or tensor.dtype == tf.variant or shape.rank is None:
        return 0.0
    dims = shape.as_list()
    if any(d is None for d in dims):
        return 0.0
    size = tensor.dtype.size if tensor.dtype != tf.string else 8
    return float(np.prod(dims, dtype=np.float64)) * size


def _flops(op: tf.Operation) -> float:
    """Floating-point operations of common op types, from static shapes (0 when unknown)."""
    def elements(t):
        dims = t.shape.as_list() if t.shape.rank is not None else None
        return float(np.prod(dims, dtype=np.float64)) if dims and all(d is not None for d in dims) else 0.0

    try:
        if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "_MklMatMul"):
            a = op.inputs[0].shape.as_list()
            k = a[-2] if op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x") else a[-1]
            return 2.0 * elements(op.outputs[0]) * (k or 0)
        if op.type in ("Conv2D", "DepthwiseConv2dNative"):
            kernel = op.inputs[1].shape.as_list()
            per_output = kernel[0] * kernel[1] * (kernel[2] if op.type == "Conv2D" else 1)
            return 2.0 * elements(op.outputs[0]) * per_output
        if op.type in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
            kernel_dims = op.inputs[1].shape.as_list() if op.type == "Conv2DBackpropInput" else None
            grad = op.inputs[2]
            if kernel_dims is None:
                kernel_dims = [int(x) for x in tf.get_static_value(op.inputs[1]) or []] or None
            if not kernel_dims:
                return 0.0
            return 2.0 * elements(grad) * kernel_dims[0] * kernel_dims[1] * kernel_dims[2]
    except (ValueError, TypeError, IndexError):
        return 0.0
    if op.outputs:
        return max((elements(t) for t in op.inputs), default=0.0) or elements(op.outputs[0])
    return 0.0


def _host_only(op: tf.Operation, variable_origin: dict) -> bool:
    """String ops, and ops on a resource that is no variable (a lookup table)."""
    if op.type == "Placeholder":
        return False
    if any(t.dtype == tf.string for t in list(op.inputs) + list(op.outputs)):
        return True
    return any(t.dtype == tf.resource and (t.op.name, t.value_index) not in variable_origin for t in op.inputs)


def last_op_id(graph) -> int:
    """The id of the newest op of ``graph`` (ops get increasing ids as they are created).

    Ops created after it have larger ids: that is how a trace's new ops are found.
    """
    return max(graph._nodes_by_id, default=0)


def _layer_ranges(model, patches: contextlib.ExitStack) -> list:
    """Wraps every layer's ``call``, until ``patches`` closes, to record the ops it creates (and
    whether it got a mask); returns the records."""
    records: list[tuple[int, int, Any, bool]] = []

    def wrap(layer):
        original = layer.call

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            graph = tf.compat.v1.get_default_graph()
            start = last_op_id(graph)
            try:
                return original(*args, **kwargs)
            finally:
                records.append((start, last_op_id(graph), layer, kwargs.get("mask") is not None))

        patches.enter_context(_compat.overridden(layer, "call", recorded))

    # A shared layer is listed once per model that holds it, and is wrapped once.
    for layer in {id(layer): layer for layer in _compat.all_layers(model)}.values():
        wrap(layer)
    return records


def _loss_masks(model, patches: contextlib.ExitStack) -> list[bool]:
    """Wraps the compiled loss' ``call``, until ``patches`` closes, to record whether the
    predictions it scores carry a mask; returns the records (none without a compiled loss)."""
    records: list[bool] = []
    compiled = _compat.compiled_loss(model)
    if compiled is None:
        return records
    original = compiled.call

    @functools.wraps(original)
    def recorded(y_true, y_pred, *args, **kwargs):
        records.append(_compat.carries_mask(y_pred))
        return original(y_true, y_pred, *args, **kwargs)

    patches.enter_context(_compat.overridden(compiled, "call", recorded))
    return records


def capture_step(model, batch) -> CapturedStep:
    """Traces ``model.train_step`` on ``batch``'s shapes and returns its ops as plain data.

    The steps, each a function below: trace the step with every layer call recorded; read
    every op; group each variable with the ops that take it; attribute forward ops to the
    layer call that made them and backward ops to the layer they differentiate; give update
    ops the layer of the variable they write; mark which ops may be split along the batch;
    keep each chain the graph optimizer fuses on one device.

    Args:
        model: a compiled Keras 3 or tf-keras model.
        batch: one batch as the model's ``fit`` receives it (``(x, y)`` or
            ``(x, y, sample_weight)``, tensors or arrays).

    Returns:
        A ``CapturedStep`` whose ``function`` runs the traced step on such a batch.
    """
    spec = batch_spec(batch)
    with contextlib.ExitStack() as patches, _compat.custom_gradients_forgotten():
        records = _layer_ranges(model, patches)
        masked_loss = _loss_masks(model, patches)
        function = tf.function(lambda data: _compat.run_step(model, data), autograph=False)
        concrete = function.get_concrete_function(spec)
    graph = concrete.graph
    operations = live_operations(graph.get_operations(), list(graph.outputs) + list(graph.control_outputs))
    batch_size = int(tf.nest.flatten(spec)[0].shape[0])

    # Forward ops: the innermost layer call that created them.
    layer_of_id: dict[int, str] = {}
    for start, end, layer, _ in sorted(records, key=lambda r: (r[0], -r[1])):
        for op_id in range(start + 1, end + 1):
            layer_of_id[op_id] = layer.name
    # (A masked normalization's statistics are not summed across replicas: see strategies/batchstats.py.)
    masked = {layer.name for *_, layer, with_mask in records if with_mask}
    synchronized = sorted({layer.name for *_, layer, _ in records
                           if _compat.is_batch_normalization(layer) and layer.name not in masked})
    layer_objects = {layer.name: layer for *_, layer, _ in records}

    captured = [_captured_op(op) for op in operations]
    group_layer = _colocate(captured, operations, _variable_groups(model, graph), layer_of_id)
    _assign_phases(captured, group_layer, tuple(name + "/" for name in _compat.optimizer_names(model)))
    _layers_of_updates(captured, group_layer)
    _batch_axes(captured, layer_objects, losses_combine_by_share(_compat.compiled_losses(model), any(masked_loss)))
    _fusion_groups(captured)
    return CapturedStep(captured, concrete, batch_size, synchronized)


def live_operations(operations: list[tf.Operation], outputs) -> list[tf.Operation]:
    """The ops of ``operations`` that run: those a step output or a stateful op needs.

    TensorFlow prunes the rest from a function before it runs it (an ``Identity`` Keras' optimizer
    makes and never reads, the shapes of a gradient it simplified), so the profile leaves them
    out, and the applier neither places nor reports them: the simulator would otherwise send
    tensors to ops that never run.

    Args:
        operations: a traced step's ops, in creation order.
        outputs: the tensors (and ops) the step returns or must run.
    """
    needed = {t if isinstance(t, tf.Operation) else t.op for t in outputs}
    needed |= {op for op in operations if op._is_stateful}
    stack = list(needed)
    while stack:
        op = stack.pop()
        for producer in [t.op for t in op.inputs] + list(op.control_inputs):
            if producer not in needed:
                needed.add(producer)
                stack.append(producer)
    return [op for op in operations if op in needed]


def _variable_groups(model, graph) -> dict[str, tuple[str, int]]:
    """Internal placeholder of each captured variable -> (its group, its bytes). An optimizer
    slot joins the group of the model variable it belongs to."""
    handles = {}
    for variable in _compat.model_variables(model):
        handles[id(_compat.variable_handle(variable))] = ("model", variable)
    for variable in _compat.optimizer_variables(model):
        handles.setdefault(id(_compat.variable_handle(variable)), ("optimizer", variable))
    for variable in _compat.metric_variables(model):
        handles.setdefault(id(_compat.variable_handle(variable)), ("metric", variable))
    model_paths = sorted((_compat.variable_path(v) for v in _compat.model_variables(model)), key=len, reverse=True)
    resource_group: dict[str, tuple[str, int]] = {}
    for external, internal in graph.captures:
        entry = handles.get(id(external))
        if entry is None:
            continue
        kind, variable = entry
        path = _compat.variable_path(variable)
        group = path
        if kind == "optimizer":
            flat = path.replace("/", "_")
            for model_path in model_paths:  # a slot joins the variable it belongs to
                if model_path in path or model_path.replace("/", "_") in flat:
                    group = model_path
                    break
        size = int(np.prod(variable.shape, dtype=np.int64)) * tf.as_dtype(variable.dtype).size
        resource_group[internal.op.name] = (group, size)
    return resource_group


def _captured_op(op: tf.Operation) -> CapturedOp:
    inputs = [(t.op.name, t.value_index) for t in op.inputs]
    return CapturedOp(
        name=op.name, type=op.type, inputs=inputs, control_inputs=[c.name for c in op.control_inputs],
        output_bytes=[_bytes(t) for t in op.outputs],
        output_shapes=[tuple(t.shape.as_list()) if t.shape.rank is not None else () for t in op.outputs],
        flops=_flops(op), bytes_accessed=sum(_bytes(t) for t in op.inputs) + sum(_bytes(t) for t in op.outputs))


def _colocate(captured: list[CapturedOp], operations, resource_group: dict[str, tuple[str, int]],
              layer_of_id: dict[int, str]) -> dict[str, str]:
    """Sets each op's colocation group (its variable's, or its layer's host group) and the
    forward ops' layers; returns each group's layer."""
    # Where each resource tensor comes from: a captured variable, possibly passed through a
    # loop or an identity (a While's output i is its input i). TensorFlow runs an op that
    # takes a resource on that resource's device, so such an op joins the variable's group.
    origin: dict[tuple[str, int], str] = {}
    for tf_op in operations:
        if tf_op.name in resource_group:
            origin[(tf_op.name, 0)] = resource_group[tf_op.name][0]
            continue
        for i, output in enumerate(tf_op.outputs):
            if output.dtype != tf.resource or i >= len(tf_op.inputs):
                continue
            passed = tf_op.inputs[i]
            if passed.dtype == tf.resource and (passed.op.name, passed.value_index) in origin:
                origin[(tf_op.name, i)] = origin[(passed.op.name, passed.value_index)]

    # Groups: the variable's placeholder and every op that takes the resource. An op that takes
    # several variables (a recurrent layer's While loop reads its kernels and bias every step)
    # joins their groups into one: apart, each iteration would read a variable from another device.
    joined: dict[str, str] = {}

    def root(group: str) -> str:
        while joined.get(group, group) != group:
            group = joined[group]
        return group

    layers: list[tuple[CapturedOp, str]] = []
    for op, tf_op in zip(captured, operations):
        if op.name in resource_group:
            op.colocation, op.persistent_bytes = resource_group[op.name]
            continue
        groups = list(dict.fromkeys(origin[(t.op.name, t.value_index)] for t in tf_op.inputs
                                    if t.dtype == tf.resource and (t.op.name, t.value_index) in origin))
        if groups:
            op.colocation = groups[0]
            for group in groups[1:]:
                if root(group) != root(groups[0]):
                    joined[root(group)] = root(groups[0])
        if op.colocation is None and _host_only(tf_op, origin):
            # One group per layer: a lookup layer's table ops stay together, while layer-wise
            # placement (which places whole layers) can still put layers apart.
            op.colocation = f"{HOST_GROUP}/{layer_of_id.get(tf_op._id) or ''}"
        layer = layer_of_id.get(tf_op._id)
        if layer is not None:
            op.layer, op.phase = layer, "forward"
            layers.append((op, layer))
    # A joined group is named after all its variables' paths ("a|b|c", the first read first), so
    # each variable still finds its group's device by its own path (strategies.variables).
    members: dict[str, list[str]] = {}
    for group in list(joined):
        members.setdefault(root(group), [root(group)]).append(group)
    named = {group: JOINED.join(paths) for paths in members.values() for group in paths}
    for op in captured:
        if op.colocation in named:
            op.colocation = named[op.colocation]
    group_layer: dict[str, str] = {}
    for op, layer in layers:
        if op.colocation is not None:
            group_layer.setdefault(op.colocation, layer)
    return group_layer


def _assign_phases(captured: list[CapturedOp], group_layer: dict[str, str], optimizer_scopes: tuple[str, ...]) -> None:
    """Backward ops (under the gradient tape) take the layer whose forward scope they
    differentiate; optimizer ops and variable writes are updates; losses are forward."""
    by_name = {op.name: op for op in captured}
    # Name scopes of forward ops -> layer, for the backward ops that differentiate them.
    scope_layer: dict[str, str | None] = {}
    for op in captured:
        if op.phase == "forward" and op.layer:
            parts = op.name.split("/")
            for i in range(1, len(parts) + 1):
                scope = "/".join(parts[:i])
                if scope_layer.get(scope, op.layer) != op.layer:
                    scope_layer[scope] = None
                else:
                    scope_layer[scope] = op.layer
    for op in captured:
        if op.name.startswith("gradient_tape/"):
            op.phase = "backward"
            parts = op.name[len("gradient_tape/"):].split("/")
            for i in range(len(parts), 0, -1):
                layer = scope_layer.get("/".join(parts[:i]))
                if layer:
                    op.layer = layer
                    break
        elif op.name.startswith(optimizer_scopes) or (
            op.colocation in group_layer and op.type.startswith(("Assign", "ResourceApply"))):
            op.phase = "update"
        elif op.phase != "forward" and op.name.startswith(_LOSS_SCOPES):
            op.phase = "forward"
        elif op.phase == "other" and op.inputs and all(by_name[src].phase == "backward" for src, _ in op.inputs):
            # TensorFlow sums the gradients of a tensor used several times with an AddN
            # created outside the tape's scope: a weight shared across unrolled time steps or
            # a layer called twice (the sum belongs to that layer), or a tensor feeding
            # parallel branches or a residual (glue between layers, per sample). Left as
            # "other", data parallelism would all-reduce every partial weight gradient, and
            # the waves of Tick-Tock would be gathered at every branch point.
            op.phase = "backward"
            layers = {by_name[src].layer for src, _ in op.inputs}
            op.layer = layers.pop() if len(layers) == 1 else None
    _seeds_of_layer_gradients(captured, by_name)


def _seeds_of_layer_gradients(captured: list[CapturedOp], by_name: dict) -> None:
    """The tape starts a loop's gradient with values it makes outside its scope (zeros for the
    loop outputs nothing differentiates): such an op, used only by one layer's backward ops and
    reading only that layer's values, belongs to that layer's backward pass, as each of the
    layer's shards or waves makes its own."""
    users: dict[str, list[CapturedOp]] = {}
    for op in captured:
        for source, _ in op.inputs:
            users.setdefault(source, []).append(op)
    for op in captured:
        if op.phase != "other" or op.layer is not None or not users.get(op.name):
            continue
        layers = {user.layer for user in users[op.name] if user.phase == "backward"}
        if (len(layers) == 1 and None not in layers and all(user.phase == "backward" for user in users[op.name])
                and all(by_name[source].layer in layers for source, _ in op.inputs)):
            op.phase, op.layer = "backward", layers.pop()


def _layers_of_updates(captured: list[CapturedOp], group_layer: dict[str, str]) -> None:
    """Update ops take the layer of the variable they end up writing (walk consumers backwards)."""
    by_name = {op.name: op for op in captured}
    consumers: dict[str, list[str]] = {}
    for op in captured:
        for source, _ in op.inputs:
            consumers.setdefault(source, []).append(op.name)
        for source in op.control_inputs:
            consumers.setdefault(source, []).append(op.name)
    for op in reversed(captured):
        if op.layer is not None:
            continue
        if op.colocation in group_layer:
            op.layer = group_layer[op.colocation]
        elif op.phase == "update":
            for consumer in consumers.get(op.name, ()):
                layer = by_name[consumer].layer
                if layer is not None and by_name[consumer].phase == "update":
                    op.layer = layer
                    break


def _fusion_groups(captured: list[CapturedOp]) -> None:
    """Gives each chain TensorFlow runs as one kernel (the comment above ``_FUSION_HEADS``) a
    colocation group of its own, so a plan never puts its ops on two devices.

    Split over devices, the chain runs as separate kernels that round otherwise: a HEFT plan
    that put a convolution's filter gradient and its bias gradient on two logical CPUs trained
    1.5e-8 to 3e-8 away from plain Keras in four steps, and 7e-5 on another processor, while the
    same plan with the pair on one device trained bit for bit as plain Keras does. Likewise a
    plan that put SGD's ``learning_rate * gradient`` on another device than the product that made
    a normalization's gamma gradient kept Grappler from reordering the pair's factors as it does
    for plain Keras: 1.6e-5 apart after 39 steps with oneDNN off. Ops already in a group (a
    variable's) stay in theirs.
    """
    readers: dict[tuple[str, int], list[tuple[CapturedOp, int]]] = {}
    for op in captured:
        for position, source in enumerate(op.inputs):
            readers.setdefault(tuple(source), []).append((op, position))

    def sole_reader(op: CapturedOp, types: frozenset, same_layer: bool = True) -> CapturedOp | None:
        found = readers.get((op.name, 0), [])
        if len(found) == 1 and found[0][1] in (0, 1) and found[0][0].type in types and (
                not same_layer or found[0][0].layer == op.layer):
            return found[0][0]
        return None

    def join(chain: list[CapturedOp]) -> None:
        """The chain's ops not in a group join its fused group (a new one if none has one)."""
        fused = [op.colocation for op in chain if (op.colocation or "").startswith(FUSED_GROUP + "/")]
        free = [op for op in chain if op.colocation is None]
        if len(free) + len(fused) > 1:
            group = fused[0] if fused else f"{FUSED_GROUP}/{free[0].name}"
            for op in free:
                op.colocation = group

    for op in captured:
        if op.type in _FUSION_HEADS and op.phase == "forward":
            bias = sole_reader(op, frozenset({"BiasAdd"}))
            activation = sole_reader(bias, _FUSED_ACTIVATIONS) if bias is not None else None
            join([member for member in (op, bias, activation) if member is not None])
        elif op.type.startswith("FusedBatchNorm") and op.phase == "forward":
            # Keras makes the normalization, a residual Add and the activation three layers.
            side = sole_reader(op, _ADDITIONS, same_layer=False)
            activation = sole_reader(side or op, _FUSED_ACTIVATIONS, same_layer=False)
            join([member for member in (op, side, activation) if member is not None])
        elif op.type in _REGROUPED_WITH:
            reader = sole_reader(op, _REGROUPED_WITH[op.type], same_layer=False)
            if reader is not None:
                join([op, reader])
        elif op.type == "BiasAddGrad" and op.inputs:
            filters = [reader for reader, _ in readers.get(tuple(op.inputs[0]), ())
                       if reader.type in _FILTER_GRADIENTS and reader.layer == op.layer]
            if filters:
                join([filters[0], op])


def _batch_axes(captured: list[CapturedOp], layer_objects: dict, loss_splits: bool) -> None:
    """Which ops may be split along the batch (the compiled loss' where ``loss_splits``: its
    shards' losses, weighted by their shares, sum to the batch's)."""
    for op in captured:
        if op.phase not in ("forward", "backward") or "Random" in op.type or (
                op.colocation or "").startswith(HOST_GROUP):
            continue  # random ops outside layers draw per call: never split either
        layer = layer_objects.get(op.layer)
        if op.layer is None:
            if loss_splits or not is_loss_op(op.name):
                op.batch_axis = 0  # losses and glue: per-sample work, reductions summed by the strategy
        elif is_splittable(layer) and (op.colocation is None or op.type not in WEIGHT_READING_LOOPS
                                       or _compat.can_read_weights_per_copy(layer)):
            op.batch_axis = 0  # a loop bound to its weights splits only where they can be read per shard
