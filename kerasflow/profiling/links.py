"""``measure_links``: latency and bandwidth between devices, fitted from timed copies; ``copy_bandwidth``: a device's own copy kernels.

Copies of 1 KiB to 256 MiB are timed between each ordered pair of devices; each pair's
``latency + bytes / bandwidth`` is fitted by least squares on (bytes, seconds) samples,
taking the median of repeated copies per size. Between logical CPUs of one process a
"copy" passes a reference, so nothing is measured: the ``cpu-testbed`` figures are used
and the result says so. Between devices of different tasks (hosts of a multi-host
cluster) one pair per pair of tasks is timed: the network dominates.

Within one device, the copy kernels a plan adds (a data-parallel replica packs its gradients into
buffers and unpacks the sums) run at the rate ``copy_bandwidth`` measures on that device,
concatenating 1 to 16 MiB: a datasheet's memory bandwidth is far off for buffers that fit in a
CPU's caches (67 GB/s measured on the project's 2-core AMD EPYC, against the CPU preset's 20 GB/s).
"""

from __future__ import annotations

import functools

import time
from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from kerasflow.planner.ir.cluster import SAME_PROCESS, Cluster, Device, Link
from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.ir.hardware import DEVICE_SPECS
from kerasflow.devices import (LocalGPU, device_kind, device_memory, device_type, normalize_device, shared_cards,
                               task_of, wait_for_devices)
from kerasflow.profiling.host import host_compute

__all__ = ["measure_links", "LinkMeasurement", "cluster_of", "copy_bandwidth"]

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
    sizes = np.array([s for s, _ in samples])
    seconds = np.array([t for _, t in samples])
    slope, intercept = np.polyfit(sizes, seconds, 1)
    slope = max(slope, 1e-15)
    return Link(max(float(intercept), 0.0), float(1.0 / slope))


def measure_links(devices: Sequence[str], *, sizes: Sequence[int] = SIZES, repeats: int = 5) -> LinkMeasurement:
    """Times copies between every ordered pair of ``devices`` and fits each link.

    Args:
        devices: TensorFlow device names (``"/GPU:0"``, ...).
        sizes: the copy sizes in bytes.
        repeats: copies per size (the median is used).

    Raises:
        KerasflowError: a device that does not exist.

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
                fitted[key] = _fit(_time_copies(a, b, sizes, repeats))
            links[(a, b)] = fitted[key]
    if not fitted:
        return LinkMeasurement(links, False, "Logical CPUs of one process pass tensors by reference, so there "
                                             "is no copy to time; the cpu-testbed link figures are used.")
    by_reference = any(link is SAME_PROCESS for link in links.values())
    return LinkMeasurement(links, True, f"Fitted from timed copies of {sizes[0]} to {sizes[-1]} bytes"
                                        f"{' (logical CPUs of one process: the cpu-testbed figures)' if by_reference else ''}.")


def _time_copies(a: str, b: str, sizes: Sequence[int], repeats: int) -> list[tuple[float, float]]:
    """(bytes, median seconds) of copies from ``a`` to ``b``, finished on ``b``."""

    samples = []
    for size in sizes:
        runs = []
        for repeat in range(repeats + 1):
            # A fresh tensor each time: TensorFlow keeps a tensor's copy on a remote device and
            # would hand it back instead of copying again.
            with tf.device(a):
                source = tf.fill([size // 4], float(repeat))
            if device_type(a) != "CPU" or task_of(a) != "local":
                tf.reduce_sum(source[:1]).numpy()  # made before the clock starts
            started = time.perf_counter()
            with tf.device(b):
                copied = tf.identity(source)
                if device_type(b) == "CPU" and task_of(b) == "local":
                    copied.numpy()  # already here: no second copy
                else:
                    tf.reduce_sum(copied[:1]).numpy()  # wait on the target, fetch one number
            runs.append(time.perf_counter() - started)
        samples.append((float(size), float(np.median(runs[1:]))))
    return samples


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device: str, repeats: int = 5) -> float:
    """Bytes/s a copy kernel reads and writes on ``device`` (a concat or a split: how a plan's
    gradient buffers are packed and unpacked), fitted from timed concatenations of 1 to 16 MiB
    (``COPY_SIZES``), the median of ``repeats`` each; measured once per device in a process.

    Example:
        >>> copy_bandwidth("/CPU:0") > 1e9
        True
    """
    samples = []
    with tf.device(device):
        for size in COPY_SIZES:
            half = tf.ones([size // 8], tf.float32)  # two halves of size // 2 bytes
            runs = []
            for _ in range(repeats + 1):
                started = time.perf_counter()
                tf.concat([half, half], 0)
                wait_for_devices()
                runs.append(time.perf_counter() - started)
            samples.append((2.0 * size, float(np.median(runs[1:]))))  # each byte read once, written once
    return _fit(samples).bandwidth


def cluster_of(devices: Sequence[str], *, links: LinkMeasurement | None = None, name: str = "",
               gpus: Sequence[LocalGPU] | None = None, bandwidths: dict | None = None) -> Cluster:
    """A ``Cluster`` of local TensorFlow devices: kinds and memory from TensorFlow, links and copy
    kernels measured; logical GPUs carved from one card share its compute
    (``devices.shared_cards``). ``gpus``: the local GPUs (default ``devices.local_gpus()``);
    ``bandwidths``: each device's copy bandwidth, bytes/s (default ``copy_bandwidth``; a device
    absent from a given dict takes its kind's datasheet figure).

    Example:
        >>> cluster_of(["/CPU:0", "/CPU:1"]).device_names
        ['/CPU:0', '/CPU:1']
    """
    links = links or measure_links(devices)
    rates = bandwidths if bandwidths is not None else {device: copy_bandwidth(device) for device in devices}
    built = [Device(device, device_kind(device, gpus), device_memory(device, gpus),
                    memory_bandwidth=rates.get(device, 0.0)) for device in devices]
    return Cluster(built, SAME_PROCESS, links.links, name=name or f"local:{len(devices)}",
                   shared=shared_cards(devices, gpus))


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
