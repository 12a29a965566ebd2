"""A soak loop: many fits through both doors in one process, then a long planned fit, and what they leave behind.

``soak`` runs ``fits`` consecutive ``fit`` calls (each after ``keras.backend.clear_session()``;
an MLP, a BatchNormalization CNN and a GRU in turn; 1024 samples, batch 32,
``validation_split=0.1``, then ``evaluate``), then ``epochs`` epochs of one MLP. With kerasflow
the fits alternate the two doors (``FastTStrategy`` and the ``FastT`` callback) in the default
configuration, except that every sixth fit (from the second) has its plan forced slower than the
default placement (dropped) and every sixth (from the third) a planner that fails (a fallback),
and the long fit's plan is forced faster (kept in force for all its epochs); without, every fit
is plain Keras'. The verdicts are forced through ``kerasflow.strategies.Collaborators``; every
step still runs. It returns ``Leftovers``: resident memory after each fit and epoch, threads
still running, models not freed, whether a profiler session can still start, and what is left in
the loop's own temporary directory. ``benchmarks/soak.py`` compares two such loops, plain Keras'
and kerasflow's, each in a process of its own; ``tests/test_soak.py`` runs a short one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
import tempfile
import threading
import warnings
import weakref

__all__ = ["Leftovers", "soak", "schedule", "fit_once", "build", "collaborators", "rss_mb", "SAMPLES", "BATCH"]

SAMPLES, BATCH = 1024, 32


@dataclasses.dataclass
class Leftovers:
    """What one soak loop measured and left behind.

    Attributes:
        rss_mb: resident memory after each fit, then after each epoch of the long fit.
        fits: how many of ``rss_mb`` are fits (the rest are the long fit's epochs).
        threads_left: names of threads started during the loop and still running after it.
        models_alive: the fits (kind, door, forced verdict) whose model is still reachable after the
            loop (each was let go).
        profiler: "free" when a profiler session starts and stops after the loop, else the error.
        temp_left: entries left in the loop's own temporary directory (``tempfile`` points there
            during the loop).
        warned: kerasflow's warnings, one line each.
    """

    rss_mb: list
    fits: int
    threads_left: list
    models_alive: list
    profiler: str
    temp_left: list
    warned: list


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux: ``/proc/self/statm``).

    Example:
        >>> rss_mb() > 1.0
        True
    """
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _layers(kind: str) -> list:
    from keras import layers

    return {
        "mlp": [layers.Input((20,)), layers.Dense(64, activation="relu"), layers.Dense(64, activation="relu")],
        "bn_cnn": [layers.Input((16, 16, 3)), layers.Conv2D(8, 3), layers.BatchNormalization(), layers.ReLU(),
                   layers.GlobalAveragePooling2D()],
        "gru": [layers.Input((12, 8)), layers.GRU(16)],
    }[kind]


def build(kind: str):
    """A compiled model of ``kind`` ("mlp", "bn_cnn" or "gru") and its data (x, y).

    Example:
        >>> model, (x, y) = build("gru")
        >>> x.shape, y.shape, model.output_shape
        ((1024, 12, 8), (1024,), (None, 10))
    """
    import keras
    import numpy as np

    model = keras.Sequential(_layers(kind) + [keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    shape = model.input_shape[1:]
    x = np.random.default_rng(0).standard_normal((SAMPLES, *shape)).astype("float32")
    return model, (x, np.random.default_rng(1).integers(0, 10, SAMPLES))


def collaborators(forced: str | None):
    """The driver's collaborators for a fit whose verdict is forced: "slower" (the plan is dropped),
    "faster" (kept), "failing" (the planner raises: a fallback), None (kerasflow's own)."""
    from kerasflow.planner import ranked_plans
    from kerasflow.planner.search.planning import PLANNED_CANDIDATES
    from kerasflow.strategies.collaborators import Collaborators, stopwatch

    def timed(seconds_of_plan):
        def watch(step, plan):
            outputs, seconds = stopwatch(step, plan)
            return outputs, seconds if plan is None else seconds_of_plan
        return watch

    def failing_planner(request):
        raise RuntimeError("a planner failure forced by the soak")

    def best_plan(request):  # the logical CPUs as devices of their own: a plan, not the default
        return ranked_plans(dataclasses.replace(request, cluster=request.cluster.independent(),
                                                candidates=PLANNED_CANDIDATES))[:1]

    if forced == "slower":  # the best plan alone, a second a step: dropped within one epoch
        return Collaborators(planner=best_plan, stopwatch=timed(1.0))
    if forced == "faster":
        return Collaborators(planner=best_plan, stopwatch=timed(1e-6))
    if forced == "failing":
        return Collaborators(planner=failing_planner)
    return Collaborators()


def fit_once(kind: str, door: str | None, forced: str | None = None, epochs: int = 1, callbacks=()):
    """One fit (and evaluate) of a new ``kind`` model through ``door`` ("strategy", "callback" or
    None: plain Keras); returns a weak reference to the model."""
    import keras

    import kerasflow

    keras.backend.clear_session()
    options = dict(verbose=0, collaborators=collaborators(forced))
    callbacks = list(callbacks)
    if door == "strategy":
        with kerasflow.FastTStrategy(**options).scope():
            model, (x, y) = build(kind)
    else:
        model, (x, y) = build(kind)
        if door == "callback":
            callbacks.append(kerasflow.callbacks.FastT(**options))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, validation_split=0.1, verbose=0, callbacks=callbacks)
    model.evaluate(x, y, batch_size=BATCH, verbose=0)
    return weakref.ref(model)


def schedule(fits: int, with_kerasflow: bool) -> list:
    """(model kind, door, forced verdict) of each fit of the loop.

    Example:
        >>> schedule(3, with_kerasflow=True)
        [('mlp', 'strategy', None), ('bn_cnn', 'callback', 'slower'), ('gru', 'strategy', 'failing')]
    """
    kinds = ("mlp", "bn_cnn", "gru")
    plan = []
    for index in range(fits):
        door = ("strategy", "callback")[index % 2] if with_kerasflow else None
        forced = {1: "slower", 2: "failing"}.get(index % 6) if with_kerasflow else None
        plan.append((kinds[index % 3], door, forced))
    return plan


@contextlib.contextmanager
def own_temporary_directory():
    """Points ``tempfile`` at a new directory for the block, and yields it: whatever kerasflow
    makes there is the loop's own, while other processes (parallel test workers) use the system's."""
    shared, tempfile.tempdir = tempfile.tempdir, tempfile.mkdtemp(prefix="kerasflow_soak_")
    try:
        yield tempfile.tempdir
    finally:
        own, tempfile.tempdir = tempfile.tempdir, shared
        shutil.rmtree(own, ignore_errors=True)


def soak(fits: int, epochs: int, with_kerasflow: bool) -> Leftovers:
    """Runs the loop in this process (TensorFlow configured with several devices) and returns what it left."""
    import keras
    import tensorflow as tf

    threads_before = set(threading.enumerate())
    memory, models = [], []

    class EpochMemory(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            memory.append(rss_mb())

    with warnings.catch_warnings(record=True) as caught, own_temporary_directory() as temp:
        warnings.simplefilter("always")
        for fit in schedule(fits, with_kerasflow):
            models.append((fit, fit_once(*fit)))
            gc.collect()
            memory.append(rss_mb())
        long_door = "strategy" if with_kerasflow else None
        long_fit = ("mlp", long_door, "faster" if with_kerasflow else None)
        models.append((long_fit, fit_once(*long_fit, epochs, [EpochMemory()])))
        temp_left = sorted(os.listdir(temp))
    warned = [str(w.message).splitlines()[0] for w in caught if str(w.message).startswith("kerasflow:")]
    keras.backend.clear_session()
    gc.collect()
    profiler = "free"
    try:
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            tf.profiler.experimental.stop()
    except Exception as error:  # noqa: BLE001 - reported, not raised: it is what is measured
        profiler = f"{type(error).__name__}: {error}"
    return Leftovers(
        rss_mb=memory, fits=fits,
        threads_left=sorted(t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()),
        models_alive=["/".join(map(str, fit)) for fit, ref in models if ref() is not None], profiler=profiler,
        temp_left=temp_left, warned=warned)
