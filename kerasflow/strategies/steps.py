"""The plan-applying training step: split layers as shards, waves as micro-batches, then placement.

``PlannedStep`` replaces ``model.train_step``. At trace time it wraps the split layers'
``call`` (each shard of the batch runs under its device and a ``shard<i>`` name scope, the
outputs are concatenated; autodiff gives gradients equal to the unsplit layer), runs the
step — as is, or as waves — and then hands every op the trace created to the
``PlanApplier``.

Waves run the batch as micro-batches under ``wave<w>`` name scopes. Each wave's loss is
scaled by its share of the batch, so the summed gradients are the whole batch's; one
optimizer update follows, and the loss and metrics are computed for the whole batch. With
the Tick-Tock offset, a wave's forward pass starts after the previous wave's forward pass.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.profiling.capture import last_op_id
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.scopes import shard_scope, wave_scope

__all__ = ["PlannedStep", "split_call"]


def _batch_of(structure) -> tf.Tensor | int:
    first = next(t for t in tf.nest.flatten(structure) if isinstance(t, (tf.Tensor, tf.Variable)))
    static = first.shape[0]
    return static if static is not None else tf.shape(first)[0]


def _sizes(batch, fractions) -> list:
    """Shard sizes that sum to ``batch`` (static ints when the batch is static)."""
    if isinstance(batch, int):
        sizes = [int(batch * f) for f in fractions[:-1]]
        return sizes + [batch - sum(sizes)]
    sizes = [tf.cast(tf.math.floor(tf.cast(batch, tf.float32) * f), tf.int32) for f in fractions[:-1]]
    return sizes + [batch - tf.add_n(sizes) if sizes else batch]


def _slice(structure, start, size, batch):
    def cut(t):
        if isinstance(t, tf.Tensor) and t.shape.rank and (t.shape[0] == batch or t.shape[0] is None):
            return t[start:start + size] if isinstance(start, int) else tf.slice(
                t, tf.concat([[start], tf.zeros([t.shape.rank - 1], tf.int32)], 0),
                tf.concat([[size], tf.fill([t.shape.rank - 1], -1)], 0))
        return t
    return tf.nest.map_structure(cut, structure)


def split_call(original: Callable, shards) -> Callable:
    """``original`` (a layer's call) run as shards of the batch, outputs concatenated."""

    @functools.wraps(original)
    def call(*args, **kwargs):
        batch = _batch_of((args, kwargs))
        sizes = _sizes(batch, [s.fraction for s in shards])
        outputs, start = [], 0
        for i, (shard, size) in enumerate(zip(shards, sizes)):
            with tf.device(shard.device), tf.name_scope(shard_scope(i)):
                piece_args = _slice(args, start, size, batch)
                piece_kwargs = _slice(kwargs, start, size, batch)
                outputs.append(original(*piece_args, **piece_kwargs))
            start = start + size
        return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *outputs)

    return call


class PlannedStep:
    """A ``train_step`` that applies a plan at trace time (see the module docstring).

    Args:
        model: the Keras model.
        original: its own ``train_step``.
        applier: the plan applier, or None to trace without a plan (recording only).
        on_trace: called with the batch structure each time the step is traced.
        custom_step: True when the model overrides ``train_step`` (placement and order
            only: no splits or waves).
        on_batch: while no plan is applied, called with each batch the step runs on, as
            numpy values (kerasflow profiles with a real batch of the user's data: string
            inputs, lookup layers and unknown dimensions need one). None: not recorded.
    """

    def __init__(self, model, original: Callable, applier: PlanApplier | None = None,
                 on_trace: Callable[[Any], None] | None = None, custom_step: bool = False,
                 on_batch: Callable[[Any], None] | None = None):
        self.model = model
        self.original = original
        self.applier = applier
        self.on_trace = on_trace
        self.custom_step = custom_step
        self.on_batch = on_batch
        self.__name__ = "train_step"

    def __call__(self, data):
        if self.on_trace is not None:
            self.on_trace(data)
        if self.applier is None or tf.executing_eagerly():
            if self.on_batch is not None and not tf.executing_eagerly():
                _record_batch(data, self.on_batch)
            return self.original(data)
        graph = tf.compat.v1.get_default_graph()
        start = last_op_id(graph)
        plan = self.applier.plan
        patched = []
        if not self.custom_step:
            by_name = {layer.name: layer for layer in _compat.all_layers(self.model)}
            for layer_name, shards in plan.splits.items():
                layer = by_name.get(layer_name)
                if layer is None:
                    continue
                patched.append((layer, layer.__dict__.get("call")))
                object.__setattr__(layer, "call", split_call(layer.call, shards))
        try:
            if plan.waves is not None and plan.waves.count > 1 and not self.custom_step:
                outputs = self._waves(data)
            else:
                outputs = self.original(data)
        finally:
            for layer, own in patched:
                if own is None:
                    object.__delattr__(layer, "call")
                else:
                    object.__setattr__(layer, "call", own)
        new_ops = [op for op in graph.get_operations() if op._id > start]
        captures = {}
        for external, internal in getattr(graph, "captures", []):
            if external.dtype == tf.resource:
                captures[internal.op.name] = external.device
        self.applier.apply(new_ops, captures)
        return outputs

    def _waves(self, data):
        """One step as micro-batches whose scaled gradients are summed before one update."""
        model = self.model
        x, y, sample_weight = _unpack(data)
        waves = self.applier.plan.waves
        batch = _batch_of(x)
        sizes = _sizes(batch, [waves.fraction(w) for w in range(waves.count)])
        variables = model.trainable_weights
        total_gradients = None
        predictions, losses = [], []
        start = 0
        previous_forward = None
        for w, size in enumerate(sizes):
            xw, yw = _slice(x, start, size, batch), _slice(y, start, size, batch)
            sw = _slice(sample_weight, start, size, batch) if sample_weight is not None else None
            share = tf.cast(size, tf.float32) / tf.cast(batch, tf.float32)
            barrier = [previous_forward] if previous_forward is not None and waves.offset == "forward" else []
            with tf.name_scope(wave_scope(w)), tf.control_dependencies(barrier):
                with tf.GradientTape() as tape:
                    prediction = model(xw, training=True)
                    loss = _compat.compute_loss(model, xw, yw, prediction, sw)
                    scaled = tf.cast(loss, tf.float32) * share
                gradients = tape.gradient(scaled, variables)
            previous_forward = prediction if not isinstance(prediction, (list, tuple, dict)) else \
                tf.nest.flatten(prediction)[0]
            predictions.append(prediction)
            losses.append(scaled)
            total_gradients = gradients if total_gradients is None else [
                _add(t, g) for t, g in zip(total_gradients, gradients)]
            start = start + size
        model.optimizer.apply_gradients(zip(total_gradients, variables))
        prediction = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *predictions)
        return _compat.finish_step(model, x, y, prediction, sample_weight, tf.add_n(losses), batch)


def _record_batch(data, record: Callable[[Any], None]) -> None:
    """Adds an op that hands the step's batch to ``record`` as numpy values each time it runs."""
    from tensorflow.python.ops import control_flow_util

    flat = tf.nest.flatten(data)
    if not flat or not all(isinstance(t, tf.Tensor) for t in flat):
        return  # ragged or sparse inputs: profiled from zeros shaped like the batch instead
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        return  # a step Keras compiled with XLA before kerasflow turned it off: no Python ops there

    def keep(*values):
        record(tf.nest.pack_sequence_as(data, [v.numpy() for v in values]))
        return []

    with tf.device("/CPU:0"):  # host memory: the batch is copied out anyway
        tf.py_function(keep, flat, Tout=[], name="kerasflow_record_batch")


def _add(a, b):
    """Sums two gradients, sparse ones (embeddings) included."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _unpack(data):
    if isinstance(data, (list, tuple)):
        data = tuple(data)
        if len(data) == 1:
            return data[0], None, None
        if len(data) == 2:
            return data[0], data[1], None
        return data[0], data[1], data[2]
    return data, None, None
