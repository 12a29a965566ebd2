"""The plan-applying training step: split layers as shards, waves as micro-batches, then placement.

``PlannedStep`` replaces ``model.train_step``. At trace time it wraps the split layers'
``call``: each input is cut once into shards of the batch, each shard runs under its device
and a ``shard<i>`` name scope, and the outputs are concatenated, except for the next split
layer with the same shards, which takes them shard by shard (as the simulator connects
them); autodiff gives gradients equal to the unsplit layer's. A split compiled loss (the
plan's ``LOSS_GROUP``) runs the same way, each shard's loss weighted by its share of the batch
and the weighted losses summed (``split_loss``). A split BatchNormalization layer normalizes every
shard with the whole batch's statistics, which its shards compute together, and only its first
shard updates the moving statistics (``batchstats.ShardStatistics``). Then it runs the step, as is,
as waves, or as data-parallel replicas, and hands every op of the trace that runs (TensorFlow
prunes the others) to the ``PlanApplier``. A copy (shard or wave) of a layer whose loop reads
its weights inside (an LSTM's) computes with the weights read for it, so it runs on its own
device; the ops inside loop bodies, which the applier never sees, get their loop's planned
device while they are made.

Waves run the batch as micro-batches under ``wave<w>`` name scopes. Each wave's loss is
scaled by its share of the batch, so the summed gradients are the whole batch's; one
optimizer update follows, and the loss and metrics are computed for the whole batch. With
the Tick-Tock offset, a wave's forward pass starts after the previous wave's forward pass.

Replicas (a data-parallel plan) run under ``replica<r>`` on their devices, each on its share of
the batch and its own copy of the weights (``Replicas``); a collective all-reduce sums their
gradients and each replica applies the update to its copy. Each replica updates the loss and
the metrics with its share, as ``MirroredStrategy`` does, so their values are the whole batch's.
Its BatchNormalization layers normalize with the whole batch's statistics (``batchstats``), for
which the replicas are traced in lockstep, one thread each (``Lockstep``).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.ir.graphtables import LOSS_GROUP
from kerasflow.profiling.capture import last_op_id, live_operations
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.batchstats import ShardStatistics, synchronized_layers, whole_batch_statistics
from kerasflow.strategies.in_force import InForce
from kerasflow.strategies.lockstep import Lockstep
from kerasflow.strategies.out_of_data import effects_wait_for_the_batch
from kerasflow.strategies.replicas import all_reduce_gradients
from kerasflow.strategies.scopes import (SHARD_INPUTS_SCOPE, SHARD_OUTPUTS_SCOPE, WAVES_SCOPE, replica_scope, shard_scope,
                                         wave_scope)

__all__ = ["PlannedStep", "split_call", "split_loss"]


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
    """The rows ``start:start + size`` of every batch tensor in ``structure``.

    A strided slice, so each piece keeps its static shape past the batch dimension even
    when the batch size is a tensor (Keras' layers choose their code paths by static shape).
    """
    def cut(t):
        if isinstance(t, tf.Tensor) and t.shape.rank and (t.shape[0] == batch or t.shape[0] is None):
            return t[start:start + size]
        return t
    return tf.nest.map_structure(cut, structure)


class _ShardChains:
    """The shards of each split layer's output in one trace, so that the next split layer with
    the same shard map takes them directly, shard to shard on their devices, as the simulator
    connects them; only another consumer reads the concatenated output (unused, TensorFlow
    prunes it from the step).

    Example:
        >>> chains = _ShardChains()
        >>> whole = tf.constant([[1.0], [2.0]])
        >>> chains.record(whole, [whole[:1], whole[1:]], (("/CPU:0", 0.5), ("/CPU:1", 0.5)))
        >>> [float(p[0, 0]) for p in chains.pieces_of(whole, (("/CPU:0", 0.5), ("/CPU:1", 0.5)))]
        [1.0, 2.0]
        >>> chains.pieces_of(whole, (("/CPU:0", 0.5),)) is None
        True
    """

    def __init__(self):
        self._pieces: dict = {}

    def record(self, joined, pieces: list, signature: tuple) -> None:
        """Remembers that each tensor of ``joined`` is the concatenation of ``pieces``'."""
        for i, tensor in enumerate(tf.nest.flatten(joined)):
            if isinstance(tensor, tf.Tensor):
                self._pieces[tensor.ref()] = (signature, [tf.nest.flatten(p)[i] for p in pieces])

    def pieces_of(self, tensor, signature: tuple | None = None) -> list | None:
        """The shards ``tensor`` was concatenated from (under ``signature``, when given), else None."""
        if not isinstance(tensor, tf.Tensor):
            return None
        known = self._pieces.get(tensor.ref())
        return known[1] if known is not None and signature in (None, known[0]) else None

    def cut(self, structure, signature: tuple, sizes: list, batch) -> list:
        """``structure`` as one structure per shard: each batch tensor cut once into rows of
        ``sizes`` (one op, where it was made), or taken as the shards it was joined from under
        ``signature``; other values as they are."""
        def pieces(t):
            chained = self.pieces_of(t, signature)
            return _Pieces(chained) if chained is not None else _split(t, sizes, batch)

        cut = tf.nest.map_structure(pieces, structure)
        return [tf.nest.map_structure(lambda p, i=i: p.parts[i] if isinstance(p, _Pieces) else p, cut)
                for i in range(len(sizes))]


class _Pieces:
    """One input's shards (a leaf for ``tf.nest``, unlike a list)."""

    def __init__(self, parts: list):
        self.parts = parts


def _split(t, sizes, batch):
    """``t`` cut into rows of ``sizes`` (one op, where ``t`` was made), or ``t`` when it has no batch rows."""
    if isinstance(t, tf.Tensor) and t.shape.rank and (t.shape[0] == batch or t.shape[0] is None):
        return _Pieces(tf.split(t, sizes, axis=0))
    return t


def split_call(original: Callable, shards, chains: _ShardChains | None = None,
               weights_read_here: Callable[[], Any] | None = None,
               statistics: Callable[[list, list[str], list[str], Any], ShardStatistics] | None = None) -> Callable:
    """``original`` (a layer's call) run as shards of the batch, outputs concatenated.

    Each input is cut once, under ``shard_inputs``, into its shards; an input that is a previous
    split layer's output under the same shard map is taken shard by shard from ``chains`` instead.
    ``weights_read_here``, when given, makes a context inside which the layer computes with its
    weights read by each shard on its device (a recurrent loop that reads its weights inside
    would otherwise run where they live). ``statistics``, when given (a BatchNormalization
    layer), makes the whole batch's statistics from each shard's input rows, devices and name
    scopes and the batch (``ShardStatistics``), which every shard then normalizes with.
    """
    chains = chains if chains is not None else _ShardChains()
    signature = tuple((s.device, s.fraction) for s in shards)

    @functools.wraps(original)
    def call(*args, **kwargs):
        batch = _batch_of((args, kwargs))
        sizes = _sizes(batch, [s.fraction for s in shards])
        with tf.name_scope(SHARD_INPUTS_SCOPE):
            per_shard = chains.cut((args, kwargs), signature, sizes, batch)
        scopes = []
        for i in range(len(shards)):
            with tf.name_scope(shard_scope(i)) as scope:  # each shard's scope, entered again by its full name
                scopes.append(scope)
        together = None
        if statistics is not None:
            rows = [piece_args[0] if piece_args else piece_kwargs["inputs"] for piece_args, piece_kwargs in per_shard]
            together = statistics(rows, [s.device for s in shards], scopes, batch)
        outputs = []
        for i, shard in enumerate(shards):
            piece_args, piece_kwargs = per_shard[i]
            with tf.device(shard.device), tf.name_scope(scopes[i]), contextlib.ExitStack() as inside:
                if weights_read_here is not None:
                    inside.enter_context(weights_read_here())
                if together is not None:
                    inside.enter_context(together.shard(i))
                outputs.append(original(*piece_args, **piece_kwargs))
        with tf.name_scope(SHARD_OUTPUTS_SCOPE):
            joined = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *outputs)
        chains.record(joined, outputs, signature)
        return joined

    return call


def split_loss(original: Callable, shards, chains: _ShardChains, counting: Callable[[Any], Any]) -> Callable:
    """``original`` (the compiled loss' ``call(y_true, y_pred, sample_weight)``) run as shards of
    the batch: each shard's loss, an average over its rows, weighted by its share of the batch,
    and the weighted losses summed (the profile marks the loss splittable only where that sum is
    the batch's loss: ``splittable.losses_combine_by_share``).

    The inputs are cut as ``split_call`` cuts a layer's: predictions that a split layer with the
    same shards made are taken shard by shard. ``counting(share)`` makes a context inside which
    the loss' own trackers count a shard's update as its share of one (``loss_trackers_counting``).
    """
    signature = tuple((s.device, s.fraction) for s in shards)

    @functools.wraps(original)
    def call(y_true, y_pred, sample_weight=None):
        batch = _batch_of(y_pred)
        sizes = _sizes(batch, [s.fraction for s in shards])
        with tf.name_scope(SHARD_INPUTS_SCOPE):
            per_shard = chains.cut((y_true, y_pred, sample_weight), signature, sizes, batch)
            shares = [tf.cast(size, tf.float32) / tf.cast(batch, tf.float32) for size in sizes]
        values = []
        for i, shard in enumerate(shards):
            with tf.device(shard.device), tf.name_scope(shard_scope(i)), counting(shares[i]):
                values.append(original(*per_shard[i]))
        with tf.name_scope(SHARD_OUTPUTS_SCOPE):
            return tf.add_n([value * tf.cast(share, value.dtype) for value, share in zip(values, shares)])

    return call


def _with_weights_read_here(original: Callable, reads: Callable[[], Any]) -> Callable:
    """``original`` (a layer's call) computing with its weights read where it runs: a wave's
    copy of a recurrent loop runs on the wave's device, as the simulator copies it."""
    @functools.wraps(original)
    def call(*args, **kwargs):
        with reads():
            return original(*args, **kwargs)

    return call


class _DeviceInsideFunctions:
    """The device function of a planned trace: the step's own ops keep theirs (the applier
    places them once the step is traced); an op inside a loop's or a branch's body, which the
    applier never sees, gets its planned device now (a device function, unlike a device name,
    reaches into the bodies TensorFlow builds, the gradient loops of tape.gradient included),
    unless a device scope already gave it one.

    Every graph made inside the trace copies the device stack, and TensorFlow keeps some of those
    graphs for the life of the process (a ``tf.custom_gradient`` registers its gradient function,
    which holds the graph it was traced in, in a global registry). So this holds only the applier
    (the plan's tables, no model) and the step's graph weakly: a bound method of the step kept
    every model trained under a plan alive.
    """

    def __init__(self, step_graph, applier: PlanApplier):
        self._step_graph = weakref.ref(step_graph)
        self._applier = applier

    def __call__(self, op) -> str:
        if op.device or op.graph is self._step_graph():
            return op.device
        return self._applier.device_inside_loop(op.name) or ""


class PlannedStep:
    """A ``train_step`` that applies a plan at trace time (see the module docstring).

    Args:
        model: the Keras model.
        original: its own ``train_step``.
        in_force: the plan in force (``InForce``: the plan, its applier and, for a data-parallel
            plan, the per-device copies its replicas run on), or None to trace without a plan
            (recording only).
        on_trace: called with the batch structure each time the step is traced.
        custom_step: True when the model overrides ``train_step`` (placement and order
            only: no splits or waves).
        on_batch: while no plan is applied, called with each batch the step runs on, as
            eager tensors (kerasflow profiles with a real batch of the user's data: string
            inputs, lookup layers and unknown dimensions need one). None: not recorded.
    """

    def __init__(self, model, original: Callable, in_force: InForce | None = None,
                 on_trace: Callable[[Any], None] | None = None, custom_step: bool = False,
                 on_batch: Callable[[Any], None] | None = None):
        self.model = model
        self.original = original
        self.in_force = in_force
        self.on_trace = on_trace
        self.custom_step = custom_step
        self.on_batch = on_batch
        self.__name__ = "train_step"

    def __call__(self, data):
        # The step's gradients are taken inside its trace; the only replica's sum of them is no op.
        with _compat.custom_gradients_forgotten(), _compat.one_replica_sums_forwarded():
            return self._step(data)

    def _step(self, data):
        if self.on_trace is not None:
            self.on_trace(data)
        if self.in_force is None or tf.executing_eagerly():
            if self.on_batch is not None and not tf.executing_eagerly():
                _record_batch(data, self.on_batch)
            return self.original(data)
        graph = tf.compat.v1.get_default_graph()
        start = last_op_id(graph)
        plan, applier = self.in_force.plan, self.in_force.applier
        chains = _ShardChains()
        with contextlib.ExitStack() as patches:
            if not self.custom_step:
                self._patch_layers(plan, patches, chains)
            with graph.device(_DeviceInsideFunctions(graph, applier)):
                if plan.data_parallel is not None:
                    outputs = self._replicated(data)
                elif plan.waves is not None and plan.waves.count > 1 and not self.custom_step:
                    outputs = self._waves(data, chains)
                else:
                    outputs = self.original(data)
        returned = [t for t in tf.nest.flatten(outputs) if isinstance(t, (tf.Tensor, tf.Operation))]
        new_ops = live_operations([op for op in graph.get_operations() if op._id > start], returned)
        captures = {}
        for external, internal in getattr(graph, "captures", []):
            if external.dtype == tf.resource:
                captures[internal.op.name] = external.device
        applier.apply(new_ops, captures)
        effects_wait_for_the_batch(data, new_ops)
        return outputs

    def _patch_layers(self, plan, patches: contextlib.ExitStack, chains: _ShardChains) -> None:
        """Wraps the ``call`` of the plan's split layers (as shards), of the compiled loss when the
        plan splits it (``LOSS_GROUP``) and, when the step runs as waves, of the layers whose loops
        read their weights (read where each wave runs), until ``patches`` closes after the trace."""
        by_name = {layer.name: layer for layer in _compat.all_layers(self.model)}
        bound = self.in_force.applier.weight_bound_layers
        waves = plan.waves is not None and plan.waves.count > 1 and plan.data_parallel is None
        for layer_name in sorted(set(plan.splits) | (bound if waves else set())):
            layer = by_name.get(layer_name)
            if layer is None:
                continue
            reads = functools.partial(_compat.weights_read_here, layer) if layer_name in bound else None
            statistics = functools.partial(ShardStatistics, layer) if _compat.is_batch_normalization(layer) else None
            call = (split_call(layer.call, plan.splits[layer_name], chains, reads, statistics)
                    if layer_name in plan.splits else _with_weights_read_here(layer.call, reads))
            patches.enter_context(_compat.overridden(layer, "call", call))
        compiled = _compat.compiled_loss(self.model)
        if LOSS_GROUP in plan.splits and compiled is not None:
            counting = functools.partial(_compat.loss_trackers_counting, self.model)
            patches.enter_context(_compat.overridden(
                compiled, "call", split_loss(compiled.call, plan.splits[LOSS_GROUP], chains, counting)))

    def _waves(self, data, chains: _ShardChains):
        """One step as micro-batches whose scaled gradients are summed before one update."""
        model = self.model
        x, y, sample_weight = _compat.unpack_x_y_sample_weight(data)
        batch = _batch_of(x)
        variables = model.trainable_weights
        predictions, losses, gradients = self._micro_batches(x, y, sample_weight, batch, batch, variables, chains)
        with tf.name_scope(WAVES_SCOPE):
            prediction = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *predictions)
            loss = tf.add_n(losses)
        _compat.track_loss(model, loss, x)
        model.optimizer.apply_gradients(zip(gradients, variables))
        return _compat.step_metrics(model, x, y, prediction, sample_weight)

    def _micro_batches(self, x, y, sample_weight, size, whole, variables, chains: _ShardChains | None = None):
        """The plan's waves over ``size`` rows (of a batch of ``whole``): each wave's predictions,
        its loss scaled by its share of ``whole``, and the sum of the scaled gradients.

        With the Tick-Tock offset, a wave starts once the previous wave's prediction is made: its
        shards, where a split output layer made it (``chains``), so that the joined prediction,
        which a split loss does not read, is not made for the barrier alone."""
        model, waves = self.model, self.in_force.plan.waves
        chains = chains if chains is not None else _ShardChains()
        count = waves.count if waves is not None else 1
        sizes = _sizes(size, [waves.fraction(w) for w in range(count)] if count > 1 else [1.0])
        total_gradients, predictions, losses = None, [], []
        start, previous_forward = 0, []
        for w, part in enumerate(sizes):
            # The waves' own bookkeeping (slices, shares, sums) under one scope of its own, so
            # it shifts none of the names the profiled step's ops have (the plan names them).
            with tf.name_scope(WAVES_SCOPE):
                xw, yw, sw = _slice((x, y, sample_weight), start, part, size)
                share = tf.cast(part, tf.float32) / tf.cast(whole, tf.float32)
            barrier = previous_forward if waves is not None and waves.offset == "forward" else []
            scope = tf.name_scope(wave_scope(w)) if count > 1 else contextlib.nullcontext()
            with scope, tf.control_dependencies(barrier):
                with tf.GradientTape() as tape:
                    prediction = model(xw, training=True)
                    with _compat.loss_trackers_counting(model, share):
                        loss = _compat.compute_loss(model, xw, yw, prediction, sw)
                    scaled = tf.cast(loss, tf.float32) * share
                    for_gradients = _compat.loss_for_gradients(model, scaled)
                gradients = tape.gradient(for_gradients, variables)
            made = tf.nest.flatten(prediction)[0]
            previous_forward = chains.pieces_of(made) or [made]
            predictions.append(prediction)
            losses.append(scaled)
            with tf.name_scope(WAVES_SCOPE):
                total_gradients = gradients if total_gradients is None else [
                    _add(t, g) for t, g in zip(total_gradients, gradients)]
            start = start + part
        return predictions, losses, total_gradients

    def _replicated(self, data):
        """One data-parallel step: each replica runs its share of the batch (as waves, when the
        plan has them) on its own copy of the weights, a collective sums the gradients, and every
        replica applies the same update; the loss and metrics are updated replica by replica.
        With the whole batch's BatchNormalization statistics, the replicas are traced in lockstep."""
        model, replicas = self.model, self.in_force.replicas
        x, y, sample_weight = _compat.unpack_x_y_sample_weight(data)
        batch = _batch_of(x)
        devices = replicas.devices
        sizes = _sizes(batch, [1.0 / len(devices)] * len(devices))
        starts = [sum(sizes[:r]) for r in range(len(devices))]
        # Each replica's rows are cut where the batch is (outside every replica's scope, so the
        # plan does not move the cut), and only they are copied to the replica's device.
        with tf.device(_held_on(x)), tf.name_scope(WAVES_SCOPE):
            shares = [_slice((x, y, sample_weight), starts[r], sizes[r], batch) for r in range(len(devices))]

        def replica(r):
            with tf.device(devices[r]), tf.name_scope(replica_scope(r)), replicas.swapped(r):
                xr, yr, sr = shares[r]
                variables = model.trainable_weights if r == 0 else replicas.trainable(r)
                return (xr, yr, sr, sizes[r]) + self._micro_batches(xr, yr, sr, sizes[r], batch, variables)

        synchronized = synchronized_layers(model) if self.in_force.plan.synchronizes_statistics else []
        if synchronized:
            lockstep = Lockstep(len(devices), on_turn=replicas.point_at)
            with whole_batch_statistics(synchronized, lockstep, replicas.collectives, batch):
                per_replica = lockstep.run([functools.partial(replica, r) for r in range(len(devices))])
            replicas.point_at(0)
        else:
            per_replica = [replica(r) for r in range(len(devices))]
        summed = all_reduce_gradients([gradients for *_, gradients in per_replica], replicas.collectives)
        for r, device in enumerate(devices):
            with tf.device(device), tf.name_scope(replica_scope(r)), replicas.swapped(r):
                replicas.apply(r, summed[r])
        for r, (xr, yr, sr, size, predictions, losses, _) in enumerate(per_replica):
            with tf.device(devices[r]), tf.name_scope(replica_scope(r)):
                with tf.name_scope(WAVES_SCOPE):
                    prediction = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *predictions)
                    own_mean = tf.math.divide_no_nan(tf.add_n(losses) * tf.cast(batch, tf.float32), tf.cast(size, tf.float32))
                _compat.track_loss(model, own_mean, xr)
                metrics = _compat.step_metrics(model, xr, yr, prediction, sr)
        return metrics


def _held_on(x) -> str:
    """The device that holds the batch ``x``: its first tensor's, when the trace placed it, else
    the host's CPU, where the input pipeline hands batches to the step."""
    placed = [t.device for t in tf.nest.flatten(x) if isinstance(t, tf.Tensor) and t.device]
    return placed[0] if placed else "/CPU:0"


def _record_batch(data, record: Callable[[Any], None]) -> None:
    """Adds an op that hands the step's batch to ``record`` as numpy values each time it runs."""
    from tensorflow.python.ops import control_flow_util

    flat = tf.nest.flatten(data)
    if not flat or not all(isinstance(t, tf.Tensor) for t in flat):
        return  # ragged or sparse inputs: profiled from zeros shaped like the batch instead
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        return  # a step Keras compiled with XLA before kerasflow turned it off: no Python ops there

    def keep(*values):
        record(tf.nest.pack_sequence_as(data, list(values)))
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
