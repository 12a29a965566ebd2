"""Smoke runs of the examples, as a user runs them (a fresh process each)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["quickstart.py"])
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Plan: " in result.stdout and "Ops placed where planned: all" in result.stdout
    assert (tmp_path / "kerasflow_logs" / "plan.json").exists()
