"""Sums one value per device on every device with TensorFlow's collective all-reduce.

A data-parallel plan's gradient buffers and the whole batch's BatchNormalization statistics are
summed by ``CollectiveReduceV2``: one op per device, which TensorFlow runs with the
implementation it picks for the device kind (NCCL on GPUs, a ring on CPUs), as
``tf.distribute.MirroredStrategy`` users get. Three facts of those ops shape this module:

- The ops of one sum share a group key (one per set of devices) and an instance key; an
  instance keeps the shape it first ran with, and a second shape under the same key aborts
  every collective of the process. So each traced sum takes a key no other sum took
  (``_INSTANCE_KEYS``), and a value whose shape is known only when the step runs is not summed
  here (``summable``): the hand-made ring (``replicas.ring_all_reduce``) sums it.
- On each device the sums must start in one order everywhere (NCCL launches its kernels in
  that order): every op takes its device's ordering token, a variable TensorFlow's automatic
  control dependencies chain the ops through, in the order they were traced.
- Without an ordering token the local collective executor never gathers the group (measured
  here, TensorFlow 2.21: every op waits out its timeout), so the tokens are not optional.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable

import tensorflow as tf

__all__ = ["Collectives", "summable"]

# Above the keys tf.distribute hands out (it counts from 1), so a MirroredStrategy in the same
# process never shares a key with kerasflow's sums.
_FIRST_KEY = 2**20
_GROUP_KEYS: dict[tuple[str, ...], int] = {}
_INSTANCE_KEYS = itertools.count(_FIRST_KEY)


def summable(tensor) -> bool:
    """Whether a collective can sum ``tensor``: a dense tensor whose shape the trace knows.

    Example:
        >>> summable(tf.zeros([2, 3])), summable(tf.IndexedSlices(tf.zeros([1, 3]), tf.constant([0])))
        (True, False)
    """
    return not isinstance(tensor, tf.IndexedSlices) and tensor.shape.is_fully_defined()


class Collectives:
    """The collective all-reduce over a fixed list of devices (see the module docstring).

    Args:
        devices: the devices; ``all_reduce``'s ``tensors[i]`` is made on ``devices[i]``.
        creating: a context manager factory ``f(device)`` that lets a variable be created off
            the strategy's default device (for the ordering tokens).

    Example:
        >>> collectives = Collectives(["/CPU:0", "/CPU:1"])
        >>> @tf.function
        ... def summed():
        ...     parts = []
        ...     for i, device in enumerate(collectives.devices):
        ...         with tf.device(device):
        ...             parts.append(tf.constant([1.0, 2.0]) * (i + 1))
        ...     return collectives.all_reduce(parts)
        >>> [t.numpy().tolist() for t in summed()]
        [[3.0, 6.0], [3.0, 6.0]]
    """

    def __init__(self, devices: list[str], creating: Callable | None = None):
        self.devices = list(devices)
        creating = creating or (lambda device: contextlib.nullcontext())
        self._group_key = _GROUP_KEYS.setdefault(tuple(self.devices), _FIRST_KEY + len(_GROUP_KEYS))
        self._tokens = []
        for device in self.devices:
            with tf.init_scope(), creating(device), tf.device(device):
                self._tokens.append(tf.Variable(0.0, trainable=False, name="kerasflow_collective_order"))

    def all_reduce(self, tensors: list) -> list:
        """The sum of ``tensors`` (one per device, each ``summable``, same shape and dtype) on
        every device, as one collective: the result's ``[i]`` is on ``devices[i]``."""
        from tensorflow.python.ops import collective_ops

        instance_key = next(_INSTANCE_KEYS)
        summed = []
        for tensor, device, token in zip(tensors, self.devices, self._tokens):
            with tf.device(device):
                summed.append(collective_ops.all_reduce_v2(
                    tensor, group_size=len(self.devices), group_key=self._group_key, instance_key=instance_key,
                    merge_op="Add", final_op="Id", ordering_token=token.handle))
        return summed
