"""The whole batch's BatchNormalization statistics across replicas or shards, as one device computes them.

Each replica normalizes its share of the batch with the statistics of the whole batch: it sums
its share, the replicas' sums are added by a collective all-reduce (``Collectives``; a ring
built from TensorFlow ops when the layer's channels are known only when the step runs), and the mean
is that total over the whole batch's count; the variance is then summed the same way, around
the mean (two passes, as ``tf.nn.moments`` computes it on one device). Backward, the gradient
reaching each total is all-reduced the same way (a custom gradient), so every replica's
gradients are its share of the whole batch's. That makes four all-reduces of one value per
channel per layer and step, each a point where every replica waits for all the others, so the
replicas are traced in lockstep (``Lockstep``), so that each sum's collective is made for every
replica at once. ``planner.sim.taskgraph`` simulates the same four all-reduces, at the ops where one
device reduces the batch.

A split BatchNormalization layer's shards do the same within one replica (``ShardStatistics``):
each shard takes the mean of its rows on its device, the means, weighted by their rows, are
added on the first shard's device, and the total (over the whole batch's rows) is sent to every
shard; backward, the shards' gradients of each total are added there and sent back. The
simulator's split layer sends the same at the same four ops. Every shard then has the same
statistics, so only the first one updates the moving averages.
"""

from __future__ import annotations

import contextlib
import functools

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.errors import KerasflowError
from kerasflow.strategies.collectives import Collectives, summable
from kerasflow.strategies.lockstep import Lockstep
from kerasflow.strategies.replicas import ring_all_reduce
from kerasflow.strategies.scopes import BATCH_STATISTICS_SCOPE, gradient_scope

__all__ = ["synchronized_layers", "whole_batch_statistics", "ShardStatistics"]


def synchronized_layers(model) -> list:
    """The model's layers whose training statistics span the batch and that replicas compute
    together: Keras 3 BatchNormalization (and subclasses) reducing over the batch axis.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> [type(layer).__name__ for layer in synchronized_layers(model)]
        ['BatchNormalization']
    """
    return [layer for layer in _compat.all_layers(model) if _compat.is_batch_normalization(layer)]


@contextlib.contextmanager
def whole_batch_statistics(layers: list, lockstep: Lockstep, collectives: Collectives, batch):
    """While inside, each of ``layers`` computes its moments across the replicas of ``lockstep``
    (``collectives.devices[r]`` runs replica ``r``), for a whole batch of ``batch`` rows."""
    with contextlib.ExitStack() as patches:
        for layer in layers:
            patches.enter_context(_compat.overridden(layer, "_moments",
                                                     functools.partial(_moments, layer, lockstep, collectives, batch)))
        yield


class ShardStatistics:
    """The whole batch's mean and variance for the shards of a split BatchNormalization layer
    (see the module docstring), built at trace time before the shards run.

    Args:
        layer: the layer (``_compat.is_batch_normalization``).
        inputs: each shard's rows of the layer's input, in shard order.
        devices: each shard's device.
        scopes: each shard's name scope, in full (``"model/norm/shard0/"``).
        batch: the whole batch's rows.

    Example:
        >>> import keras
        >>> layer = keras.layers.BatchNormalization()
        >>> layer.build((None, 2))
        >>> x = tf.constant([[1.0, 2.0], [3.0, 6.0]])
        >>> statistics = ShardStatistics(layer, [x[:1], x[1:]], ["/CPU:0", "/CPU:0"], ["shard0/", "shard1/"], 2)
        >>> with statistics.shard(1):
        ...     y = layer(x[1:], training=True)
        >>> [round(float(v), 4) for v in y[0]]  # (3, 6) with the whole batch's mean (2, 4), variance (1, 4)
        [0.9995, 0.9999]
        >>> layer.moving_mean.numpy().tolist()  # the first shard updates it, not this one
        [0.0, 0.0]
    """

    def __init__(self, layer, inputs: list, devices: list[str], scopes: list[str], batch):
        self.layer, self.devices = layer, list(devices)
        axes = list(layer._reduction_axes)
        # Each shard's ops under "moments" in its scope, named as tf.nn.moments names the whole
        # batch's, so the plan knows them (and their gradients) and orders them as its shards'.
        self.scopes = []
        for scope in scopes:
            with tf.name_scope(scope), tf.name_scope("moments") as moments:
                self.scopes.append(moments)
        # Half-precision rows are reduced in float32, as the layer's call casts them.
        inputs = self._per_shard(lambda i: tf.cast(inputs[i], tf.float32)
                                 if inputs[i].dtype in (tf.float16, tf.bfloat16) else inputs[i])
        rows = self._per_shard(lambda i: tf.cast(tf.shape(inputs[i])[0], inputs[i].dtype), "whole/")
        whole = tf.cast(batch, inputs[0].dtype)
        means = self._whole(self._per_shard(lambda i: tf.reduce_mean(inputs[i], axes, keepdims=True, name="mean")),
                            rows, whole)
        deviations = self._per_shard(lambda i: tf.math.squared_difference(
            inputs[i], tf.stop_gradient(means[i], name="StopGradient"), name="SquaredDifference"))
        variances = self._whole(self._per_shard(
            lambda i: tf.reduce_mean(deviations[i], axes, keepdims=True, name="variance")), rows, whole)
        self.moments = self._per_shard(lambda i: (tf.squeeze(means[i], axes, name="Squeeze"),
                                                  tf.squeeze(variances[i], axes, name="Squeeze")))

    def _per_shard(self, make, scope: str = "") -> list:
        """``make(i)`` for each shard ``i``, on its device, under its "moments" scope (and ``scope``
        inside it, ending in "/")."""
        made = []
        for i, (device, moments) in enumerate(zip(self.devices, self.scopes)):
            with tf.device(device), tf.name_scope(moments + scope):
                made.append(make(i))
        return made

    def _whole(self, means: list, rows: list, whole) -> list:
        """The whole batch's mean, once per shard, from each shard's mean over its ``rows``: each
        weighted by its rows on its device, added on the first shard's (``_added_on_first``),
        the total over the ``whole`` batch's rows."""
        weighted = self._per_shard(lambda i: means[i] * rows[i], "whole/")
        totals = self._added_on_first(weighted)
        return self._per_shard(lambda i: totals[i] / whole, "whole/")

    def _added_on_first(self, parts: list) -> list:
        """``parts`` added on the first shard's device, the total once per shard; backward, the
        shards' gradients of it added there, the sum the gradient of every part."""
        @tf.custom_gradient
        def added(*values):
            total = tf.add_n(list(values))

            def gradient(*upstream):
                # The tape calls this outside every scope: its sum is named as the first shard's.
                with tf.device(self.devices[0]), tf.name_scope(gradient_scope(scope)):
                    summed = tf.add_n([g for g in upstream if g is not None])
                return [summed] * len(values)

            return [tf.identity(total) for _ in values], gradient

        with tf.device(self.devices[0]), tf.name_scope(self.scopes[0] + "whole/") as scope:
            return added(*parts)

    @contextlib.contextmanager
    def shard(self, index: int):
        """While inside, the layer's call computes shard ``index``'s rows with the whole batch's
        moments; a shard but the first leaves the moving statistics to it."""
        def moments(inputs, mask):
            if mask is not None:
                raise KerasflowError(f"A split BatchNormalization layer cannot compute the whole batch's statistics "
                                     f"with a mask yet. Received: layer={self.layer.name!r} called with a mask. Plan "
                                     "without splitting it.")
            return self.moments[index]

        with _compat.overridden(self.layer, "_moments", moments):
            with _compat.moving_statistics_kept(self.layer) if index else contextlib.nullcontext():
                yield


def _moments(layer, lockstep: Lockstep, collectives: Collectives, batch, inputs, mask):
    """The whole batch's mean and variance for the calling replica's share ``inputs``."""
    if mask is not None:
        raise KerasflowError(f"A data-parallel plan cannot compute the whole batch's statistics of a masked "
                             f"BatchNormalization yet. Received: layer={layer.name!r} called with a mask. Plan with "
                             "replicated='off'.")
    axes = list(layer._reduction_axes)
    count = tf.cast(batch, inputs.dtype)
    for axis in axes:
        if axis != 0:
            count = count * tf.cast(tf.shape(inputs)[axis], inputs.dtype)
    mean = _total(tf.reduce_sum(inputs, axes, keepdims=True), lockstep, collectives) / count
    deviation = tf.reduce_sum(tf.math.squared_difference(inputs, tf.stop_gradient(mean)), axes, keepdims=True)
    variance = _total(deviation, lockstep, collectives) / count
    return tf.squeeze(mean, axes), tf.squeeze(variance, axes)


def _total(local, lockstep: Lockstep, collectives: Collectives):
    """Every replica's ``local`` summed; its gradient, every replica's gradient summed."""

    def all_reduced(values):
        with tf.name_scope(BATCH_STATISTICS_SCOPE + "/"):  # outside any replica's scope: each op keeps its device
            if all(summable(value) for value in values):
                return collectives.all_reduce(values)
            return ring_all_reduce(values, collectives.devices)

    def other_replicas_cut(values):
        # tf.custom_gradient looks for the variables the body reads by walking back from its
        # outputs to its input; a ring (where a collective cannot sum) reaches every other
        # replica's value, and through them the whole step traced so far (quadratic in it, for
        # every call). The gradient is the custom one anyway: a StopGradient (an identity) on
        # each value ends the walk.
        cut = []
        for value, device in zip(values, collectives.devices):
            with tf.device(device), tf.name_scope(BATCH_STATISTICS_SCOPE + "/"):
                cut.append(tf.stop_gradient(value))
        return all_reduced(cut)

    @tf.custom_gradient
    def summed(value):
        def gradient(upstream):
            return lockstep.exchange(upstream, all_reduced)

        return lockstep.exchange(value, other_replicas_cut), gradient

    return summed(local)
