"""``measure_links``: latency and bandwidth between devices, fitted from timed copies; ``copy_bandwidth``: a device's own copy kernels.

Copies of 1 KiB to 256 MiB are timed between each ordered pair of devices, as a device sees
them: each call of one ``tf.function`` sends a tensor back and forth between the two devices
``ROUND_TRIPS`` times, each copy waiting for the one before, and a copy's time is the
difference between a call of many round trips and a call of one, per copy (the call's own
dispatch, about 50-150 us on this machine and more than a GPU link's latency, cancels). Each
pair's ``latency + bytes / bandwidth`` is fitted by least squares on relative error over the
(bytes, seconds) samples, the median of repeated calls per size. Between logical CPUs of one
process a "copy" passes a reference, so nothing is measured: the ``cpu-testbed`` figures are
used and the result says so. Between devices of different tasks (hosts of a multi-host
cluster, ``kerasflow.testbed``'s cores) one pair per pair of tasks is timed: the network
dominates.

Within one device, the copy kernels a plan adds (a data-parallel replica packs its gradients into
buffers and unpacks the sums) run at the rate ``copy_bandwidth`` measures on that device,
concatenating 1 to 16 MiB, each concatenation timed as the device sees it: chains of them in one
function, the call's dispatch cancelling as for links (timed one eager call each, a GPU's 16 MiB
concatenation measures its dispatch, "3 TB/s"; on the project's 2-core AMD EPYC the eager figure
went from 56 to 132 GB/s between runs, the chained one 27 to 49 GB/s, the CPU preset's datasheet
20 GB/s). Where the times do not grow with the bytes, the datasheet's figure is used and a
warning says so.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from kerasflow.planner.ir.cluster import PCIE3, SAME_PROCESS, Cluster, Device, Link
from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.ir.hardware import DEVICE_SPECS
from kerasflow.devices import (LocalGPU, device_kind, device_memory, device_type, host_cpu, normalize_device,
                               shared_cards, task_of)
from kerasflow.profiling.host import host_compute

__all__ = ["measure_links", "LinkMeasurement", "cluster_of", "copy_bandwidth", "copy_samples", "copy_rate", "message_gap",
           "step_dispatch"]

SIZES = tuple(2**k for k in range(10, 29, 3))  # 1 KiB ... 256 MiB
# Large enough that the slope, not eager dispatch, sets the fit; as large as gradient buffers.
COPY_SIZES = tuple(2**k for k in range(20, 25))  # 1 MiB ... 16 MiB


class LinkMeasurement(NamedTuple):
    """Fitted links per ordered device pair, and how they were obtained.

    Attributes:
        links: ``(src, dst) -> Link``.
        measured: False when the figures are the cpu-testbed's (logical CPUs).
        note: a sentence saying how the figures were obtained.
    """

    links: dict
    measured: bool
    note: str


def _fit(samples: list[tuple[float, float]]) -> Link:
    """``latency + bytes / bandwidth`` through (bytes, seconds) samples, on relative error: the
    least-squares line, then again with each sample weighted by the inverse of that line's time
    for it (so a small copy's microseconds count as much as a large one's milliseconds, and a
    noisy near-zero sample does not dominate); a negative latency is 0.

    Raises:
        KerasflowError: the time does not grow with the bytes (every sample dispatch-bound, or
            noise): there is no bandwidth to read.

    Example:
        >>> link = _fit([(1e3, 2.0e-6 + 1e3 / 1e10), (1e6, 2.0e-6 + 1e6 / 1e10), (1e7, 2.0e-6 + 1e7 / 1e10)])
        >>> round(link.latency * 1e6, 3), round(link.bandwidth / 1e9, 3)
        (2.0, 10.0)
    """
    sizes = np.array([s for s, _ in samples], dtype=float)
    seconds = np.array([t for _, t in samples], dtype=float)
    weights = np.ones_like(seconds)
    for _ in range(2):  # an unweighted fit, then one weighted by the inverse of its own predictions
        slope, intercept = np.polyfit(sizes, seconds, 1, w=weights)
        if not slope > 0:
            raise KerasflowError(f"Copy times that do not grow with the bytes copied (slope {slope:.3g} s/byte over "
                                 f"{len(samples)} sizes): the measurement saw dispatch or noise, not the link.")
        predicted = intercept + slope * sizes
        weights = 1.0 / np.maximum(predicted, 0.05 * predicted.max())
    return Link(max(float(intercept), 0.0), float(1.0 / slope))


def measure_links(devices: Sequence[str], *, sizes: Sequence[int] = SIZES, repeats: int = 5,
                  fallback: Link | None = None) -> LinkMeasurement:
    """Times copies between every ordered pair of ``devices`` and fits each link.

    Args:
        devices: TensorFlow device names (``"/GPU:0"``, ...).
        sizes: the copy sizes in bytes.
        repeats: copies per size (the median is used).
        fallback: the link a pair takes whose copies measure no bandwidth (times that do not grow
            with the bytes: dispatch or noise), said in one ``RuntimeWarning``; None: that is an error.

    Raises:
        KerasflowError: a device that does not exist, or a pair measured no bandwidth and no
            ``fallback`` was given.

    Example:
        >>> measure_links(["/CPU:0", "/CPU:1"]).measured  # logical CPUs share memory: nothing to time
        False
    """
    known = {normalize_device(d.name).upper() for d in tf.config.list_logical_devices()}
    for device in devices:
        if normalize_device(device).upper() not in known:
            raise KerasflowError(f"Device {device!r} does not exist; TensorFlow has {sorted(known)}.")

    def same_process_cpus(a: str, b: str) -> bool:
        return task_of(a) == task_of(b) and device_type(a) == device_type(b) == "CPU"

    links, fitted = {}, {}
    for a in devices:
        for b in devices:
            if a == b:
                continue
            if same_process_cpus(a, b):
                links[(a, b)] = SAME_PROCESS
                continue
            # Between tasks the network dominates: one timed pair stands for each pair of tasks.
            key = (task_of(a), task_of(b)) if task_of(a) != task_of(b) else (a, b)
            if key not in fitted:
                try:
                    fitted[key] = _fit(_time_copies(a, b, sizes, repeats))
                except KerasflowError as error:
                    if fallback is None:
                        raise KerasflowError(f"The link {a} -> {b} measured no bandwidth: {error} Measure again on a "
                                             "quieter machine, or give the link's figures.") from None
                    warnings.warn(f"kerasflow: the link {a} -> {b} measured no bandwidth ({error}); planning with "
                                  f"{fallback.latency * 1e6:g} us and {fallback.bandwidth / 1e9:g} GB/s instead.",
                                  RuntimeWarning, stacklevel=2)
                    fitted[key] = fallback
            links[(a, b)] = fitted[key]
    if not fitted:
        return LinkMeasurement(links, False, "Logical CPUs of one process pass tensors by reference, so there "
                                             "is no copy to time; the cpu-testbed link figures are used.")
    by_reference = any(link is SAME_PROCESS for link in links.values())
    return LinkMeasurement(links, True, f"Fitted from timed copies of {sizes[0]} to {sizes[-1]} bytes"
                                        f"{' (logical CPUs of one process: the cpu-testbed figures)' if by_reference else ''}.")


# Round trips per call: the copies of the longer call less those of the shorter are timed alone.
ROUND_TRIPS = (1, 17)


def _time_copies(a: str, b: str, sizes: Sequence[int], repeats: int) -> list[tuple[float, float]]:
    """(bytes, seconds) of one copy between ``a`` and ``b``, as the devices see it (the module
    docstring): half a round trip, from calls of ``ROUND_TRIPS`` round trips, the median of
    ``repeats`` calls each."""
    samples = []
    for size in sizes:
        with tf.device(a):  # a variable: nothing for TensorFlow to fold away before it is sent
            source = tf.Variable(tf.ones([max(size // 4, 1)]), trainable=False)
        medians = []
        for trips in ROUND_TRIPS:
            with _unoptimized():  # Grappler would drop a copy whose value comes back where it was
                medians.append(_median_call(_bouncing(source, a, b, trips), repeats))
        copies = 2 * (ROUND_TRIPS[1] - ROUND_TRIPS[0])
        samples.append((float(size), (medians[1] - medians[0]) / copies))
    return samples


@contextlib.contextmanager
def _unoptimized():
    """Inside, the functions TensorFlow runs are not rewritten by Grappler (the setting is part of
    what TensorFlow keys an instantiated function by: outside, the function is rewritten again)."""
    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def _bouncing(source: tf.Variable, a: str, b: str, trips: int):
    """A call that sends ``source``'s value from ``a`` to ``b`` and back ``trips`` times, each copy
    waiting for the one before, and returns once the last is back on ``a``."""
    @tf.function
    def bounce():
        with tf.device(a):
            value = source.read_value()
        for _ in range(trips):
            with tf.device(b):
                value = tf.identity(value)
            with tf.device(a):
                value = tf.identity(value)
        with tf.device(a):
            return value[0]

    return lambda: bounce().numpy()


# Messages in flight at once: the last of this many small sends less the first, per send.
IN_FLIGHT = 17


def message_gap(a: str, b: str, repeats: int = 9) -> float:
    """Seconds each of many small transfers from ``b`` to ``a`` adds when they are all in flight
    at once (``Cluster.message_gap``): a call sending ``IN_FLIGHT`` 4-byte values less a call
    sending one, per value, the median of ``repeats`` calls each (never below 0).

    Example:
        >>> message_gap("/job:worker/replica:0/task:0/device:CPU:0",
        ...             "/job:worker/replica:0/task:1/device:CPU:0")  # doctest: +SKIP
        6.1e-05
    """
    with tf.device(b):
        values = [tf.Variable(float(i), trainable=False) for i in range(IN_FLIGHT)]
    medians = []
    for count in (1, IN_FLIGHT):
        @tf.function
        def gather(count=count):
            with tf.device(b):
                read = [v.read_value() for v in values[:count]]
            with tf.device(a):
                return tf.add_n([tf.identity(r) for r in read])

        medians.append(_median_call(lambda: gather().numpy(), repeats))
    return max((medians[1] - medians[0]) / (IN_FLIGHT - 1), 0.0)


def step_dispatch(local: str, others: Sequence[str], repeats: int = 15) -> float:
    """Seconds a call of a function that runs ops on the tasks of ``others`` too takes beyond one
    that runs on ``local`` alone, one 4-byte value back from each included: TensorFlow's remote
    call per task and step (``Cluster.step_dispatch``; never below 0).

    Example:
        >>> step_dispatch("/job:worker/replica:0/task:0/device:CPU:0",
        ...               ["/job:worker/replica:0/task:1/device:CPU:0"])  # doctest: +SKIP
        0.0009
    """
    with tf.device(local):
        here = tf.Variable(1.0, trainable=False)
    there = []
    for device in others:
        with tf.device(device):
            there.append(tf.Variable(1.0, trainable=False))

    @tf.function
    def alone():
        with tf.device(local):
            return here.read_value() * 2.0

    @tf.function
    def everywhere():
        parts = []
        for device, value in zip(others, there):
            with tf.device(device):
                parts.append(value.read_value() * 2.0)
        with tf.device(local):
            return tf.add_n([here.read_value()] + parts)

    return max(_median_call(lambda: everywhere().numpy(), repeats) - _median_call(lambda: alone().numpy(), repeats),
               0.0)


def _median_call(call, repeats: int, clock=time.perf_counter) -> float:
    """The median seconds of ``repeats`` calls of ``call``, after two untimed ones (trace, warm),
    read on ``clock``.

    Example:
        >>> ticks = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # three calls: 1, 3 and 2 seconds
        >>> _median_call(lambda: None, 3, clock=lambda: next(ticks))
        2.0
    """
    call()
    call()
    runs = []
    for _ in range(repeats):
        started = clock()
        call()
        runs.append(clock() - started)
    return float(np.median(runs))


# Concatenations per call: those of the longer call less those of the shorter are timed alone.
CONCATENATIONS = (1, 9)


def _concatenating(device: str, size: int):
    """A function of ``count`` that concatenates two halves of ``size`` bytes on ``device``
    ``count`` times, each concatenation reading the one before (split along its first axis,
    which shares the buffer); traced once for every count."""
    with tf.device(device):
        source = tf.Variable(tf.ones([max(size // 4, 2)]), trainable=False)

    def concatenated(i, value):
        return i + 1, tf.concat(tf.split(value, 2), 0)

    @tf.function(autograph=False)  # AutoGraph would write its converted code to a temporary file
    def concatenate(count):
        with tf.device(device):
            _, value = tf.while_loop(lambda i, _: i < count, concatenated, (tf.constant(0), source.read_value()))
            return value[0]

    return concatenate


def copy_samples(device: str, repeats: int = 3) -> list[tuple[float, float]]:
    """(bytes read and written, seconds) of one concatenation of each of ``COPY_SIZES`` on
    ``device``, as the device sees it: the difference of calls of ``CONCATENATIONS`` chained
    concatenations, per concatenation (the call's dispatch cancels, as in ``measure_links``)."""
    samples = []
    for size in COPY_SIZES:
        concatenate = _concatenating(device, size)
        with _unoptimized():  # Grappler would fold a concatenation of a split away
            medians = [_median_call(lambda count=tf.constant(count): concatenate(count).numpy(), repeats)
                       for count in CONCATENATIONS]
        samples.append((2.0 * size, (medians[1] - medians[0]) / (CONCATENATIONS[1] - CONCATENATIONS[0])))
    return samples


def copy_rate(samples: list[tuple[float, float]], kind: str) -> float:
    """Bytes/s of a device's copy kernels fitted from ``copy_samples``; where the times do not grow
    with the bytes (dispatch or noise), the datasheet's memory bandwidth of ``kind`` (the CPU's for
    a kind without one), said in one ``RuntimeWarning``.

    Example:
        >>> round(copy_rate([(2e6, 1e-6 + 2e6 / 5e10), (2e7, 1e-6 + 2e7 / 5e10)], "CPU") / 1e9, 6)
        50.0
    """
    try:
        return _fit(samples).bandwidth
    except KerasflowError as error:
        spec = DEVICE_SPECS.get(kind, DEVICE_SPECS["CPU"])
        warnings.warn(f"kerasflow: a {kind} device's copy kernels measured no rate ({error}); planning with the "
                      f"datasheet's {spec.memory_bandwidth / 1e9:g} GB/s instead.", RuntimeWarning, stacklevel=2)
        return spec.memory_bandwidth


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device: str, repeats: int = 3) -> float:
    """Bytes/s a copy kernel reads and writes on ``device`` (a concat or a split: how a plan's
    gradient buffers are packed and unpacked), fitted from chained concatenations of 1 to 16 MiB
    timed as the device sees them (``copy_samples``, ``copy_rate``); measured once per device in
    a process.

    Example:
        >>> copy_bandwidth("/CPU:0") > 1e9
        True
    """
    return copy_rate(copy_samples(device, repeats), device_kind(device))


def cluster_of(devices: Sequence[str], *, links: LinkMeasurement | None = None, name: str = "",
               gpus: Sequence[LocalGPU] | None = None, bandwidths: dict | None = None,
               host_link: Link | None = None) -> Cluster:
    """A ``Cluster`` of local TensorFlow devices: kinds and memory from TensorFlow, links and copy
    kernels measured; logical GPUs carved from one card share its compute
    (``devices.shared_cards``); with GPUs, the first one's machine's CPU is the cluster's host
    (``Cluster.host``: the ops no GPU can run go there). ``gpus``: the local GPUs (default
    ``devices.local_gpus()``); ``bandwidths``: each device's copy bandwidth, bytes/s (default
    ``copy_bandwidth``; a device absent from a given dict takes its kind's datasheet figure);
    ``host_link``: between the host and the GPUs (default: measured to the first GPU; PCIe 3
    where that measures no bandwidth).

    Example:
        >>> cluster_of(["/CPU:0", "/CPU:1"]).device_names
        ['/CPU:0', '/CPU:1']
    """
    links = links or measure_links(devices, fallback=PCIE3)  # a GPU pair that measured no bandwidth: PCIe 3
    rates = bandwidths if bandwidths is not None else {device: copy_bandwidth(device) for device in devices}
    built = [Device(device, device_kind(device, gpus), device_memory(device, gpus),
                    memory_bandwidth=rates.get(device, 0.0)) for device in devices]
    host = None
    if any(device_type(device) == "GPU" for device in devices):
        cpu = host_cpu(devices[0])
        host = Device(cpu, device_kind(cpu), device_memory(cpu))
        host_link = host_link or measure_links([cpu, devices[0]], fallback=PCIE3).links[(cpu, devices[0])]
    return Cluster(built, SAME_PROCESS, links.links, name=name or f"local:{len(devices)}",
                   shared=shared_cards(devices, gpus), host=host, host_link=host_link or PCIE3)


@functools.lru_cache(maxsize=None)
def _measured_cluster(devices: tuple[str, ...]) -> Cluster:
    return cluster_of(list(devices))


def planning_cluster(options) -> Cluster:
    """The cluster ``fit`` plans for: ``options.cluster`` when given, else for logical CPUs the
    host they share (``host.host_compute``; same-process copies; copy kernels at the host's
    measured ``copy_bandwidth``), else the devices with their links and copy kernels measured
    (once per set of devices).

    Example:
        >>> from kerasflow.strategies.options import Options
        >>> cluster = planning_cluster(Options(devices=("/CPU:0", "/CPU:1")))
        >>> cluster.name, cluster.shares_compute(["/CPU:0", "/CPU:1"])
        ('logical-cpus:2', True)
    """
    if options.cluster is not None:
        return options.cluster
    devices = tuple(options.devices)
    if all("CPU" in d.upper() for d in devices):
        shared = [host_compute(devices)] if len(devices) > 1 else []
        rate = copy_bandwidth(devices[0])  # one host's memory
        return Cluster([Device(d, "CPU", DEVICE_SPECS["CPU"].memory, memory_bandwidth=rate) for d in devices],
                       SAME_PROCESS, name=f"logical-cpus:{len(devices)}", shared=shared)
    return _measured_cluster(devices)
