"""``kerasflow.testbed``: devices that share no compute, on one machine — a TensorFlow task per core, one thread each, joined by gRPC over loopback.

Logical CPUs of one process share its cores and thread pools, so no plan can beat the default
placement on them. GPUs do not: each runs one kernel stream of its own, and tensors cross
between them over a link. The testbed builds that regime here. ``start(tasks)`` makes this
process task 0 of a TensorFlow cluster, pinned to its first core with one intra-op and one
inter-op thread, and starts every other task as a worker process (``python -m
kerasflow.worker --core C --threads 1``) pinned to a core of its own; the tasks join over
TensorFlow's gRPC runtime on loopback. Each task's CPU is then a device that runs one op at a
time, as a GPU's stream does, and a tensor sent to another task crosses a real link, whose
latency and bandwidth ``start`` measures from device-side timing (``profiling.links``). The
devices are of their own kind, ``TESTBED_KIND``: the simulator, the calibration and the trusted
gain (``strategies.verdict``) keep their figures apart from logical CPUs'.

    import kerasflow
    testbed = kerasflow.testbed.start(tasks=2)      # first thing: before TensorFlow starts
    strategy = kerasflow.FastTStrategy(devices=testbed.devices, cluster=testbed.cluster)
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, epochs=3)        # the default placement: everything on task 0

Everything runs on this machine's cores and nothing else: this process (the Keras loop, the
input pipeline, task 0's ops) on the first, each other task on its own. ``stop()`` (also run at
exit) stops the workers; a worker also stops by itself once this process is gone, however it
ended, so none outlives it. Connecting changes TensorFlow's context for good: this process's
own task (its port) ends with the process. Linux only (``os.sched_setaffinity``).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.ir.cluster import Cluster, Device

__all__ = ["Testbed", "start", "TESTBED_KIND"]

# The cost kind of a testbed task's CPU: one core, one op at a time. Its own kind, so that its
# profiles, calibration and trusted gain are never a logical CPU's.
TESTBED_KIND = "CPU-core"
_JOB = "worker"
# The share of a transfer's time each task's core spends copying it (``Cluster.core_share``): all
# of it, measured (a matmul chain on a task took as much longer as a 16 MiB transfer to or from
# it took; docs/planner.md, "Devices that share nothing").
CORE_SHARE = 1.0


@dataclasses.dataclass
class Testbed:
    """The tasks ``start`` made.

    Attributes:
        devices: each task's CPU, task 0's (this process) first, in TensorFlow's full names.
        cluster: the ``Cluster`` to plan for: the devices (kind ``TESTBED_KIND``) and the
            loopback links measured between them.
        cores: the core each task runs on, in the devices' order.
        addresses: each task's ``host:port`` on loopback, in the devices' order.
        processes: the worker processes (tasks 1 and up).

    Example:
        >>> testbed = kerasflow.testbed.start(tasks=2)  # doctest: +SKIP
        >>> testbed.devices  # doctest: +SKIP
        ['/job:worker/replica:0/task:0/device:CPU:0', '/job:worker/replica:0/task:1/device:CPU:0']
    """

    devices: list[str]
    cluster: Cluster | None
    cores: list[int]
    addresses: list[str]
    processes: list[subprocess.Popen]

    def stop(self) -> None:
        """Stops every worker (waits for each to end; kills one that does not within 10 s)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(tasks: int = 2, *, timeout: float = 60.0) -> Testbed:
    """Starts the testbed (see the module docstring): ``tasks`` tasks, this process the first.

    Call it first thing, before TensorFlow starts in this process (as
    ``devices.virtual_cpus``): its threads are set to one each and it joins the cluster.

    Args:
        tasks: how many tasks, at least 2 and at most the cores this process may use.
        timeout: seconds to wait for each worker to serve, and for the cluster to connect.

    Returns:
        The ``Testbed``: its devices and the cluster to plan them for. Stopped at exit.

    Raises:
        KerasflowError: ``tasks`` out of range, TensorFlow already started here, or not on Linux.
        ClusterConnectionError: a worker did not start or the cluster did not connect in time.

    Example:
        >>> testbed = kerasflow.testbed.start(tasks=2)  # doctest: +SKIP
        >>> testbed.cluster.device(testbed.devices[1]).kind  # doctest: +SKIP
        'CPU-core'
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if isinstance(tasks, bool) or not isinstance(tasks, int) or not 2 <= tasks <= len(cores):
        raise KerasflowError(f"The testbed runs one task per core, from 2 to the {len(cores)} cores this process may "
                             f"use (os.sched_getaffinity; Linux only). Received: tasks={tasks!r}")
    _refuse_a_started_tensorflow()
    from kerasflow.worker import free_ports, wait_until_serving

    addresses = [f"127.0.0.1:{port}" for port in free_ports(tasks)]
    spec = {_JOB: addresses}
    processes: list[subprocess.Popen] = []
    testbed = Testbed([], None, cores[:tasks], addresses, processes)
    try:
        for index in range(1, tasks):
            config = json.dumps({"cluster": spec, "task": {"type": _JOB, "index": index}})
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "kerasflow.worker", "--core", str(cores[index]), "--threads", "1",
                 "--exit-with", str(os.getpid())],
                env=dict(os.environ, TF_CONFIG=config, TF_CPP_MIN_LOG_LEVEL="2"),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for process in processes:
            wait_until_serving(process, timeout)
        testbed.devices, testbed.cluster = _join(spec, cores[0], timeout)
    except BaseException:
        testbed.stop()
        raise
    atexit.register(testbed.stop)
    return testbed


def _refuse_a_started_tensorflow() -> None:
    """The threads of a running TensorFlow cannot be set any more, and task 0 is one CPU device."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    split = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("CPU")[0])
    if split and len(split) > 1:
        raise KerasflowError(f"kerasflow.testbed.start makes this process's CPU one device, task 0, but it was "
                             f"split into {len(split)} logical CPUs (kerasflow.devices.virtual_cpus). Use one or the "
                             "other, in separate processes.")
    if context.context()._initialized:  # noqa: SLF001 - TensorFlow's own flag: set_*_threads refuses after it
        raise KerasflowError("kerasflow.testbed.start must run before TensorFlow starts in this process (it sets "
                             "TensorFlow's threads and joins a cluster), but TensorFlow is already running. Call it "
                             f"first thing in your program, before building models or running ops. (TensorFlow "
                             f"{tf.__version__}.)")


def _join(spec: dict, core: int, timeout: float) -> tuple[list[str], Cluster]:
    """This process as task 0 on ``core``, one thread: connected, its devices declared of the
    testbed's kind, the loopback links between them measured."""
    import tensorflow as tf

    from kerasflow import devices as kerasflow_devices
    from kerasflow.multihost import connect
    from kerasflow.profiling import links as timing

    kerasflow_devices.pin_to_core(core)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type=_JOB, task_id=0, rpc_layer="grpc")
    names = [f"/job:{_JOB}/replica:0/task:{index}/device:CPU:0" for index in range(len(spec[_JOB]))]
    found = connect(resolver, timeout=timeout)
    missing = [name for name in names if name not in found]
    if missing:
        raise KerasflowError(f"The testbed's tasks did not all show their CPU: {missing} missing among {found}.")
    kerasflow_devices.declare_kind(names, TESTBED_KIND)
    measured = timing.measure_links(names, sizes=tuple(2**k for k in range(10, 25, 2)), repeats=5)  # 1 KiB-16 MiB
    gap = float(np.median([timing.message_gap(names[0], other) for other in names[1:]]))
    dispatch = timing.step_dispatch(names[0], names[1:])
    rate = timing.copy_bandwidth(names[0])
    memory = kerasflow_devices.device_memory(names[0])
    built = [Device(name, TESTBED_KIND, memory, host=index, memory_bandwidth=rate) for index, name in enumerate(names)]
    return names, Cluster(built, measured.links[(names[0], names[1])], measured.links, name=f"testbed:{len(names)}",
                          step_dispatch=dispatch, message_gap=gap, core_share=CORE_SHARE)
