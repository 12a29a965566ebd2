"""Data parallelism inside ``fit``: a copy of the weights and of the optimizer's state on every
replica's device, the all-reduce of the gradients, and one update on every copy.

A data-parallel plan (``Plan.data_parallel``) runs the step once per device on that device's
share of the batch. The first device's replica uses the model's own variables; every other
device gets a copy of each model variable (trainable and not) and of each variable the
optimizer's update writes (its slots, its iteration count, a loss scale's state). A replica is
traced with the model's and the optimizer's variables pointing at its copies (Keras 3 keeps the
TensorFlow variable behind each Keras variable in one attribute), so every op it makes reads and
writes its own device's copy.

Every replica's update is the user's own optimizer, whatever wraps it (a ``LossScaleOptimizer``
under ``mixed_float16``): what the update only reads — the learning rate and its schedule, weight
decay, clipping, every setting a callback or the user changes during or between fits — is read
from that one optimizer, as one device reads it; only its state is per replica.

The gradients are fused into buffers (``planner.sim.ring.fusion_buffers``) and each buffer is summed
by one TensorFlow collective all-reduce (``Collectives``), so every copy gets the same sum,
applies the same update and stays equal to the model's own variables. Two kinds of gradient
cannot be summed by a collective (``collectives.summable``) and go around a ring built from
TensorFlow ops (``planner.sim.ring``) instead: a sparse gradient's rows (an embedding's), which
every replica gathers, and a gradient whose shape is known only when the step runs. Keras 3
only: tf-keras variables cannot be repointed.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.sim.ring import fusion_buffers, gather_schedule, ring_chunks, ring_schedule
from kerasflow.strategies.collectives import Collectives, summable
from kerasflow.strategies.scopes import RING_SCOPE

__all__ = ["Replicas", "ring_all_reduce", "all_reduce_gradients"]


class Replicas:
    """The per-device copies of a model's variables and of its optimizer's state for a
    data-parallel plan (see the module docstring).

    Args:
        model: a compiled Keras 3 model whose optimizer is built.
        devices: the replicas' devices; the first holds the model's own variables.
        creating: a context manager factory ``f(device)`` that lets a variable be created off
            the strategy's default device.

    Raises:
        KerasflowError: a tf-keras model, or fewer than two devices.

    Example:
        >>> import keras, kerasflow
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> model.optimizer.build(model.trainable_variables)
        >>> replicas = Replicas(model, ["/CPU:0", "/CPU:1"])
        >>> with replicas.swapped(1):
        ...     print(model.layers[0].kernel.value.device.endswith("CPU:1"),
        ...           model.optimizer.iterations.value.device.endswith("CPU:1"),
        ...           model.optimizer.learning_rate.value.device.endswith("CPU:0"))  # the user's own
        True True True
    """

    def __init__(self, model, devices: list[str], creating: Callable | None = None):
        if not _compat.can_move_variables(model):
            raise KerasflowError("A data-parallel plan runs only on Keras 3 models (tf-keras variables cannot be "
                                 f"copied per device). Received: a {_compat.flavor(model)} model. Plan with "
                                 "replicated='off', or use tf.distribute.MirroredStrategy.")
        if len(devices) < 2:
            raise KerasflowError(f"A data-parallel plan needs two or more devices. Received: devices={devices}.")
        self.model, self.devices = model, list(devices)
        creating = creating or (lambda device: contextlib.nullcontext())
        self.collectives = Collectives(self.devices, creating)
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        # The model's variables, then the optimizer's state: everything a replica's step writes.
        self._variables = [v for v in _compat.model_variables(model) + _compat.optimizer_state(optimizer)
                           if _compat.is_movable(v)]
        self._copies: list[list[tf.Variable]] = [[_compat.backing_variable(v) for v in self._variables]]
        for device in self.devices[1:]:
            with tf.init_scope(), creating(device), tf.device(device):
                self._copies.append([tf.Variable(own.read_value(), trainable=v.trainable,
                                                 name=own.name.split(":")[0])
                                     for v, own in zip(self._variables, self._copies[0])])

    @contextlib.contextmanager
    def swapped(self, replica: int):
        """While inside, the model's variables and the optimizer's state are replica ``replica``'s
        copies (at trace time)."""
        if replica == 0:
            yield
            return
        self.point_at(replica)
        try:
            yield
        finally:
            self.point_at(0)

    def point_at(self, replica: int) -> None:
        """Points the model's variables and the optimizer's state at replica ``replica``'s copies
        (0: the model's own)."""
        for variable, copy in zip(self._variables, self._copies[replica]):
            _compat.set_backing_variable(variable, copy)

    def refresh(self) -> None:
        """Gives every copy the model's own values (after a step that updated only those, such
        as a step of the default placement)."""
        for copies in self._copies[1:]:
            for value, copy in zip(self._copies[0], copies):
                copy.assign(value)

    def trainable(self, replica: int) -> list[tf.Variable]:
        """Replica ``replica``'s TensorFlow variables behind the model's trainable weights, in
        ``model.trainable_variables``' order (the order of the gradients and of the update)."""
        copy_of = {id(variable): copy for variable, copy in zip(self._variables, self._copies[replica])}
        return [copy_of[id(variable)] for variable in self.model.trainable_variables]

    def apply(self, replica: int, gradients: list) -> None:
        """Replica ``replica``'s update with the summed ``gradients`` (inside ``swapped``): the
        user's optimizer, which knows each variable by the model's own copy of it."""
        own_of = {id(copy): own for copy, own in zip(self._copies[replica], self._copies[0])}
        with _compat.keyed_by(self.model.optimizer, lambda backing: own_of.get(id(backing), backing)):
            self.model.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))

    def differences(self) -> float:
        """The largest absolute difference between any copy and the model's own variables."""
        largest = 0.0
        for copies in self._copies[1:]:
            for own, copy in zip(self._copies[0], copies):
                if own.dtype.is_floating:
                    largest = max(largest, float(tf.reduce_max(tf.abs(tf.cast(own, tf.float64) -
                                                                      tf.cast(copy, tf.float64)))))
        return largest


def ring_all_reduce(tensors: list, devices: list[str]) -> list:
    """The sum of ``tensors`` (one per device, same shape) on every device, by a ring all-reduce
    built from TensorFlow ops: for the values a collective cannot sum (``collectives.summable``).

    Each ``tensors[i]`` is made on ``devices[i]``; the result's ``[i]`` is on ``devices[i]``.
    Sparse gradients are made dense first; a None (a variable without a gradient) stays None.

    Example:
        >>> parts = []
        >>> for i, device in enumerate(["/CPU:0", "/CPU:1"]):
        ...     with tf.device(device):
        ...         parts.append(tf.constant([1.0, 2.0, 3.0]) * (i + 1))
        >>> [t.numpy().tolist() for t in ring_all_reduce(parts, ["/CPU:0", "/CPU:1"])]
        [[3.0, 6.0, 9.0], [3.0, 6.0, 9.0]]
    """
    if any(t is None for t in tensors):
        return [None] * len(tensors)
    count = len(devices)
    shape = tf.shape(tensors[0])
    static = tensors[0].shape.is_fully_defined()
    chunks = ring_chunks(tensors[0].shape.num_elements(), count) if static else None
    held = []
    with tf.name_scope(RING_SCOPE):
        for tensor, device in zip(tensors, devices):
            with tf.device(device):
                flat = tf.reshape(tf.convert_to_tensor(tensor), [-1])
                held.append(tf.split(flat, chunks, axis=0) if chunks is not None else _even_split(flat, count))
        for send in ring_schedule(count):
            with tf.device(devices[send.dst]):
                received = held[send.src][send.chunk]
                held[send.dst][send.chunk] = (held[send.dst][send.chunk] + received if send.reduce
                                              else tf.identity(received))
        results = []
        for pieces, device in zip(held, devices):
            with tf.device(device):
                results.append(tf.reshape(tf.concat(pieces, axis=0), shape))
    return results


def all_reduce_gradients(per_replica: list[list], collectives: Collectives) -> list[list]:
    """Each replica's gradients (``per_replica[r][i]`` on ``collectives.devices[r]``) replaced by
    their sums, fused into buffers (``planner.sim.ring.fusion_buffers``, per dtype), one collective
    per buffer. A sparse gradient (an embedding's ``IndexedSlices``) stays sparse: every
    replica's rows are passed around a ring and joined in replica order, which is the whole
    batch's gradient as one device makes it, so the optimizer's sparse update runs as it would
    there. A gradient whose shape the trace does not know goes around a ring of its own.

    Example:
        >>> collectives = Collectives(["/CPU:0", "/CPU:1"])
        >>> @tf.function
        ... def second_replicas_sums():
        ...     first = [tf.constant([1.0, 2.0]), tf.constant([[5.0]]), None]
        ...     with tf.device("/CPU:1"):
        ...         second = [tf.constant([2.0, 4.0]), tf.constant([[5.0]]), None]
        ...     return all_reduce_gradients([first, second], collectives)[1]
        >>> [g.numpy().tolist() if g is not None else None for g in second_replicas_sums()]
        [[3.0, 6.0], [[10.0]], None]
    """
    devices = collectives.devices
    summed = [list(gradients) for gradients in per_replica]
    first = per_replica[0]
    by_dtype: dict = {}
    for i, gradient in enumerate(first):
        if gradient is None:
            continue
        if isinstance(gradient, tf.IndexedSlices):
            for r, gathered in enumerate(_ring_all_gather([gradients[i] for gradients in per_replica], devices)):
                summed[r][i] = gathered
        elif summable(gradient):
            by_dtype.setdefault(gradient.dtype, []).append(i)
        else:
            for r, total in enumerate(ring_all_reduce([gradients[i] for gradients in per_replica], devices)):
                summed[r][i] = total
    for dtype, members in by_dtype.items():
        sizes = [first[i].shape.num_elements() * dtype.size for i in members]
        for buffer in fusion_buffers(sizes):
            indices = [members[b] for b in buffer]
            flat = []
            for gradients, device in zip(per_replica, devices):
                with tf.device(device), tf.name_scope(RING_SCOPE):
                    flat.append(tf.concat([tf.reshape(gradients[i], [-1]) for i in indices], axis=0))
            with tf.name_scope(RING_SCOPE):
                totals = collectives.all_reduce(flat)
            for r, (total, device) in enumerate(zip(totals, devices)):
                with tf.device(device), tf.name_scope(RING_SCOPE):
                    pieces = tf.split(total, [first[i].shape.num_elements() for i in indices], axis=0)
                    for i, piece in zip(indices, pieces):
                        summed[r][i] = tf.reshape(piece, first[i].shape)
    return summed


def _ring_all_gather(slices: list, devices: list[str]) -> list:
    """Every replica's ``IndexedSlices`` joined in replica order, on every device: each replica's
    rows go around the ring, one hop per step."""
    count = len(devices)
    held = [{r: slices[r]} for r in range(count)]  # device -> replica -> its rows there
    with tf.name_scope(RING_SCOPE):
        for send in gather_schedule(count):
            rows = held[send.src][send.chunk]
            with tf.device(devices[send.dst]):
                held[send.dst][send.chunk] = tf.IndexedSlices(tf.identity(rows.values), tf.identity(rows.indices),
                                                              rows.dense_shape)
        gathered = []
        for position, device in enumerate(devices):
            parts = [held[position][r] for r in range(count)]
            with tf.device(device):
                gathered.append(tf.IndexedSlices(tf.concat([p.values for p in parts], axis=0),
                                                 tf.concat([p.indices for p in parts], axis=0),
                                                 parts[0].dense_shape))
    return gathered


def _even_split(flat: tf.Tensor, count: int) -> list:
    """``ring_chunks`` for a length known only when the step runs."""
    size = tf.size(flat)
    base, extra = size // count, size % count
    sizes = [base + tf.cast(i < extra, size.dtype) for i in range(count)]
    return tf.split(flat, tf.stack(sizes), num=count, axis=0)
