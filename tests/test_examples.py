"""Smoke runs of the examples, as a user runs them (a fresh process each).

``examples/quickstart.py`` is not here: CI runs it on the base install (``pip install -e .``,
no extras) after the suite and checks the same lines and its plan file (``.ci/run``).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


EXPECTED = {
    "existing_fit_callback.py": ["Plan \"", "Ops placed where planned: all"],
    "offline_planning.py": ["Plan for 8xH100-nvlink", "applied; ops placed where planned: all"],
    "tick_tock_memory.py": ["tick_tock_model_parallel", "largest batch"],
    "tf_keras_legacy.py": ["Plan \""],
    "several_machines_on_one.py": ["Ops placed where planned: all", "Checkpoint written by the chief", "Workers stopped."],
}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    for text in EXPECTED[script]:
        assert text in result.stdout, result.stdout[-3000:]
