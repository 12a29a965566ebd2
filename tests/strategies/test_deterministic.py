"""Reproducible when the user asks for it: with TensorFlow's op determinism on (or
``deterministic="on"``) only plans that compute bit for bit as the default placement run, so two
runs of a script give the same weights whatever their timings choose."""

import subprocess
import sys

import keras
import numpy as np
import pytest

import kerasflow
from kerasflow.planner import DataParallel, Plan
from kerasflow.planner.errors import InvalidPlanError
from tests.profiling import models
from tests.strategies import paths

BATCH = 16


def runs_of_the_same_script(tmp_path, *arguments):
    """``tests/strategies/same_script.py`` once per argument list, side by side in processes of
    their own: what each wrote."""
    outs = [tmp_path / f"run{i}.npz" for i in range(len(arguments))]
    running = [subprocess.Popen([sys.executable, "-m", "tests.strategies.same_script", str(out), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for out, args in zip(outs, arguments)]
    for process in running:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return [np.load(out) for out in outs]


def weights(run) -> list:
    return [run[name] for name in sorted(run.files, key=lambda name: (len(name), name)) if name.startswith("arr_")]


def test_two_runs_of_a_script_with_op_determinism_give_the_same_weights_whatever_the_timings(tmp_path):
    first, second, control = runs_of_the_same_script(tmp_path, ["0"], ["1"], ["0", "--nondeterministic"])
    # The timings chose differently: the first run kept its plan to the end, the second went back
    # to the default placement; without determinism the first run's timings chose a plan that
    # sums in another order, which gives other weights.
    assert first["in_force"] and not second["in_force"] and first["ran"].size > second["ran"].size > 0
    assert not control["placement_only"], control["ran"]
    assert any(not np.array_equal(a, b) for a, b in zip(weights(control), weights(second)))
    # With it, every plan that ran computes as the default placement: the same weights, bit for bit.
    assert first["placement_only"] and second["placement_only"]
    for a, b in zip(weights(first), weights(second), strict=True):
        np.testing.assert_array_equal(a, b)
    # What was left out is named with the reason, in the report.
    assert [line.split(":")[0] for line in first["excluded"]] == ["data_parallel", "op_splitting", "waves"]
    assert all("sums in another order" in line and "deterministic" in line for line in first["excluded"])


def test_deterministic_on_asks_for_the_same_without_tensorflows_switch():
    callback = kerasflow.callbacks.FastT(**{**paths.OPTIONS, "cluster": "cpu-testbed:4"}, deterministic="on",
                                         collaborators=paths.PLANNING)
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    x, y = models.mlp_data(12 * BATCH)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    excluded = callback.report.excluded
    assert {"data_parallel", "op_splitting", "waves"} <= set(excluded), excluded
    assert callback.plan.placement_only and all("deterministic" in why for why in excluded.values())


def test_a_given_plan_that_sums_in_another_order_is_refused_when_asked_for_determinism():
    replicated = Plan(data_parallel=DataParallel(("/CPU:0", "/CPU:1")), batch_size=BATCH, algorithm="data_parallel")
    strategy = kerasflow.FastTStrategy(devices=["/CPU:0", "/CPU:1"], plan=replicated, deterministic="on", verbose=0)
    with strategy.scope():
        model = models.mlp(keras, dropout=False)
    x, y = models.mlp_data(4 * BATCH)
    with pytest.raises(InvalidPlanError, match=r"The plan given \(data_parallel\) adds sums in another order.*"
                                               r"Received: deterministic='on'$"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
