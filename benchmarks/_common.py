"""Shared bits of the benchmark scripts: import path, table printing, machine line, the devices,
step timing."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The benchmarks time plans in fits of a few dozen steps, too short to train on while the planner
# runs beside them: they plan inside fit (background_planning=False) unless the variable says
# otherwise; their subprocesses inherit it.
os.environ.setdefault("KERASFLOW_BACKGROUND_PLANNING", "0")

from kerasflow.planner.sim.report import format_table  # noqa: E402,F401


def machine() -> str:
    """One line naming the machine and Python, printed above every table."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def devices(memory_mb: int) -> tuple[str, list[str]]:
    """Configures TensorFlow's devices before it starts (``gpu_check.py``'s, and ``calibration.py``'s
    where there are GPUs): the GPUs, a single one split into two logical GPUs of ``memory_mb`` MiB
    each; else two logical CPUs of one intra-op thread. Returns (kind, device names)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) == 1:
        config = tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)
        tf.config.set_logical_device_configuration(gpus[0], [config, config])
    if gpus:
        return "GPU", [f"/GPU:{i}" for i in range(len(tf.config.list_logical_devices("GPU")))]
    import kerasflow

    return "CPU", kerasflow.devices.virtual_cpus(2, intra_op_threads=1, inter_op_threads=2)


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
