"""Kernel times from TensorFlow's profiler (XPlane files), per graph node and per step.

``StepProfiler`` wraps ``tf.profiler.experimental`` around steps (each step marked with a
trace event, so kernel times can be grouped per step); ``attribute`` maps the profiled
node names back to the ops of a traced step: it strips the call prefixes of nested
functions, gives Grappler's child nodes to their parent op, and spreads a fused kernel
(oneDNN's ``_MklFusedMatMul``, ``_FusedConv2D``..., named after the last op of the chain)
over the ops it replaced, in proportion to their FLOPs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field

import tensorflow as tf

from kerasflow.planner.errors import ProfilingError

__all__ = ["StepProfiler", "KernelTimes", "attribute", "Attribution", "native_stderr_silenced"]

_STEP_MARKER = "kerasflow_step"
_KERNEL = re.compile(r"^([A-Za-z0-9_.\-/>]+):([A-Za-z0-9_]+)$")
_CALL_PREFIX = re.compile(r"^(StatefulPartitionedCall|PartitionedCall|__inference|while|cond)[^/]*$")
_FUSIBLE = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "DepthwiseConv2dNative", "BiasAdd", "Add",
            "AddV2", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Mul", "FusedBatchNormV3", "Sub",
            "Softplus", "Gelu"}


@dataclass
class KernelTimes:
    """Profiled kernel time per node: one total per step (seconds), and the kernel types seen."""

    per_step: dict[str, list[float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    steps: int = 0

    def median(self, node: str) -> float:
        values = self.per_step.get(node, [])
        values = values + [0.0] * (self.steps - len(values))
        return statistics.median(values) if values else 0.0

    @property
    def total(self) -> float:
        """Median seconds per step summed over all nodes."""
        return sum(self.median(node) for node in self.per_step)


@contextlib.contextmanager
def native_stderr_silenced(silenced: bool = True):
    """Sends what native code writes to stderr (TensorFlow's profiler logs a dozen lines per
    session through C++ logging, which no Python setting reaches) to /dev/null for a while."""
    if not silenced:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(sink, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)


class StepProfiler:
    """Profiles a few steps with TensorFlow's profiler and reads their kernel times.

    Example:
        >>> square = tf.function(lambda m: tf.matmul(m, m))
        >>> profiler = StepProfiler(quiet=True)
        >>> profiler.start()
        >>> for i in range(3):
        ...     with profiler.step(i):
        ...         _ = square(tf.ones([256, 256]))
        >>> times = profiler.stop()
        >>> times.steps, times.total > 0
        (3, True)
    """

    def __init__(self, logdir: str | None = None, quiet: bool = False, lanes: int | None = None):
        self.lanes = lanes
        self._own = logdir is None
        self.logdir = logdir or tempfile.mkdtemp(prefix="kerasflow_profile_")
        self._running = False
        self.quiet = quiet

    def start(self) -> None:
        """Starts the profiler (host ops and device kernels; no Python tracing)."""
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                           device_tracer_level=1)
        with native_stderr_silenced(self.quiet):
            tf.profiler.experimental.start(self.logdir, options=options)
        self._running = True

    def step(self, number: int):
        """A context manager marking one step (kernels inside it are counted for that step)."""
        return tf.profiler.experimental.Trace(_STEP_MARKER, step_num=number, _r=1)

    def stop(self) -> KernelTimes:
        """Stops the profiler and returns the kernel times of the marked steps."""
        if self._running:
            with native_stderr_silenced(self.quiet):
                tf.profiler.experimental.stop()
            self._running = False
        files = sorted(glob.glob(os.path.join(self.logdir, "plugins", "profile", "*", "*.xplane.pb")),
                       key=os.path.getmtime)
        if not files:
            raise ProfilingError(f"The TensorFlow profiler wrote no trace under {self.logdir}. Check that no other "
                                 "profiler session is running in this process (tf.profiler.experimental.stop()).")
        times = parse_xspace(files[-1], lanes=self.lanes)
        if self._own:
            shutil.rmtree(self.logdir, ignore_errors=True)
        return times


def parse_xspace(path: str, lanes: int | None = None) -> KernelTimes:
    """Reads an ``.xplane.pb`` file into per-node, per-step kernel times.

    With ``lanes``, a host op's time is its time alone on the host's shared compute
    (``shared_seconds``), as ``planner.machine.SharedCompute`` prices it; device kernels keep
    their own.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    steps: list[tuple[int, int]] = []
    host: list[tuple[int, str, str, int]] = []
    device: list[tuple[int, str, str, int]] = []
    for plane in space.planes:
        on_device = plane.name.startswith("/device:")
        metadata = plane.event_metadata
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for event in line.events:
                name = metadata[event.metadata_id].name
                begin = base + event.offset_ps
                if name.split("#")[0] == _STEP_MARKER:
                    steps.append((begin, begin + event.duration_ps))
                    continue
                label = name
                for stat in event.stats:
                    if stat_names.get(stat.metadata_id) == "tf_op":
                        label = stat.str_value or label
                match = _KERNEL.match(label)
                if match:
                    (device if on_device else host).append((begin, match.group(1), match.group(2), event.duration_ps))
    # GPU ops show a short launch on the host and the kernel on the device: keep the kernel.
    on_device_nodes = {node for _, node, _, _ in device}
    host = [e for e in host if e[1] not in on_device_nodes]
    if lanes is not None:
        host = [(b, node, kind, seconds) for (b, node, kind, _), seconds in zip(host, shared_seconds(host, lanes))]
    events = device + host
    steps.sort()
    times = KernelTimes(steps=max(len(steps), 1))
    for begin, node, kind, duration in events:
        index = 0
        if steps:
            index = next((i for i, (s, e) in enumerate(steps) if s <= begin <= e), -1)
            if index < 0:
                continue
        row = times.per_step.setdefault(node, [0.0] * times.steps)
        row[index] += duration * 1e-12
        times.types[node] = kind
    return times


def shared_seconds(events: list[tuple[int, str, str, int]], lanes: int) -> list[int]:
    """Each event's time alone on a pool of ``lanes`` lanes, from its time among the others.

    While ``k`` events overlap, each had ``min(1, lanes / k)`` of its speed alone
    (``SharedCompute.rate``), so its time alone is the integral of that over its span. Events are
    ``(begin, node, kind, duration)`` in picoseconds; so is the result, in their order.

    Example:
        >>> # Two ops overlapping for their whole 10 ps on one lane had half the pool each.
        >>> shared_seconds([(0, "a", "MatMul", 10), (0, "b", "MatMul", 10), (20, "c", "Relu", 4)], lanes=1)
        [5, 5, 4]
    """
    edges = sorted([(b, 1, i) for i, (b, *_rest) in enumerate(events)] +
                   [(b + d, -1, i) for i, (b, _n, _k, d) in enumerate(events)], key=lambda e: (e[0], e[1]))
    alone = [0.0] * len(events)
    running: set[int] = set()
    since = 0
    for at, change, i in edges:
        if running and at > since:
            share = (at - since) * min(1.0, lanes / len(running))
            for j in running:
                alone[j] += share
        since = at
        if change > 0:
            running.add(i)
        else:
            running.discard(i)
    return [int(round(a)) for a in alone]


@dataclass
class Attribution:
    """Seconds per op of the traced step, and what fraction of kernel time found an op."""

    seconds: dict[str, float]
    coverage: float
    unmatched: dict[str, float]


def attribute(times: KernelTimes, ops: dict, flops: dict[str, float] | None = None) -> Attribution:
    """Maps profiled node names onto the traced step's ops.

    Args:
        times: kernel times from ``StepProfiler.stop``.
        ops: op name -> an object with ``type`` and ``inputs`` (``[(producer, index)]``)
            and ``layer`` (``CapturedOp``).
        flops: op name -> FLOPs, to share a fused kernel's time.
    """
    flops = flops or {}
    seconds: dict[str, float] = {}
    unmatched: dict[str, float] = {}
    total = covered = 0.0
    own = {_resolve(node, ops) for node in times.per_step}
    for node in times.per_step:
        value = times.median(node)
        total += value
        name = _resolve(node, ops)
        if name is None:
            unmatched[node] = value
            continue
        covered += value
        kind = times.types.get(node, "")
        chain = [name]
        if kind != ops[name].type and "Fused" in kind:
            chain = _fused_chain(name, ops, own)
        weights = [max(flops.get(n, 0.0), 1.0) for n in chain]
        for n, w in zip(chain, weights):
            seconds[n] = seconds.get(n, 0.0) + value * w / sum(weights)
    return Attribution(seconds, covered / total if total > 0 else 1.0, unmatched)


def _resolve(node: str, ops: dict) -> str | None:
    if node in ops:
        return node
    parts = node.split("/")
    while parts and _CALL_PREFIX.match(parts[0]):
        parts = parts[1:]
        if "/".join(parts) in ops:
            return "/".join(parts)
    # A node Grappler split off an op ("dense/MatMul/_12") belongs to that op.
    for i in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:i])
        if candidate in ops:
            return candidate
    return None


def _fused_chain(last: str, ops: dict, profiled: set) -> list[str]:
    """The ops a fused kernel named after ``last`` replaced: up its first inputs, same layer."""
    chain = [last]
    current = ops[last]
    while current.inputs:
        producer = current.inputs[0][0]
        candidate = ops.get(producer)
        if (candidate is None or producer in profiled or candidate.type not in _FUSIBLE
                or candidate.layer != ops[last].layer):
            break
        chain.append(producer)
        current = candidate
    return chain
