"""The whole batch's BatchNormalization statistics in a data-parallel step, as one device computes them.

Each replica normalizes its share of the batch with the statistics of the whole batch: it sums
its share, the replicas' sums are added by a ring all-reduce (``ring_all_reduce``), and the mean
is that total over the whole batch's count; the variance is then summed the same way, around
the mean (two passes, as ``tf.nn.moments`` computes it on one device). Backward, the gradient
reaching each total is all-reduced the same way (a custom gradient), so every replica's
gradients are its share of the whole batch's. That makes four all-reduces of one value per
channel per layer and step, each a point where every replica waits for all the others, so the
replicas are traced in lockstep (``Lockstep``). ``planner.taskgraph`` simulates the same four
rings, at the ops where one device reduces the batch.
"""

from __future__ import annotations

import contextlib
import functools

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.errors import KerasflowError
from kerasflow.strategies.lockstep import Lockstep
from kerasflow.strategies.replicas import ring_all_reduce
from kerasflow.strategies.scopes import BATCH_STATISTICS_SCOPE

__all__ = ["synchronized_layers", "whole_batch_statistics"]


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
def whole_batch_statistics(layers: list, lockstep: Lockstep, devices: list[str], batch):
    """While inside, each of ``layers`` computes its moments across the replicas of ``lockstep``
    (``devices[r]`` runs replica ``r``), for a whole batch of ``batch`` rows."""
    with contextlib.ExitStack() as patches:
        for layer in layers:
            patches.enter_context(_compat.overridden(layer, "_moments",
                                                     functools.partial(_moments, layer, lockstep, devices, batch)))
        yield


def _moments(layer, lockstep: Lockstep, devices: list[str], batch, inputs, mask):
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
    mean = _total(tf.reduce_sum(inputs, axes, keepdims=True), lockstep, devices) / count
    deviation = tf.reduce_sum(tf.math.squared_difference(inputs, tf.stop_gradient(mean)), axes, keepdims=True)
    variance = _total(deviation, lockstep, devices) / count
    return tf.squeeze(mean, axes), tf.squeeze(variance, axes)


def _total(local, lockstep: Lockstep, devices: list[str]):
    """Every replica's ``local`` summed; its gradient, every replica's gradient summed."""

    def around_the_ring(values):
        with tf.name_scope(BATCH_STATISTICS_SCOPE + "/"):  # outside any replica's scope: each op keeps its device
            return ring_all_reduce(values, devices)

    def other_replicas_cut(values):
        # tf.custom_gradient looks for the variables the body reads by walking back from its
        # outputs to its input; the ring reaches every other replica's value, and through
        # them the whole step traced so far (quadratic in it, for every call). The gradient
        # is the custom one anyway: a StopGradient (an identity) on each value ends the walk.
        cut = []
        for value, device in zip(values, devices):
            with tf.device(device), tf.name_scope(BATCH_STATISTICS_SCOPE + "/"):
                cut.append(tf.stop_gradient(value))
        return around_the_ring(cut)

    @tf.custom_gradient
    def summed(value):
        def gradient(upstream):
            return lockstep.exchange(upstream, around_the_ring)

        return lockstep.exchange(value, other_replicas_cut), gradient

    return summed(local)
