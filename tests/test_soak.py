"""Consecutive fits through both doors leave nothing behind: no thread, no model, no profiler session, no file.

The short version of ``benchmarks/soak.py`` (which also compares resident memory with plain Keras
over 30 fits and 50 epochs), on the same loop (``kerasflow.testing.soak``): three fits through
both doors, one with its plan forced slower (dropped) and one with a planner that fails (a
fallback), then a planned fit of two epochs.
"""

import gc

import pytest

from kerasflow.testing import soak


def test_the_schedule_takes_every_path_through_both_doors():
    fits = soak.schedule(3, with_kerasflow=True)
    assert {door for _, door, _ in fits} == {"strategy", "callback"}
    assert {forced for _, _, forced in fits} == {None, "slower", "failing"}
    assert {kind for kind, _, _ in fits} == {"mlp", "bn_cnn", "gru"}
    assert {door for _, door, forced in soak.schedule(4, with_kerasflow=False)} == {None}


@pytest.mark.slow  # forty seconds on two cores
def test_three_fits_and_a_planned_one_leave_nothing_behind():
    left = soak.soak(fits=3, epochs=2, with_kerasflow=True)
    assert left.threads_left == []
    assert left.models_alive == []
    assert left.profiler == "free"
    assert left.temp_left == []
    assert len(left.rss_mb) == 3 + 2
    # The forced paths were taken: one plan dropped, one planner failure fell back.
    assert any("slower than the default placement" in line for line in left.warned), left.warned
    assert any("a planner failure forced by the soak" in line for line in left.warned), left.warned


def custom_gradients() -> int:
    from kerasflow import _compat

    return len(_compat.registered_custom_gradients())


@pytest.fixture(scope="module")
def registered_by_plain_keras():
    before = custom_gradients()
    soak.fit_once("gru", None)
    return custom_gradients() - before


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_gru_trained_under_a_plan_is_freed_with_its_graphs(door, registered_by_plain_keras):
    # Its traces register tf.custom_gradient functions, and TensorFlow's gradient registry keeps
    # each (with the graph it was traced in) for the life of the process: nothing there may hold
    # the model, and kerasflow's own traces (the profile's, the plan's, the timed default steps')
    # may leave no more there than plain Keras' fit does.
    before = custom_gradients()
    model = soak.fit_once("gru", door, forced="faster")
    gc.collect()  # a Keras model is a web of cycles: only the collector frees it
    assert model() is None
    assert custom_gradients() - before <= registered_by_plain_keras
