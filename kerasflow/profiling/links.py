"""``measure_links``: latency and bandwidth between devices, fitted from timed copies.

Copies of 1 KiB to 256 MiB are timed between each ordered pair of devices; each pair's
``latency + bytes / bandwidth`` is fitted by least squares on (bytes, seconds) samples,
taking the median of repeated copies per size. Between logical CPUs of one process a
"copy" passes a reference, so nothing is measured: the ``cpu-testbed`` figures are used
and the result says so.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from kerasflow.planner.cluster import SAME_PROCESS, Cluster, Device, Link
from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.hardware import DEVICE_SPECS
from kerasflow.devices import device_kind

__all__ = ["measure_links", "LinkMeasurement", "cluster_of"]

SIZES = tuple(2**k for k in range(10, 29, 3))  # 1 KiB ... 256 MiB


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
        >>> measure_links(["/CPU:0", "/CPU:1"]).measured  # doctest: +SKIP
        False
    """
    known = {d.name.replace("/device:", "/").upper() for d in tf.config.list_logical_devices()}
    for device in devices:
        if device.replace("/device:", "/").upper() not in known:
            raise KerasflowError(f"Device {device!r} does not exist; TensorFlow has {sorted(known)}.")
    if all("CPU" in d.upper() for d in devices):
        links = {(a, b): SAME_PROCESS for a in devices for b in devices if a != b}
        return LinkMeasurement(links, False, "Logical CPUs of one process pass tensors by reference, so there "
                                             "is no copy to time; the cpu-testbed link figures are used.")
    links = {}
    for a in devices:
        for b in devices:
            if a == b:
                continue
            samples = []
            for size in sizes:
                with tf.device(a):
                    source = tf.zeros([size // 4], tf.float32)
                runs = []
                for _ in range(repeats + 1):
                    started = time.perf_counter()
                    with tf.device(b):
                        copied = tf.identity(source)
                    copied.numpy() if "CPU" in b.upper() else tf.reduce_sum(copied[:1]).numpy()
                    runs.append(time.perf_counter() - started)
                samples.append((float(size), float(np.median(runs[1:]))))
            links[(a, b)] = _fit(samples)
    return LinkMeasurement(links, True, f"Fitted from timed copies of {sizes[0]} to {sizes[-1]} bytes.")


def cluster_of(devices: Sequence[str], *, links: LinkMeasurement | None = None, name: str = "") -> Cluster:
    """A ``Cluster`` of local TensorFlow devices: kinds and memory from TensorFlow, links measured.

    Example:
        >>> cluster_of(["/CPU:0", "/CPU:1"]).device_names  # doctest: +SKIP
        ['/CPU:0', '/CPU:1']
    """
    links = links or measure_links(devices)
    built = []
    for device in devices:
        kind = device_kind(device)
        memory = DEVICE_SPECS[kind].memory if kind in DEVICE_SPECS else 16 * 2**30
        built.append(Device(device, kind, memory))
    return Cluster(built, SAME_PROCESS, links.links, name=name or f"local:{len(devices)}")
