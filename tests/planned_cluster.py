"""The cluster the suites that hold ``fit`` to plain Keras plan for, one home for both.

By default, none: each door plans for the logical CPUs it runs on, a shared pool where the
planner splits no layer. ``KERASFLOW_TEST_CLUSTER`` names a cluster preset to plan for instead,
so the same suites run on plans made for independent devices (``cpu-testbed:4``: splitting is on
under ``split="auto"``, and every plan still runs on this machine's logical CPUs):

    KERASFLOW_TEST_CLUSTER=cpu-testbed:4 python -m pytest -q -n 2 tests/compat tests/strategies/test_every_path.py
"""

import os

__all__ = ["CLUSTER_OPTION"]

# The doors' keyword for it: empty when the variable is unset.
CLUSTER_OPTION = {"cluster": os.environ["KERASFLOW_TEST_CLUSTER"]} if os.environ.get("KERASFLOW_TEST_CLUSTER") else {}
