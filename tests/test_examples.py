"""Smoke runs of the examples, as a user runs them (a fresh process each).

``examples/quickstart.py`` is not here: CI runs it on the base install (``pip install -e .``,
no extras) after the suite and checks the same lines and its plan file (``.ci/run``).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# On logical CPUs the planner keeps the default placement (no plan is predicted faster on a shared
# host); a plan that measures slower than the default placement is dropped (drop_slower_plan): the
# example then says why instead of where the ops ran. Which happens depends on the machine.
PLACED_OR_DROPPED = ("Ops placed where planned: all",
                     "Plan not in force: the planner kept the default placement",
                     "Plan not in force: training went back to the default placement (the plan measured",
                     # fit ended while a runner-up was still timed: never a plan measured slower
                     "Plan not in force: training went back to the default placement (fit ended before the plan "
                     "was timed")

EXPECTED = {
    "existing_fit_callback.py": ["Plan \"", PLACED_OR_DROPPED],
    "offline_planning.py": ["Plan for 8xH100-nvlink", "applied; ops placed where planned: all"],
    "tick_tock_memory.py": ["tick_tock_model_parallel", "largest batch"],
    "tf_keras_legacy.py": ["Plan \""],
    "several_machines_on_one.py": [PLACED_OR_DROPPED, "Checkpoint written by the chief", "Workers stopped."],
}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    for text in EXPECTED[script]:
        alternatives = text if isinstance(text, tuple) else (text,)
        assert any(alternative in result.stdout for alternative in alternatives), result.stdout[-3000:]
