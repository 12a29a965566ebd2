"""Shared bits of the benchmark scripts: import path, table printing, machine line, step timing,
the first step's fused kernels."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kerasflow.planner.sim.report import format_table  # noqa: E402,F401


def machine() -> str:
    """One line naming the machine and Python, printed above every table."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def step_durations(model, x, y, batch_size: int, callbacks=()):
    """Trains ``model`` one epoch on ``(x, y)`` (with ``callbacks``) and returns each step's wall time in seconds."""
    import time

    import keras
    import numpy as np

    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            ends.append(time.perf_counter())

    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[*callbacks, Clock()])
    return np.diff([started] + ends)


def first_step_recorder():
    """A Keras callback that keeps the partition graphs of ``fit``'s first step in its
    ``partition_graphs`` (TensorFlow records a function's when it instantiates it, which that
    step does): ``readback.fused_kernel_count`` counts the fused kernels plain Keras' step runs."""
    import keras

    from kerasflow.strategies.readback import start_recording, stop_recording

    class FirstStep(keras.callbacks.Callback):
        partition_graphs = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                start_recording()

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.partition_graphs = stop_recording()

    return FirstStep()
