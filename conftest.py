"""Pytest configuration for the whole checkout (tests and every module's doctests).

TensorFlow is configured once per test process, after collection and before any test runs, and
only when a collected test needs it: four logical CPUs (the multi-device testbed) and soft
placement off, so a plan's unknown device fails loudly instead of landing on CPU:0. The planner's
tests and doctests never need it, so a run of only those (``pytest tests/planner
kerasflow/planner``) never starts TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's fits are a few steps long, and most check the plan in force at a known step: they
# plan inside fit, which waits for the planner. Planning beside training, the default, has its
# own tests (tests/strategies/test_background_planning.py), which ask for it.
os.environ.setdefault("KERASFLOW_BACKGROUND_PLANNING", "0")

_ROOT = os.path.dirname(os.path.abspath(__file__))
_WITHOUT_TENSORFLOW = (os.path.join("kerasflow", "planner"), os.path.join("tests", "planner"))


def _needs_tensorflow(item) -> bool:
    where = os.path.relpath(str(item.path), _ROOT)
    return not where.startswith(_WITHOUT_TENSORFLOW)


def pytest_collection_modifyitems(session, config, items):
    if not any(_needs_tensorflow(item) for item in items):
        return
    from kerasflow.devices import virtual_cpus

    virtual_cpus(4)
    import tensorflow as tf

    tf.config.set_soft_device_placement(False)
