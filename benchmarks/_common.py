"""Shared bits of the benchmark scripts: import path, table printing, machine line, step timing."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kerasflow.planner.report import format_table  # noqa: E402,F401


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
