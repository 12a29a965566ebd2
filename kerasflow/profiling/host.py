"""What this process's logical CPUs share: the host's cores and TensorFlow's inter-op threads, read from its settings.

Logical CPUs (``kerasflow.devices.virtual_cpus``) are labels on one host: their ops run on one
pool of inter-op threads, and each op spreads over as many cores as its intra-op threads allow.
``host_compute`` says so as a ``SharedCompute`` for the simulator, and ``host_lanes`` is how many
ops run at full speed side by side, which the profiler also needs to turn an op's kernel time
among others into its time alone (``xplane.shared_seconds``).
"""

from __future__ import annotations

import os
from typing import Sequence

from kerasflow.planner.ir.machine import SharedCompute

__all__ = ["host_cores", "host_lanes", "host_threads", "host_compute"]


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def host_lanes() -> int:
    """How many ops run at full speed side by side: the cores over one op's intra-op threads
    (TensorFlow's default lets an op use every core: one lane)."""
    import tensorflow as tf

    intra = tf.config.threading.get_intra_op_parallelism_threads()
    return max(1, host_cores() // intra) if intra else 1


def host_threads() -> int:
    """TensorFlow's inter-op threads: how many ops of the process run at once (its default: one
    per core)."""
    import tensorflow as tf

    return tf.config.threading.get_inter_op_parallelism_threads() or host_cores()


def host_compute(devices: Sequence[str]) -> SharedCompute:
    """The logical CPUs ``devices`` as one host's shared compute.

    Example:
        >>> host_compute(["/CPU:0", "/CPU:1"]).devices
        ('/CPU:0', '/CPU:1')
    """
    return SharedCompute(tuple(devices), host_threads(), host_lanes())
