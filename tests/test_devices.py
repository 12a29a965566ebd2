"""Device helpers: waiting for work a device runs after the host has moved on."""

import time

import tensorflow as tf

from kerasflow.devices import wait_for_devices
from kerasflow.strategies.collaborators import stopwatch


def test_a_step_ends_when_the_work_queued_for_the_devices_is_done():
    # Asynchronous execution queues each op and returns at once, as a GPU's stream runs a step's
    # kernels after the train function returned: the stopwatch and the profiler's step mark
    # end after the queued work, not when the host returns.
    finished = []

    def slow_op():
        time.sleep(0.3)
        finished.append("done")

    tf.config.experimental.set_synchronous_execution(False)
    try:
        tf.py_function(slow_op, [], [])
        assert finished == []  # the host moved on
        wait_for_devices()
        assert finished == ["done"]
        # A step whose outputs the stopwatch cannot wait for (none): it waits for the devices.
        _, seconds = stopwatch(lambda: tf.py_function(slow_op, [], []), plan=None)
        assert finished == ["done", "done"] and seconds >= 0.3
    finally:
        tf.config.experimental.set_synchronous_execution(True)
