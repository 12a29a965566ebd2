"""Shared pytest configuration.

TensorFlow is configured once per test process, before any test runs: four logical CPUs
(the multi-device testbed) and soft placement off, so a plan's unknown device fails
loudly instead of landing on CPU:0. The planner tests never import TensorFlow themselves.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
    from kerasflow.devices import virtual_cpus

    virtual_cpus(4)
    import tensorflow as tf

    tf.config.set_soft_device_placement(False)
