"""Kernel times from TensorFlow's profiler (XPlane files), per graph node and per step.

``StepProfiler`` wraps ``tf.profiler.experimental`` around steps (each step marked with a
trace event, so kernel times can be grouped per step); ``parse_xspace`` reads a profile's
planes: the host's (``/host:CPU``: an op's event is named ``node:Type``) and each device's
(``/device:GPU:N``: kernels on its ``Stream #K(Compute)`` lines, named after their CUDA kernel,
the op in a ``tf_op``, ``kernel_annotation`` or ``annotation`` stat, as text or as a reference
into the plane's stat metadata; copies on its ``Stream #K(Memcpy...)`` lines, read as
transfers). Lines the profile viewer derives when it loads a file (``TensorFlow Ops``,
``Steps``, ``XLA Ops``...) repeat those events and are never read. A device runs a step's
kernels after the host has moved on, so a kernel belongs to the last step marked before it
began. ``attribute`` maps the profiled node names back to the ops of a traced step: it strips
the call prefixes of nested functions, gives Grappler's child nodes (and the layout optimizer's
transposes) to their parent op, and spreads a fused kernel (oneDNN's ``_MklFusedMatMul``,
``_FusedConv2D``..., named after the last op of the chain) over the ops it replaced, in
proportion to their FLOPs; it measures coverage per device and warns when a device ran kernels
that no op of the step claims.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import os
import re
import shutil
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

import tensorflow as tf

from kerasflow.planner.errors import ProfilingError

__all__ = ["StepProfiler", "KernelTimes", "Copy", "parse_xspace", "attribute", "Attribution", "native_stderr_silenced",
           "HOST", "UNCLAIMED_WARNING_SHARE"]

_STEP_MARKER = "kerasflow_step"
_KERNEL = re.compile(r"^([A-Za-z0-9_.\-/>]+):([A-Za-z0-9_]+)$")
_CALL_PREFIX = re.compile(r"^(StatefulPartitionedCall|PartitionedCall|__inference|while|cond)[^/]*$")
# Grappler's layout optimizer adds transposes around an op it runs in another layout, named after it.
_LAYOUT_TRANSPOSE = re.compile(r"(-\d+)+-Transpose\w*-LayoutOptimizer$")
HOST = "/host:CPU"
# A device's kernels are on its stream lines; copies on the ones named after the copy's direction.
_STREAM = re.compile(r"^Stream #\d+(?:\((?P<what>[^)]*)\))?$")
_COPY_LINES = ("MemcpyH2D", "MemcpyD2H", "MemcpyD2D", "MemcpyP2P")
# Lines the profile viewer adds when it loads a profile, repeating the events of the others.
_DERIVED_LINES = frozenset({"TensorFlow Ops", "TensorFlow Name Scope", "Steps", "XLA Ops", "XLA Modules",
                            "Framework Ops", "Framework Name Scope", "Source code", "Launch Stats"})
# The stats naming a kernel's op, the most precise first.
_OP_STATS = ("tf_op", "kernel_annotation", "annotation")
# A device whose kernels no op claims beyond this share of its kernel time is named in a warning:
# those kernels are missing from every op's cost.
UNCLAIMED_WARNING_SHARE = 0.05
_FUSIBLE = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "DepthwiseConv2dNative", "BiasAdd", "Add",
            "AddV2", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Mul", "FusedBatchNormV3", "Sub",
            "Softplus", "Gelu"}


@dataclass
class Copy:
    """A copy of a tensor between two memories in a profiled step (an event of a ``Memcpy*`` line).

    Attributes:
        step: the step it belongs to (from 0).
        node: the op it copied for, or None when the profile does not say.
        source: where the bytes came from: ``"/host:CPU"`` or a device plane's name.
        destination: where they went.
        bytes: its size (``memcpy_details``' ``size``; 0 when absent).
        seconds: how long it ran.
    """

    step: int
    node: str | None
    source: str
    destination: str
    bytes: int
    seconds: float


@dataclass
class KernelTimes:
    """Profiled kernel time per node: one total per step (seconds), the kernel types seen, where
    each node ran, the device kernels no op claimed, and the copies between memories."""

    per_step: dict[str, list[float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    places: dict[str, str] = field(default_factory=dict)  # node -> "/host:CPU" or a device plane
    unclaimed: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # device -> kernel -> per step
    copies: list[Copy] = field(default_factory=list)

    def median(self, node: str) -> float:
        """The node's median seconds per step (0 in a step it did not run)."""
        return self._median(self.per_step.get(node, []))

    def _median(self, values: list[float]) -> float:
        values = values + [0.0] * (self.steps - len(values))
        return statistics.median(values) if values else 0.0

    def unclaimed_seconds(self, device: str) -> dict[str, float]:
        """The median seconds per step of each kernel on ``device`` that no op claims."""
        return {kernel: self._median(row) for kernel, row in self.unclaimed.get(device, {}).items()}

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
        self._stop_session()
        files = sorted(glob.glob(os.path.join(self.logdir, "plugins", "profile", "*", "*.xplane.pb")),
                       key=os.path.getmtime)
        if not files:
            raise ProfilingError(f"The TensorFlow profiler wrote no trace under {self.logdir}. Check that no other "
                                 "profiler session is running in this process (tf.profiler.experimental.stop()).")
        times = parse_xspace(files[-1], lanes=self.lanes)
        if self._own:
            shutil.rmtree(self.logdir, ignore_errors=True)
        return times

    def discard(self) -> None:
        """Stops the profiler without reading what it wrote (deleted, when the folder is its own)."""
        try:
            self._stop_session()
        finally:
            if self._own:
                shutil.rmtree(self.logdir, ignore_errors=True)

    def _stop_session(self) -> None:
        if self._running:
            self._running = False
            with native_stderr_silenced(self.quiet):
                tf.profiler.experimental.stop()


def parse_xspace(path: str, lanes: int | None = None) -> KernelTimes:
    """Reads an ``.xplane.pb`` file into per-node, per-step kernel times.

    Host ops are read from the host plane's threads; device kernels and copies from each device
    plane's stream lines (module docstring). A host op's event within a step mark counts for that
    step; a device's kernel or copy for the last step marked before it began (the device runs
    after the host). A node with kernels on a device keeps those, not the host's launch of them.
    With ``lanes``, a host op's time is its time alone on the host's shared compute
    (``shared_seconds``), as ``planner.ir.machine.SharedCompute`` prices it; device kernels keep
    their own.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    steps: list[tuple[int, int]] = []
    host: list[tuple[int, str, str, int]] = []
    # (begin, node, type, duration, device); a kernel no op claims: (begin, kernel name, None, duration, device)
    kernels: list[tuple[int, str, str | None, int, str]] = []
    copies: list[tuple[int, str | None, str, str, int, int]] = []  # (begin, node, source, destination, bytes, ps)
    for plane in space.planes:
        on_device = plane.name.startswith("/device:")
        texts = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            if line.name in _DERIVED_LINES:
                continue
            stream = _STREAM.match(line.name) if on_device else None
            if on_device and stream is None:
                continue
            base = line.timestamp_ns * 1000
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                begin = base + event.offset_ps
                stats = _stat_texts(event, texts)
                if not on_device:
                    if name.split("#")[0] == _STEP_MARKER:
                        steps.append((begin, begin + event.duration_ps))
                        continue
                    match = _KERNEL.match(_op_label(stats) or name)
                    if match:
                        host.append((begin, match.group(1), match.group(2), event.duration_ps))
                    continue
                match = _KERNEL.match(_op_label(stats) or "")
                what = stream.group("what") or ""
                if what in _COPY_LINES or "memcpy_details" in stats:
                    source, destination, size = _copy_ends(plane.name, what, stats.get("memcpy_details", ""))
                    copies.append((begin, match and match.group(1), source, destination, size, event.duration_ps))
                elif match:
                    kernels.append((begin, match.group(1), match.group(2), event.duration_ps, plane.name))
                else:
                    kernels.append((begin, name, None, event.duration_ps, plane.name))
    return _by_step(steps, host, kernels, copies, lanes)


def _stat_texts(event, texts: dict[int, str]) -> dict[str, str]:
    """An event's text stats by name; a ``ref_value`` stands for the referenced metadata's name."""
    found = {}
    for stat in event.stats:
        key = texts.get(stat.metadata_id)
        if key is None:
            continue
        kind = stat.WhichOneof("value")
        if kind == "str_value":
            found[key] = stat.str_value
        elif kind == "ref_value":
            found[key] = texts.get(stat.ref_value, "")
    return found


def _op_label(stats: dict[str, str]) -> str | None:
    """``node:Type`` of the op an event ran for, from its op stats (the innermost of nested
    annotations ``outer::inner``, without their ``#shape=...#`` arguments), or None."""
    for key in _OP_STATS:
        for part in reversed(stats.get(key, "").split("::")):
            label = part.split("#")[0].strip()
            if _KERNEL.match(label):
                return label
    return None


def _copy_ends(device: str, what: str, details: str) -> tuple[str, str, int]:
    """``(source, destination, bytes)`` of a copy on ``device``'s ``what`` line, from its
    ``memcpy_details`` (``size:N dest:D async:0``)."""
    fields = dict(part.split(":", 1) for part in details.split() if ":" in part)
    size = int(fields["size"]) if fields.get("size", "").isdigit() else 0
    if what == "MemcpyH2D":
        return HOST, device, size
    if what == "MemcpyD2H":
        return device, HOST, size
    if what == "MemcpyP2P" and fields.get("dest", "").isdigit():
        return device, f"{device.rsplit(':', 1)[0]}:{fields['dest']}", size
    return device, device, size


def _by_step(steps, host, kernels, copies, lanes) -> KernelTimes:
    """The events summed per node and step: host events inside a step mark, device events in the
    last step marked before they began."""
    steps.sort()
    times = KernelTimes(steps=max(len(steps), 1))
    starts = [begin for begin, _ in steps]

    def host_step(begin: int) -> int:
        if not steps:
            return 0
        return next((i for i, (s, e) in enumerate(steps) if s <= begin <= e), -1)

    def device_step(begin: int) -> int:
        return bisect.bisect_right(starts, begin) - 1 if steps else 0

    on_device = {node for _, node, kind, _, _ in kernels if kind is not None}
    host = [e for e in host if e[1] not in on_device]
    if lanes is not None:
        host = [(b, node, kind, seconds) for (b, node, kind, _), seconds in zip(host, shared_seconds(host, lanes))]
    for begin, node, kind, duration, place in [(*e, HOST) for e in host] + kernels:
        step = host_step(begin) if place == HOST else device_step(begin)
        if step < 0:
            continue
        if kind is None:  # a kernel no op claims
            row = times.unclaimed.setdefault(place, {}).setdefault(node, [0.0] * times.steps)
        else:
            row = times.per_step.setdefault(node, [0.0] * times.steps)
            times.types[node], times.places[node] = kind, place
        row[step] += duration * 1e-12
    for begin, node, source, destination, size, duration in copies:
        step = device_step(begin)
        if step >= 0:
            times.copies.append(Copy(step, node, source, destination, size, duration * 1e-12))
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
    """Seconds per op of the traced step, and what fraction of kernel time found an op.

    Attributes:
        seconds: op name -> median seconds per step.
        coverage: the share of all profiled time (host ops and device kernels) that found an op.
        unmatched: profiled node (or unclaimed kernel) -> median seconds per step, for what found none.
        coverage_by_place: the same share per place: ``"/host:CPU"`` and each device plane.
        copies: the copies between memories per step, by ``(source, destination)``:
            ``(bytes, seconds)`` (the profiled steps' mean).
    """

    seconds: dict[str, float]
    coverage: float
    unmatched: dict[str, float]
    coverage_by_place: dict[str, float] = field(default_factory=dict)
    copies: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


def attribute(times: KernelTimes, ops: dict, flops: dict[str, float] | None = None) -> Attribution:
    """Maps profiled node names onto the traced step's ops.

    Warns (``RuntimeWarning``) naming each device on which more than
    ``UNCLAIMED_WARNING_SHARE`` of the kernel time found no op: that time is in no op's cost.

    Args:
        times: kernel times from ``StepProfiler.stop`` or ``parse_xspace``.
        ops: op name -> an object with ``type`` and ``inputs`` (``[(producer, index)]``)
            and ``layer`` (``CapturedOp``).
        flops: op name -> FLOPs, to share a fused kernel's time.
    """
    flops = flops or {}
    seconds: dict[str, float] = {}
    unmatched: dict[str, float] = {}
    totals: dict[str, float] = {}
    covered: dict[str, float] = {}
    own = {_resolve(node, ops) for node in times.per_step}
    for node in times.per_step:
        value = times.median(node)
        place = times.places.get(node, HOST)
        totals[place] = totals.get(place, 0.0) + value
        name = _resolve(node, ops)
        if name is None:
            unmatched[node] = value
            continue
        covered[place] = covered.get(place, 0.0) + value
        kind = times.types.get(node, "")
        chain = [name]
        if kind != ops[name].type and "Fused" in kind:
            chain = _fused_chain(name, ops, own)
        weights = [max(flops.get(n, 0.0), 1.0) for n in chain]
        for n, w in zip(chain, weights):
            seconds[n] = seconds.get(n, 0.0) + value * w / sum(weights)
    for device in times.unclaimed:
        for kernel, value in times.unclaimed_seconds(device).items():
            totals[device] = totals.get(device, 0.0) + value
            unmatched[kernel] = unmatched.get(kernel, 0.0) + value
    by_place = {place: covered.get(place, 0.0) / total if total > 0 else 1.0 for place, total in totals.items()}
    _warn_unclaimed(times, by_place, totals, unmatched, ops)
    total = sum(totals.values())
    copies: dict[tuple[str, str], tuple[float, float]] = {}
    for copy in times.copies:
        size, spent = copies.get((copy.source, copy.destination), (0.0, 0.0))
        copies[(copy.source, copy.destination)] = (size + copy.bytes / times.steps, spent + copy.seconds / times.steps)
    return Attribution(seconds, sum(covered.values()) / total if total > 0 else 1.0, unmatched, by_place, copies)


def _warn_unclaimed(times: KernelTimes, by_place: dict, totals: dict, unmatched: dict, ops: dict) -> None:
    for device, share in sorted(by_place.items()):
        if device == HOST or 1 - share <= UNCLAIMED_WARNING_SHARE:
            continue
        names = [node for node, place in times.places.items() if place == device and _resolve(node, ops) is None]
        names += list(times.unclaimed.get(device, {}))
        names.sort(key=lambda n: -unmatched.get(n, 0.0))
        warnings.warn(
            f"kerasflow: {1 - share:.0%} of the kernel time on {device} ({(1 - share) * totals[device] * 1e3:.3f} ms "
            f"a step) was claimed by no op of the step (largest: {', '.join(names[:3])}), so it is in no op's cost. "
            "The profile's kernels name no op (no tf_op or annotation stat) or ops of another function.",
            RuntimeWarning, stacklevel=3)


def _resolve(node: str, ops: dict) -> str | None:
    if node in ops:
        return node
    node = _LAYOUT_TRANSPOSE.sub("", node)  # "conv/Conv2D-0-TransposeNHWCToNCHW-LayoutOptimizer"
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
