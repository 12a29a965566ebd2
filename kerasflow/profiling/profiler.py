"""``profile_model``: a live Keras model's training step as an ``OpGraph`` with measured costs.

The step (forward, backward, optimizer update — what ``model.fit`` runs) is traced at the
user's batch and at half of it; each trace runs ``warmup_steps`` unmeasured steps (tracing
and graph optimisation happen there), then ``steps`` profiled ones. Per-op times are
medians over the profiled steps, and each op's cost is fitted as ``fixed + per_sample *
batch`` from the two batch sizes, so the planner can price shards and micro-batches. A model
built for one batch size (a layer that reshapes with it) refuses the half: it is profiled at its
own batch only, its costs taken as they were measured there, and the refused size is recorded
(``metadata["refused_batch_sizes"]``) so that no plan hands a device fewer rows. The model's
weights and optimizer state are restored afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import warnings
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from kerasflow import _compat
from kerasflow._progress import progress_bar
from kerasflow.devices import default_devices, device_kind, device_type, wait_for_devices
from kerasflow.planner.errors import ProfilingError
from kerasflow.planner.ir.graph import Affine, Edge, Op, OpGraph
from kerasflow.planner.ir.graphtables import REFUSED_BATCHES, STATISTICS_LAYERS, TEMPORARY_MEMORY
from kerasflow.profiling.capture import CapturedStep, capture_step
from kerasflow.profiling.host import host_lanes
from kerasflow.profiling.xplane import KernelTimes, StepProfiler, attribute

__all__ = ["profile_model", "profile_training_step", "first_batch", "check_model", "build_graph", "profile_step", "half_batch",
           "memory_metadata", "modelled_peak",
           "snapshot_variables", "restore_variables", "with_dispatch_overhead", "time_step", "step_spread", "PLAIN_RUNS"]

# Unprofiled runs timed for the plain step time, whatever the number of profiled steps: they
# cost one step each, and their median (the default placement's step, which fit compares a
# plan against) and spread (how noisy this machine is now, which sets the planner's tie
# margin) need more samples than the three profiled steps fit spends by default.
PLAIN_RUNS = 10


def check_model(model: Any) -> None:
    """Raises ``ProfilingError`` unless ``model`` is a compiled Keras model; warns once that a step
    compiled with XLA is profiled without it."""
    if not _compat.is_keras_model(model):
        raise ProfilingError(f"profile_model takes a Keras model (keras.Model or tf_keras.Model); "
                             f"received {type(model).__name__}.")
    if not _compat.is_compiled(model):
        raise ProfilingError(
            f"Model {model.name!r} is not compiled: call model.compile(optimizer=..., loss=...) before "
            "profiling, so the training step (loss, gradients, optimizer update) exists.")
    if _compat.uses_jit(model):
        warnings.warn(
            f"kerasflow: model {model.name!r} compiles its step with XLA (jit_compile=True, which Keras' "
            "jit_compile='auto' picks on a GPU host without a tf.distribute strategy); it is profiled without XLA, "
            "which fuses the step into a few clusters and so erases per-op placement and per-op profiles. The costs "
            "are of the step without XLA; the model is unchanged. kerasflow.callbacks.FastT judges a plan against "
            "the step with XLA inside fit.", UserWarning, stacklevel=3)


def first_batch(data: Any, batch_size: int | None = None) -> tuple:
    """One ``fit``-style batch (``(x, y)`` or ``(x, y, sample_weight)``) of tensors from ``data``.

    ``data`` is a ``tf.data.Dataset`` yielding batches, or ``(x, y)`` / ``(x, y,
    sample_weight)`` of arrays or tensors (the first ``batch_size`` samples, default 32).
    """
    if isinstance(data, tf.data.Dataset):
        try:
            batch = next(iter(data))
        except StopIteration:
            raise ProfilingError("The dataset given to profile_model is empty.") from None
        if batch_size is not None:
            batch = tf.nest.map_structure(lambda t: t[:batch_size], batch)
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if not isinstance(data, (tuple, list)) or not 1 <= len(data) <= 3:
        raise ProfilingError(
            f"profile_model takes data as (x, y), (x, y, sample_weight) or a tf.data.Dataset of batches; "
            f"received {type(data).__name__}.")
    size = batch_size or 32
    try:
        tensors = tf.nest.map_structure(lambda a: tf.convert_to_tensor(np.asarray(a)[:size]), tuple(data))
    except (ValueError, TypeError) as error:
        raise ProfilingError(f"profile_model could not turn the data into tensors: {error}") from None
    return tensors


def half_batch(batch: tuple, divisor: int = 2) -> tuple:
    """The first half of a batch (``divisor``: the first 1/divisor of it), at least one sample."""
    n = int(tf.nest.flatten(batch)[0].shape[0])
    return tf.nest.map_structure(lambda t: t[: max(1, n // divisor)], batch)


def snapshot_variables(model, known: list | None = None) -> list[tuple[Any, np.ndarray]]:
    """Every variable's value: the model's, every optimizer's (slots, iterations), the metrics' and
    Keras' global seed generator's (unseeded random draws).

    ``model.optimizer`` is built first, so its slots exist and are included. With ``known``
    (an earlier snapshot), only the variables created since then.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", True) and hasattr(optimizer, "build"):
        with _compat.strategy_scope(model):
            optimizer.build(model.trainable_variables)
    seen = {id(v) for v, _ in known or ()}
    variables = (_compat.model_variables(model) + _compat.optimizer_variables(model)
                 + _compat.metric_variables(model) + _compat.global_random_state())
    return [(v, np.array(v.numpy())) for v in variables if id(v) not in seen]


def restore_variables(snapshot) -> None:
    """Puts back the values ``snapshot_variables`` recorded."""
    for variable, value in snapshot:
        variable.assign(value)


def _run_once(step: CapturedStep, batch: tuple, profiler: StepProfiler | None = None, number: int = 0) -> float:
    """Wall seconds of one run of the traced step, waiting for its results and for every device
    to finish its work (optionally marked as step ``number`` of ``profiler``, the mark ending then)."""
    started = time.perf_counter()
    with profiler.step(number) if profiler is not None else contextlib.nullcontext():
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, step.function(batch))
        wait_for_devices()
    return time.perf_counter() - started


def profile_step(step: CapturedStep, batch: tuple, warmup_steps: int, steps: int, device: str,
                 quiet: bool = False) -> tuple:
    """Runs the traced step ``warmup_steps`` times unmeasured, ``PLAIN_RUNS`` times plain (at
    least ``steps``), then ``steps`` times profiled.

    Returns:
        ``(attribution, each plain run's seconds, profiled seconds per step)``.
    """
    with tf.device(device):
        for _ in range(max(warmup_steps, 0)):
            step.function(batch)
        plain = [_run_once(step, batch) for _ in range(max(steps, PLAIN_RUNS))]
        profiler = StepProfiler(quiet=quiet, lanes=host_lanes())
        profiler.start()
        try:
            profiled = [_run_once(step, batch, profiler, i) for i in range(steps)]
        finally:
            times = profiler.stop()
    result = attribute(times, step.by_name(), {op.name: op.flops for op in step.ops})
    return result, plain, float(np.median(profiled))


_NOT_EXECUTED = ("Placeholder", "Const", "NoOp")


def with_dispatch_overhead(seconds: dict[str, float], step: CapturedStep, plain_step: float) -> tuple[dict, float]:
    """Per-op costs with TensorFlow's dispatch overhead spread over the executed ops.

    Kernel times leave out the executor's work around each op (scheduling, allocation,
    bookkeeping: microseconds per op on CPU). The gap between a plain step's wall time and the
    sum of its kernel times is shared equally by the ops that run, so one device's simulated
    step matches its measured one.

    Returns:
        ``(seconds with the overhead, overhead per executed op)``.
    """
    executed = [op.name for op in step.ops if op.type not in _NOT_EXECUTED]
    if not executed:
        return dict(seconds), 0.0
    gap = plain_step - sum(seconds.values())
    per_op = max(gap, 0.0) / len(executed)
    adjusted = dict(seconds)
    for name in executed:
        adjusted[name] = adjusted.get(name, 0.0) + per_op
    return adjusted, per_op


def time_step(step: CapturedStep, batch: tuple, steps: int, device: str) -> list[float]:
    """The wall seconds of ``PLAIN_RUNS`` (at least ``steps``) unprofiled runs of the traced step,
    after one warm-up."""
    with tf.device(device):
        step.function(batch)
        return [_run_once(step, batch) for _ in range(max(steps, PLAIN_RUNS))]


def step_spread(seconds: list[float]) -> float:
    """How noisy a step's timings are: their interquartile range over their median.

    Example:
        >>> step_spread([1.0, 2.0, 3.0, 4.0, 5.0])  # quartiles 2 and 4, median 3
        0.6667
    """
    low, middle, high = np.percentile(seconds, [25, 50, 75])
    return round(float((high - low) / middle), 4) if middle > 0 else 0.0


def _affine(value_big: float, batch_big: int, value_small: float | None, batch_small: int | None) -> Affine:
    """The line through (small batch, value) and (big batch, value), kept non-negative."""
    if value_small is None or batch_small is None or batch_small == batch_big:
        return Affine(max(value_big, 0.0), 0.0)
    per_sample = (value_big - value_small) / (batch_big - batch_small)
    if per_sample <= 0:
        return Affine(max(value_big, 0.0), 0.0)
    fixed = value_big - per_sample * batch_big
    if fixed < 0:
        return Affine(0.0, value_big / batch_big)
    return Affine(fixed, per_sample)


def build_graph(big: CapturedStep, small: CapturedStep | None, seconds_big: dict, seconds_small: dict | None,
                kind: str, *, name: str = "", metadata: dict | None = None) -> OpGraph:
    """The ``OpGraph`` of a traced step: structure from ``big``, costs and sizes affine in the batch;
    ``metadata`` gets the layers whose statistics replicas compute together."""
    b1 = big.batch_size
    b2 = small.batch_size if small is not None else None
    small_ops = small.by_name() if small is not None else {}
    ops, edges = [], []
    for op in big.ops:
        twin = small_ops.get(op.name)
        cost = _affine(seconds_big.get(op.name, 0.0), b1,
                       (seconds_small or {}).get(op.name, 0.0) if twin is not None else None, b2)
        outputs = [_affine(size, b1, twin.output_bytes[i] if twin is not None and i < len(twin.output_bytes) else None, b2)
                   for i, size in enumerate(op.output_bytes)]
        flops = _affine(op.flops, b1, twin.flops if twin is not None else None, b2)
        accessed = _affine(op.bytes_accessed, b1, twin.bytes_accessed if twin is not None else None, b2)
        ops.append(Op(op.name, op.type, op.layer, op.phase, {kind: cost}, outputs, Affine(0.0), op.persistent_bytes,
                      op.colocation, op.batch_axis, flops, accessed))
        for source, index in op.inputs:
            edges.append(Edge(source, op.name, index))
        for source in op.control_inputs:
            edges.append(Edge(source, op.name, None))
    metadata = {**(metadata or {}), STATISTICS_LAYERS: list(big.synchronized_layers)}
    return OpGraph(ops, edges, batch_size=b1, name=name, metadata=metadata)


def profile_model(model: Any, data: Any, *, batch_size: int | None = None, warmup_steps: int = 2,
                  steps: int = 3, device: str | None = None, second_batch: bool = True,
                  progress: Callable[[str], None] | None = None, verbose=True) -> OpGraph:
    """Profiles one training step of ``model`` and returns it as an ``OpGraph``.

    Args:
        model: a compiled Keras 3 or tf-keras model (Sequential, Functional or subclassed); a
            step it compiles with XLA is profiled without XLA, with one warning.
        data: ``(x, y)``, ``(x, y, sample_weight)`` (arrays or tensors) or a
            ``tf.data.Dataset`` of batches, as for ``fit``.
        batch_size: the batch to profile (default: the dataset's batch, or 32).
        warmup_steps: unmeasured steps first (tracing and graph optimisation happen there).
        steps: profiled steps; per-op times are their medians.
        device: where to run (default: the first GPU, else ``/CPU:0``); costs are keyed by
            its kind (``"CPU"``, ``"V100"``, ...).
        second_batch: also profile half the batch, to fit each cost as fixed + per-sample
            (a model that refuses the half is profiled at ``batch_size`` only, and says so).
        progress: called with a short message at each stage.
        verbose: show a progress bar on stderr (only on a terminal); 0 or False: no bar and
            no profiler logs.

    Returns:
        The step: every op of forward, backward and update, with its layer, phase,
        colocation group, batch axis, output sizes and measured cost. ``metadata`` holds
        the coverage (the fraction of profiled kernel time that landed on ops of the graph;
        ``coverage_by_place``: per host and device), the copies between memories a step made
        (``copies_per_step``: source, destination, bytes, seconds; a GPU profile's ``Memcpy``),
        the profiling wall time, the plain and profiled step times, the batch sizes
        profiled and refused (``batch_sizes``, ``refused_batch_sizes``), and how memory was
        obtained.

    Raises:
        ProfilingError: the model is not compiled, or the data does not fit it
            (the message names the batch kerasflow made from it).

    Example:
        >>> import keras, numpy as np, kerasflow
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile(optimizer="adam", loss="mse")
        >>> x, y = np.ones((64, 8), "float32"), np.ones((64, 1), "float32")
        >>> graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=64)
        >>> sorted({op.phase for op in graph.ops}), graph.metadata["coverage"] > 0.9
        (['backward', 'forward', 'other', 'update'], True)
    """
    check_model(model)
    device = device or default_devices()[0]
    batch = first_batch(data, batch_size)
    bar = progress_bar(3 if second_batch else 2, "kerasflow: profiling", verbose)

    def say(message: str) -> None:
        bar.set_postfix_str(message)
        bar.update(1)
        if progress is not None:
            progress(message)

    try:
        return profile_training_step(model, batch, device=device, warmup_steps=warmup_steps, steps=steps,
                                     second_batch=second_batch, say=say, quiet=verbose in (0, "0", False),
                                     source="kerasflow.profiling.profile_model")
    finally:
        bar.close()


def profile_training_step(model: Any, batch: tuple, *, device: str, warmup_steps: int, steps: int,
                          second_batch: bool = True, second_divisor: int = 2,
                          kernel_times: KernelTimes | None = None, say: Callable[[str], None] | None = None,
                          quiet: bool = False, source: str = "kerasflow.profiling.profile_model") -> OpGraph:
    """The one profiling sequence of kerasflow, for ``profile_model`` and for planning inside ``fit``.

    Traces the step at ``batch`` (and at half of it), measures per-op kernel times and the
    plain step time at both sizes, and builds the batch-affine ``OpGraph``. Every variable
    (the model's, every optimizer's, the metrics') is put back afterwards, so profiling
    leaves no trace in training.

    Args:
        model: a compiled Keras model.
        batch: one real batch as ``train_step`` receives it.
        device: where to run; costs are keyed by its kind.
        warmup_steps: unmeasured runs of each traced step.
        steps: measured runs (medians).
        second_batch: also profile half the batch (costs fixed + per sample), unless the
            model refuses it (then ``metadata["refused_batch_sizes"]`` names it).
        second_divisor: the second profile runs 1/``second_divisor`` of the batch instead of
            half: inside ``fit``, the rows one replica of a data-parallel plan over every device
            runs, so that the costs are measured at the batch a replica runs, not extrapolated.
        kernel_times: kernel times already profiled from ``fit``'s own steps at this batch,
            used when they cover the traced step (saves profiling it again).
        say: called with a short message at each stage.
        quiet: silence the TensorFlow profiler's native log lines.
        source: recorded in ``metadata["source"]``.

    Raises:
        ProfilingError: ``batch`` does not fit the model.
    """
    say = say or (lambda message: None)
    started = time.perf_counter()
    kind = device_kind(device)
    with _compat.strategy_scope(model), tf.device(device):
        snapshot = snapshot_variables(model)
        try:
            say("tracing the training step")
            try:
                big = capture_step(model, batch)
            except _REFUSALS as error:
                raise _data_error(model, batch, error) from None
            small, refused = None, []
            if second_batch and big.batch_size > 1:
                try:
                    small = capture_step(model, half_batch(batch, second_divisor))
                except _REFUSALS as error:  # a model built for one batch size: plan it at that size
                    refused = [_rows(half_batch(batch, second_divisor))]
                    say(_refusal(model, refused[0], big.batch_size, error))
            # Tracing builds what the step builds (a GAN's second optimizer) before any run.
            snapshot += snapshot_variables(model, known=snapshot)
            say(f"profiling {steps} steps at batch {big.batch_size}")
            _reset_peak(device)  # the step's own peak, not the tracing's or an earlier model's
            result = None
            if kernel_times is not None:
                result = attribute(kernel_times, big.by_name(), {op.name: op.flops for op in big.ops})
            if result is not None and result.coverage >= 0.5:
                plain_runs = time_step(big, batch, steps, device)
                profiled = float(np.median(plain_runs))
            else:  # fit's step differs by name (or none was given): profile the traced step itself
                result, plain_runs, profiled = profile_step(big, batch, warmup_steps, steps, device, quiet=quiet)
            plain = float(np.median(plain_runs))
            peak = _peak(device)
            result_small = plain_small = None
            if small is not None:
                say(f"profiling {steps} steps at batch {small.batch_size}")
                try:
                    result_small, small_runs, _ = profile_step(small, half_batch(batch, second_divisor), warmup_steps,
                                                               steps, device, quiet=quiet)
                    plain_small = float(np.median(small_runs))
                except tf.errors.InvalidArgumentError as error:  # refused when run, not when traced
                    refused = [small.batch_size]
                    small = None
                    say(_refusal(model, refused[0], big.batch_size, error))
        finally:
            restore_variables(snapshot)
    metadata = {
        "source": source,
        "device": device,
        "device_kind": kind,
        "flavor": _compat.flavor(model),
        "coverage": round(result.coverage, 6),
        "coverage_by_place": {place: round(share, 6) for place, share in result.coverage_by_place.items()},
        "copies_per_step": [{"source": source, "destination": destination, "bytes": size, "seconds": seconds}
                            for (source, destination), (size, seconds) in sorted(result.copies.items())],
        "profile_seconds": round(time.perf_counter() - started, 3),
        "plain_step_seconds": plain,
        "plain_step_spread": step_spread(plain_runs),
        "plain_step_runs": len(plain_runs),
        "profiled_step_seconds": profiled,
        "batch_sizes": [big.batch_size] + ([small.batch_size] if small is not None else []),
        REFUSED_BATCHES: refused,
        "versions": {"tensorflow": tf.__version__},
    }
    seconds_big, overhead = with_dispatch_overhead(result.seconds, big, plain)
    seconds_small = None
    if result_small is not None:
        seconds_small, _ = with_dispatch_overhead(result_small.seconds, small, plain_small)
    metadata["dispatch_overhead_per_op_seconds"] = overhead
    graph = build_graph(big, small, seconds_big, seconds_small, kind, name=model.name, metadata=metadata)
    memory = memory_metadata(device, peak, lambda: modelled_peak(graph, device, kind))
    return OpGraph(graph.ops, graph.edges, batch_size=graph.batch_size, name=graph.name,
                   metadata={**graph.metadata, **memory})


def _reset_peak(device: str) -> None:
    """Starts the allocator's peak afresh on ``device``, where TensorFlow keeps one."""
    try:
        tf.config.experimental.reset_memory_stats(device.strip("/"))
    except (ValueError, RuntimeError):
        pass


def _peak(device: str) -> int | None:
    """The allocator's peak bytes on ``device`` since the last reset (None where TensorFlow keeps none)."""
    try:
        return int(tf.config.experimental.get_memory_info(device.strip("/"))["peak"])
    except (ValueError, RuntimeError):
        return None


def modelled_peak(graph: OpGraph, device: str, kind: str) -> float:
    """The peak memory the planner's model gives the step on ``device`` alone: weights, optimizer
    slots and live tensors, no temporary memory."""
    from kerasflow.planner import Cluster, Device, baselines

    alone = Cluster([Device(device, kind, 2**62)], name="profiled device")
    return float(baselines.single_device(graph, alone).predicted_peak_memory[device])


def memory_metadata(device: str, peak: int | None, modelled: Callable[[], float]) -> dict:
    """What a profile says of memory. On a GPU: the allocator's peak over the profiled steps
    (``measured_peak_bytes``) and the step's temporary memory (``temporary_bytes``: that peak
    beyond the ``modelled`` one, never below 0), which the planner keeps free on every device. On
    a CPU, TensorFlow's allocator statistics leave out most tensors (a small model's step reads
    a peak of 0 bytes), so only the tensors' sizes count.

    Example:
        >>> memory_metadata("/GPU:0", 5_000, lambda: 3_000.0)["temporary_bytes"]
        2000.0
        >>> sorted(memory_metadata("/CPU:0", 5_000, lambda: 3_000.0))
        ['memory']
    """
    if device_type(device) != "GPU":
        return {"memory": "tensor sizes (TensorFlow's allocator statistics on a CPU leave out most tensors)"}
    if peak is None:
        return {"memory": "tensor sizes (TensorFlow kept no allocator statistics on this device)"}
    return {"measured_peak_bytes": peak, TEMPORARY_MEMORY: max(0.0, peak - modelled()),
            "memory": "tensor sizes; temporary_bytes: the allocator's peak over the profiled steps "
                      "(measured_peak_bytes) beyond the modelled peak, kept free on every device"}


# What a model's step raises when it refuses a batch: Keras' shape checks (ValueError), a layer's
# own reshape at trace time (ValueError, TypeError) or when it runs (InvalidArgumentError).
_REFUSALS = (ValueError, TypeError, tf.errors.InvalidArgumentError)


def _rows(batch: tuple) -> int:
    return int(tf.nest.flatten(batch)[0].shape[0])


def _first_line(error: Exception) -> str:
    """The first line of TensorFlow's or Keras' message that says something, without Keras'
    terminal colours or TensorFlow's node (Keras opens with "Exception encountered when calling
    <layer>", the cause follows)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    said = [line for line in lines if line and not line.startswith(("Exception encountered", "Arguments received", "•"))]
    return (said or [type(error).__name__])[0].split(" for '{{node ")[0][:200]


def _refusal(model, refused: int, batch: int, error: Exception) -> str:
    """The line saying a model took its batch and refused kerasflow's smaller one."""
    return (f"model {model.name!r} refuses a batch of {refused} ({_first_line(error)}); profiled at its own batch "
            f"of {batch} only, and no plan hands a device fewer rows (no data parallelism, waves or op splitting)")


def _data_error(model, batch, error) -> ProfilingError:
    shapes = [tuple(t.shape) for t in tf.nest.flatten(batch)]
    expected = [getattr(i, "shape", None) for i in getattr(model, "inputs", None) or []]
    return ProfilingError(
        f"The data does not fit model {model.name!r}: kerasflow traced its training step on a batch of "
        f"{_rows(batch)} made from the data (tensors of shapes {shapes})"
        f"{f', and the model takes inputs of shapes {expected}' if expected else ''}. "
        f"TensorFlow said: {_first_line(error)}. Pass data the model takes, as for fit.")


def graph_structure(model, batch, own_step: Callable) -> OpGraph:
    """The ``OpGraph`` of ``model``'s training step as written (``own_step``), with no costs:
    its op names and fingerprint, to check a plan made elsewhere against. The step is traced
    once at ``batch``; every variable is put back afterwards."""
    snapshot = snapshot_variables(model)
    try:
        with _compat.strategy_scope(model), _compat.overridden(model, "train_step", own_step):
            step = capture_step(model, batch)
    finally:
        restore_variables(snapshot)
    return build_graph(dataclasses.replace(step, function=None, batch_size=1), None, {}, None, "CPU")
