"""Sums one value per device on every device with TensorFlow's collective all-reduce.

A data-parallel plan's gradient buffers and the whole batch's BatchNormalization statistics are
summed by ``CollectiveReduceV2``: one op per device. TensorFlow sums with NCCL only when asked:
its resolver (``CollectiveParamResolverLocal::AssignCollectiveType``,
``collective_param_resolver_local.cc``) takes NCCL when the op's ``communication_hint`` is
``"nccl"`` (or ``ConfigProto.experimental.collective_nccl`` is set) and the group's devices are
GPUs, and its own ring reducer otherwise. So ``implementation`` asks for NCCL where every device
of the group is a GPU on a card of its own (NCCL refuses two ranks on one card: logical GPUs of
one card keep the ring), as ``tf.distribute.MirroredStrategy`` users get. Every op has a timeout
(``TIMEOUT_SECONDS``: TensorFlow's default, 0, waits forever), and a group no collective can
sum (devices of two kinds, or of several tasks, which need the cluster's collective
configuration ``MultiWorkerMirroredStrategy`` sets up) is refused when the plan is put in force,
before anything is traced. Three more facts of those ops shape this module:

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
from typing import Callable, Sequence

import tensorflow as tf

from kerasflow.devices import canonical_device
from kerasflow.planner.errors import KerasflowError

__all__ = ["Collectives", "summable", "implementation", "TIMEOUT_SECONDS"]

# Seconds a sum waits for its group before it fails (then the plan is dropped for the default
# placement): far beyond any step's, so only a sum that cannot complete reaches it.
TIMEOUT_SECONDS = 300.0

# Above the keys tf.distribute hands out (it counts from 1), so a MirroredStrategy in the same
# process never shares a key with kerasflow's sums.
_FIRST_KEY = 2**20
_GROUP_KEYS: dict[tuple[str, ...], int] = {}
_INSTANCE_KEYS = itertools.count(_FIRST_KEY)


def implementation(devices: Sequence[str], gpus: Sequence | None = None) -> str:
    """The ``communication_hint`` of a sum over ``devices``: ``"nccl"`` when each is a local GPU on
    a card of its own, else ``"ring"`` (TensorFlow's own ring reducer).

    Args:
        devices: the group's devices.
        gpus: the local GPUs as ``kerasflow.devices.local_gpus()`` describes them (its default).

    Raises:
        KerasflowError: devices of several kinds (CPUs and GPUs), or of several tasks: no
            collective of this process sums over them.

    Example:
        >>> from kerasflow.devices import LocalGPU
        >>> cards = [LocalGPU(f"/GPU:{i}", f"/physical_device:GPU:{i}", "H100", 2**36, "a test") for i in range(2)]
        >>> implementation(["/GPU:0", "/GPU:1"], cards), implementation(["/CPU:0", "/CPU:1"], cards)
        ('nccl', 'ring')
        >>> one_card = [LocalGPU(f"/GPU:{i}", "/physical_device:GPU:0", "H100", 2**35, "a test") for i in range(2)]
        >>> implementation(["/GPU:0", "/GPU:1"], one_card)
        'ring'
    """
    from kerasflow.devices import device_type, local_gpus, task_of

    devices = list(devices)
    kinds = sorted({device_type(d) for d in devices})
    tasks = sorted({task_of(d) for d in devices})
    if len(kinds) > 1 or len(tasks) > 1:
        what = f"devices of the kinds {kinds}" if len(kinds) > 1 else f"devices of the tasks {tasks}"
        raise KerasflowError(
            f"A data-parallel plan's replicas must be summed by one collective group, and no group of this process "
            f"sums over {what} (several tasks need the collective configuration MultiWorkerMirroredStrategy sets "
            f"up). Received: devices={devices}. Plan with replicated='off', or put the replicas on one kind of "
            "device of one task.")
    if kinds != ["GPU"]:
        return "ring"
    cards = {gpu.name: gpu.card for gpu in (local_gpus() if gpus is None else gpus)}
    used = [cards.get(canonical_device(d)) for d in devices]
    return "nccl" if None not in used and len(set(used)) == len(used) else "ring"


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
        gpus: the local GPUs, for ``implementation`` (default: ``devices.local_gpus()``).
        timeout: seconds each sum waits for its group (``TIMEOUT_SECONDS``).

    Raises:
        KerasflowError: a group no collective sums over (``implementation``).

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

    def __init__(self, devices: list[str], creating: Callable | None = None, *, gpus: Sequence | None = None,
                 timeout: float = TIMEOUT_SECONDS):
        self.devices = list(devices)
        self.hint, self.timeout = implementation(self.devices, gpus), timeout
        creating = creating or (lambda device: contextlib.nullcontext())
        self._group_key = _GROUP_KEYS.setdefault(tuple(self.devices), _FIRST_KEY + len(_GROUP_KEYS))
        self._tokens = []
        for device in self.devices:
            with tf.init_scope(), creating(device), tf.device(device):
                self._tokens.append(tf.Variable(0.0, trainable=False, name="kerasflow_collective_order"))

    def timed_out(self, error: Exception) -> KerasflowError:
        """The error a sum of this group ends in when it waited past its timeout (TensorFlow's
        ``DeadlineExceededError``): which group, how long, and what to do.

        Example:
            >>> print(Collectives(["/CPU:0", "/CPU:1"], timeout=5.0).timed_out(RuntimeError("no peer")))
            A sum over ['/CPU:0', '/CPU:1'] (TensorFlow's ring) did not complete within 5 s: a replica never ran its part (RuntimeError: no peer). Training goes back to the default placement; plan with replicated='off' if it happens again.
        """
        from kerasflow.strategies.retreat import describe

        how = "NCCL" if self.hint == "nccl" else "TensorFlow's ring"
        return KerasflowError(f"A sum over {self.devices} ({how}) did not complete within {self.timeout:g} s: a replica "
                              f"never ran its part ({describe(error)}). Training goes back to the default placement; "
                              "plan with replicated='off' if it happens again.")

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
                    merge_op="Add", final_op="Id", communication_hint=self.hint, timeout=self.timeout,
                    ordering_token=token.handle))
        return summed
